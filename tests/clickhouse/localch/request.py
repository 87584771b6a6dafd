"""Where a query comes from, as a ClickHouse server reads it over HTTP.

The query is the `query` URL parameter, the request body, or both joined by a newline; with a
multipart form body, it and its `param_*` values are form fields. INSERT data is split from its
statement here, so that the engine gets the statement as text and the data as bytes (binary
formats such as RowBinary and Native included).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from email import policy
from email.parser import BytesParser

from .errors import ErrorCodes

# An INSERT statement that ends with its FORMAT clause; its data comes separately.
_INSERT_FORMAT = re.compile(
    r"^\s*INSERT\b.*?\bFORMAT\s+([A-Za-z0-9_]+)\s*$", re.IGNORECASE | re.DOTALL
)
# A body that starts with a one-line INSERT ... FORMAT <name> and carries the data after it.
_INSERT_FORMAT_LINE = re.compile(
    rb"^\s*INSERT\b[^\n]*?\bFORMAT\s+([A-Za-z0-9_]+)[ \t]*\r?\n", re.IGNORECASE
)
_FORMAT_CLAUSE = re.compile(r"\bFORMAT\s+[A-Za-z0-9_]+\s*$", re.IGNORECASE)
_INSERT = re.compile(r"^\s*INSERT\b", re.IGNORECASE)


@dataclass
class Query:
    """A query to run: text, or an INSERT statement with its data as bytes."""

    sql: str  # the whole statement as text (what the multi-statement check reads)
    insert_statement: str | None = None  # INSERT without its FORMAT clause, when data is apart
    insert_format: str | None = None
    data: bytes = b""

    @property
    def is_insert(self) -> bool:
        return _INSERT.match(self.sql) is not None


def _split(statement: str, fmt: str, data: bytes) -> Query:
    bare = _FORMAT_CLAUSE.sub("", statement.rstrip()).rstrip()
    return Query(sql=f"{bare} FORMAT {fmt}", insert_statement=bare, insert_format=fmt, data=data)


def assemble(url_query: str | None, body: bytes, codes: ErrorCodes) -> Query:
    """The query of a request from its `query` parameter and its (decoded) body."""
    if url_query and body:
        insert = _INSERT_FORMAT.match(url_query)
        if insert:
            return _split(url_query, insert.group(1), body)
    if not url_query:
        line = _INSERT_FORMAT_LINE.match(body)
        if line:
            statement = body[: line.end()].decode("utf-8", errors="strict").strip()
            return _split(statement, line.group(1).decode(), body[line.end() :])
    parts = [url_query] if url_query else []
    if body:
        try:
            parts.append(body.decode("utf-8"))
        except UnicodeDecodeError:
            # chDB takes query text as str; binary data is taken only after INSERT ... FORMAT.
            raise codes.error(
                "NOT_IMPLEMENTED",
                "The local server accepts binary request bodies only as INSERT data "
                "(INSERT ... FORMAT <name> in the query parameter or on the body's first line)",
            ) from None
    return Query(sql="\n".join(parts))


def form_fields(content_type: str, body: bytes, codes: ErrorCodes) -> list[tuple[str, str]]:
    """The fields of a multipart/form-data body (the query and its parameters)."""
    message = BytesParser(policy=policy.HTTP).parsebytes(
        b"Content-Type: " + content_type.encode("latin-1") + b"\r\n\r\n" + body
    )
    if not message.is_multipart():
        raise codes.error("BAD_ARGUMENTS", "Malformed multipart/form-data body")
    fields = []
    for part in message.iter_parts():
        name = part.get_param("name", header="content-disposition")
        if not name:
            raise codes.error("BAD_ARGUMENTS", "A multipart/form-data field has no name")
        if part.get_filename() is not None:
            raise codes.error(
                "NOT_IMPLEMENTED",
                "External data (files in a multipart form) is not supported by the local server",
            )
        payload = part.get_payload(decode=True) or b""
        try:
            fields.append((str(name), payload.decode("utf-8")))
        except UnicodeDecodeError:
            raise codes.error("BAD_ARGUMENTS", f"Form field {name!r} is not UTF-8") from None
    return fields
