"""Errors in ClickHouse's shape: a code, a name and a message, answered with ClickHouse's status."""

from __future__ import annotations

import re

# HTTP status per error name, as in ClickHouse's src/Server/HTTP/exceptionCodeToHTTPStatus.cpp.
# Names, not numbers: the numbers come from the engine itself (errorCodeToName).
STATUS_BY_ERROR_NAME = {
    "REQUIRED_PASSWORD": 401,
    **dict.fromkeys(
        [
            "UNKNOWN_USER",
            "WRONG_PASSWORD",
            "AUTHENTICATION_FAILED",
            "SET_NON_GRANTED_ROLE",
            "ACCESS_DENIED",
        ],
        403,
    ),
    **dict.fromkeys(
        [
            "BAD_ARGUMENTS",
            "CANNOT_COMPILE_REGEXP",
            "CANNOT_PARSE_TEXT",
            "CANNOT_PARSE_ESCAPE_SEQUENCE",
            "CANNOT_PARSE_QUOTED_STRING",
            "CANNOT_PARSE_DATE",
            "CANNOT_PARSE_DATETIME",
            "CANNOT_PARSE_NUMBER",
            "CANNOT_PARSE_DOMAIN_VALUE_FROM_STRING",
            "CANNOT_PARSE_IPV4",
            "CANNOT_PARSE_IPV6",
            "CANNOT_PARSE_INPUT_ASSERTION_FAILED",
            "CANNOT_PARSE_UUID",
            "DUPLICATE_COLUMN",
            "ILLEGAL_COLUMN",
            "UNKNOWN_ELEMENT_IN_AST",
            "UNKNOWN_TYPE_OF_AST_NODE",
            "THERE_IS_NO_COLUMN",
            "TOO_DEEP_AST",
            "TOO_BIG_AST",
            "UNEXPECTED_AST_STRUCTURE",
            "SYNTAX_ERROR",
            "INCORRECT_DATA",
            "TYPE_MISMATCH",
            "VALUE_IS_OUT_OF_RANGE_OF_DATA_TYPE",
        ],
        400,
    ),
    **dict.fromkeys(
        [
            "UNKNOWN_TABLE",
            "UNKNOWN_FUNCTION",
            "UNKNOWN_IDENTIFIER",
            "UNKNOWN_TYPE",
            "UNKNOWN_STORAGE",
            "UNKNOWN_DATABASE",
            "UNKNOWN_SETTING",
            "UNKNOWN_DIRECTION_OF_SORTING",
            "UNKNOWN_AGGREGATE_FUNCTION",
            "UNKNOWN_FORMAT",
            "UNKNOWN_DATABASE_ENGINE",
            "UNKNOWN_TYPE_OF_QUERY",
            "UNKNOWN_ROLE",
        ],
        404,
    ),
    "QUERY_IS_TOO_LARGE": 413,
    "NOT_IMPLEMENTED": 501,
    "SOCKET_TIMEOUT": 503,
    "CANNOT_OPEN_FILE": 503,
    "HTTP_LENGTH_REQUIRED": 411,
    "TIMEOUT_EXCEEDED": 408,
    "CANNOT_SCHEDULE_TASK": 503,
    "UNSUPPORTED_MEDIA_TYPE": 415,
}

# "Code: 60. DB::Exception: <message>. (UNKNOWN_TABLE) (version 26.9.2.1)"; chDB sometimes nests
# the same prefix several times and sometimes leaves the version out.
_CODE_PREFIX = re.compile(r"^(?:Code: (\d+)\. DB::Exception: )+")
_INNER_PREFIX = re.compile(r"Code: \d+\. DB::Exception: ")
_NAME_SUFFIX = re.compile(r"(?:\s*\(([A-Z0-9_]+)\)(?: \(version [^)]*\))?\.?)+\s*$")


class ClickHouseError(Exception):
    """An error to answer in ClickHouse's shape: code, name, message."""

    def __init__(self, code: int, name: str, message: str):
        super().__init__(message)
        self.code = code
        self.name = name
        self.message = message

    @property
    def status(self) -> int:
        return STATUS_BY_ERROR_NAME.get(self.name, 500)

    def body(self, version: str) -> bytes:
        message = self.message if self.message.endswith(".") else self.message + "."
        return f"Code: {self.code}. DB::Exception: {message} ({self.name}) (version {version})\n".encode()


class ErrorCodes:
    """ClickHouse's error codes, read from the engine (so they are the engine's own)."""

    def __init__(self, code_by_name: dict[str, int]):
        self._code_by_name = code_by_name
        self._name_by_code = {code: name for name, code in code_by_name.items()}

    def code(self, name: str) -> int:
        return self._code_by_name[name]

    def error(self, name: str, message: str) -> ClickHouseError:
        return ClickHouseError(self.code(name), name, message)

    def from_text(self, text: str) -> ClickHouseError:
        """An error from the text chDB raises, which is ClickHouse's own error text."""
        text = text.strip()
        prefix = _CODE_PREFIX.match(text)
        code = int(prefix.group(1)) if prefix else 1001
        body = text[prefix.end() :] if prefix else text
        # chDB nests "Code: N. DB::Exception:" inside messages; keep the innermost text once.
        body = _CODE_PREFIX.sub("", body)
        while inner := _INNER_PREFIX.search(body):
            body = body[inner.end() :]
        suffix = _NAME_SUFFIX.search(body)
        if suffix:
            body = body[: suffix.start()]
        body = body.rstrip()
        if not body.endswith("."):
            body += "."
        return ClickHouseError(code, self._name_by_code.get(code, "STD_EXCEPTION"), body)
