"""Conformance of a ClickHouse HTTP endpoint with what this project relies on.

Run against the local server by default; set CLICKHOUSE_URL to run against another ClickHouse.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import uuid

import pytest

from conftest import HERE, Server

ERROR_BODY = re.compile(
    r"^Code: (\d+)\. DB::Exception: .+\. \(([A-Z_0-9]+)\) \(version [^)]+\)\n?$", re.S
)


def assert_error(resp, code: int, status: int, name: str) -> None:
    assert resp.status == status, resp.text
    assert resp.header("X-ClickHouse-Exception-Code") == str(code)
    match = ERROR_BODY.match(resp.text)
    assert match, resp.text
    assert match.group(1) == str(code)
    assert match.group(2) == name


# -- endpoints -------------------------------------------------------------------------------


@pytest.mark.parametrize("path", ["/", "/ping"])
def test_ping(server: Server, path: str):
    resp = server.request("GET", path, auth=False)
    assert resp.status == 200
    assert resp.body == b"Ok.\n"


def test_head_ping(server: Server):
    resp = server.request("HEAD", "/ping", auth=False)
    assert resp.status == 200
    assert resp.body == b""


# -- where the query comes from --------------------------------------------------------------


def test_query_from_url_parameter_with_get(server: Server):
    resp = server.request("GET", params={"query": "SELECT 40 + 2"})
    assert resp.status == 200
    assert resp.text == "42\n"


def test_query_from_body(server: Server):
    assert server.ok("SELECT 'body'") == "body\n"


def test_query_from_url_and_body_joined_by_newline(server: Server, database: str):
    server.ok(f"CREATE TABLE {database}.t (a UInt32, s String) ENGINE = MergeTree ORDER BY a")
    resp = server.request(
        params={"query": f"INSERT INTO {database}.t FORMAT TabSeparated"},
        body="1\tone;x\n2\ttwo\n",
    )
    assert resp.status == 200, resp.text
    assert server.ok(f"SELECT a, s FROM {database}.t ORDER BY a") == "1\tone;x\n2\ttwo\n"


def test_get_is_read_only(server: Server, database: str):
    server.ok(f"CREATE TABLE {database}.t (a UInt32) ENGINE = MergeTree ORDER BY a")
    resp = server.request("GET", params={"query": f"INSERT INTO {database}.t VALUES (1)"})
    assert_error(resp, 164, 500, "READONLY")
    resp = server.request("GET", params={"query": f"DROP TABLE {database}.t"})
    assert_error(resp, 164, 500, "READONLY")
    assert server.ok(f"SELECT count() FROM {database}.t") == "0\n"


def test_readonly_setting_refuses_writes_on_post(server: Server, database: str):
    server.ok(f"CREATE TABLE {database}.t (a UInt32) ENGINE = MergeTree ORDER BY a")
    resp = server.request(body=f"INSERT INTO {database}.t VALUES (1)", params={"readonly": "1"})
    assert_error(resp, 164, 500, "READONLY")
    assert server.ok(f"SELECT count() FROM {database}.t") == "0\n"


def test_empty_query_is_an_error(server: Server):
    resp = server.request("POST", body="")
    assert resp.status == 400
    assert resp.header("X-ClickHouse-Exception-Code") == "62"


# -- database, format, query id --------------------------------------------------------------


def test_database_parameter(server: Server, database: str):
    assert server.ok("SELECT currentDatabase()", database=database) == f"{database}\n"
    assert server.ok("SELECT currentDatabase()") == "default\n"


def test_unknown_database(server: Server):
    resp = server.query("SELECT 1", database="no_such_db_" + uuid.uuid4().hex[:8])
    assert_error(resp, 81, 404, "UNKNOWN_DATABASE")


def test_default_format(server: Server):
    resp = server.query("SELECT 1 AS x, 'a' AS y", default_format="JSONEachRow")
    assert resp.status == 200
    assert json.loads(resp.text) == {"x": 1, "y": "a"}
    assert resp.header("X-ClickHouse-Format") == "JSONEachRow"


def test_format_defaults_to_tab_separated(server: Server):
    resp = server.query("SELECT 1, 'a\tb'")
    assert resp.text == "1\ta\\tb\n"
    assert resp.header("X-ClickHouse-Format") == "TabSeparated"


def test_query_id_is_echoed(server: Server):
    qid = str(uuid.uuid4())
    resp = server.query("SELECT 1", query_id=qid)
    assert resp.header("X-ClickHouse-Query-Id") == qid


def test_non_setting_parameters_are_accepted(server: Server):
    resp = server.query(
        "SELECT 1",
        wait_end_of_query="1",
        session_timeout="60",
        buffer_size="1000",
        compress="0",
        stacktrace="0",
        client_protocol_version="54460",
    )
    assert resp.status == 200, resp.text


# -- query parameters ------------------------------------------------------------------------


def tsv_escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\t", "\\t").replace("\n", "\\n")


@pytest.mark.parametrize(
    "value",
    [
        "plain",
        "tab\there",
        "new\nline",
        "back\\slash",
        'it\'s "quoted"',
        "ünïcødé ✓ 雪",
        "",
        "\\N",
        "%_*?[]",
    ],
)
def test_query_parameters_round_trip(server: Server, value: str):
    resp = server.query("SELECT {v:String} AS v FORMAT JSONEachRow", param_v=tsv_escape(value))
    assert resp.status == 200, resp.text
    assert json.loads(resp.text) == {"v": value}


def test_query_parameter_typed(server: Server):
    assert server.ok("SELECT {n:UInt64} + 1", param_n="41") == "42\n"
    resp = server.query("SELECT {n:UInt64}", param_n="not a number")
    assert resp.status == 500
    assert resp.header("X-ClickHouse-Exception-Code") == "457"


def test_raw_tab_in_parameter_is_refused(server: Server):
    resp = server.query("SELECT {v:String}", param_v="a\tb")
    assert resp.header("X-ClickHouse-Exception-Code") == "457"


# -- settings --------------------------------------------------------------------------------


def test_setting_applies_to_its_query(server: Server):
    assert server.ok("SELECT getSetting('max_threads')", max_threads="3") == "3\n"


def test_setting_applies_to_one_query_only(server: Server):
    default = server.ok("SELECT getSetting('max_threads')")
    assert server.ok("SELECT getSetting('max_threads')", max_threads="1") == "1\n"
    assert server.ok("SELECT getSetting('max_threads')") == default


def test_set_query_does_not_leak(server: Server):
    before = server.ok("SELECT getSetting('max_block_size')")
    assert server.ok("SET max_block_size = 1234") == ""
    assert server.ok("SELECT getSetting('max_block_size')") == before


def test_unknown_setting(server: Server):
    resp = server.query("SELECT 1", no_such_setting_xyz="1")
    assert_error(resp, 115, 404, "UNKNOWN_SETTING")


# -- authentication --------------------------------------------------------------------------


def test_auth_by_headers(server: Server):
    resp = server.request(body="SELECT 'in'", auth=False, headers=server.auth_headers())
    assert resp.status == 200
    assert resp.text == "in\n"


def test_auth_by_basic(server: Server):
    resp = server.request(
        body="SELECT 1", auth=False, headers=server.basic(server.user, server.password)
    )
    assert resp.status == 200, resp.text


def test_auth_by_url_parameters(server: Server):
    resp = server.request(
        body="SELECT 1", auth=False, params={"user": server.user, "password": server.password}
    )
    assert resp.status == 200, resp.text


def test_wrong_password(server: Server):
    wrong = "wrong-" + uuid.uuid4().hex
    resp = server.request(
        body="SELECT 1",
        auth=False,
        headers={"X-ClickHouse-User": server.user, "X-ClickHouse-Key": wrong},
    )
    assert_error(resp, 516, 403, "AUTHENTICATION_FAILED")
    assert wrong not in resp.text
    resp = server.request(body="SELECT 1", auth=False, headers=server.basic(server.user, wrong))
    assert_error(resp, 516, 403, "AUTHENTICATION_FAILED")


def test_unknown_user(server: Server):
    resp = server.request(
        body="SELECT 1",
        auth=False,
        headers={"X-ClickHouse-User": "nobody_" + uuid.uuid4().hex[:6], "X-ClickHouse-Key": ""},
    )
    assert resp.status == 403
    assert resp.header("X-ClickHouse-Exception-Code") in ("516", "192")


def test_mixing_auth_methods_is_refused(server: Server):
    resp = server.request(
        body="SELECT 1",
        auth=False,
        headers={**server.auth_headers(), **server.basic(server.user, server.password)},
    )
    assert_error(resp, 516, 403, "AUTHENTICATION_FAILED")


# -- errors ----------------------------------------------------------------------------------


def test_syntax_error(server: Server):
    assert_error(server.query("SELEC 1"), 62, 400, "SYNTAX_ERROR")


def test_unknown_table(server: Server, database: str):
    assert_error(server.query(f"SELECT * FROM {database}.nope"), 60, 404, "UNKNOWN_TABLE")


def test_unknown_function(server: Server):
    assert_error(server.query("SELECT no_such_function_xyz(1)"), 46, 404, "UNKNOWN_FUNCTION")


def test_other_errors_are_500(server: Server):
    resp = server.query("SELECT throwIf(1)")
    assert resp.status == 500
    assert resp.header("X-ClickHouse-Exception-Code") == "395"


def test_multi_statement_refused(server: Server, database: str):
    server.ok(f"CREATE TABLE {database}.t (a UInt32) ENGINE = MergeTree ORDER BY a")
    resp = server.query(f"INSERT INTO {database}.t VALUES (1); INSERT INTO {database}.t VALUES (2)")
    assert_error(resp, 62, 400, "SYNTAX_ERROR")
    assert "Multi-statements are not allowed" in resp.text
    assert server.ok(f"SELECT count() FROM {database}.t") == "0\n"


def test_trailing_semicolon_and_semicolons_in_data_are_fine(server: Server, database: str):
    assert server.ok("SELECT 'a;b';") == "a;b\n"
    server.ok(f"CREATE TABLE {database}.t (s String) ENGINE = MergeTree ORDER BY s")
    resp = server.request(
        params={"query": f"INSERT INTO {database}.t FORMAT TabSeparated"}, body="x;y\n"
    )
    assert resp.status == 200, resp.text
    assert server.ok(f"SELECT s FROM {database}.t") == "x;y\n"


@pytest.mark.parametrize("through_view", [False, True])
def test_an_insert_that_fails_as_it_finishes_is_an_error(
    server: Server, database: str, through_view: bool
):
    # A CHECK constraint is checked as the insert's block is written (chDB's streaming insert
    # once reported such an insert as written); through a view, the view's part fails.
    server.ok(
        f"CREATE TABLE {database}.t (s String, CONSTRAINT c CHECK s != 'bad') "
        "ENGINE = MergeTree ORDER BY s"
    )
    target = "t"
    if through_view:
        server.ok(f"CREATE TABLE {database}.src (s String) ENGINE = MergeTree ORDER BY s")
        server.ok(
            f"CREATE MATERIALIZED VIEW {database}.v TO {database}.t AS SELECT s FROM {database}.src"
        )
        target = "src"
    for fmt, body in [("JSONEachRow", '{"s":"bad"}\n'), ("TabSeparated", "bad\n")]:
        resp = server.request(
            params={"query": f"INSERT INTO {database}.{target} FORMAT {fmt}"}, body=body
        )
        assert_error(resp, 469, 500, "VIOLATED_CONSTRAINT")
    assert server.ok(f"SELECT count() FROM {database}.t") == "0\n"


# -- success headers and summary -------------------------------------------------------------


def test_success_headers(server: Server):
    resp = server.query("SELECT number FROM system.numbers LIMIT 5")
    assert resp.status == 200
    for name in [
        "X-ClickHouse-Query-Id",
        "X-ClickHouse-Format",
        "X-ClickHouse-Timezone",
        "X-ClickHouse-Server-Display-Name",
        "X-ClickHouse-Summary",
    ]:
        assert resp.header(name), name
    summary = json.loads(resp.header("X-ClickHouse-Summary"))
    assert all(isinstance(v, str) and v.isdigit() for v in summary.values()), summary
    assert {"read_rows", "read_bytes", "written_rows", "written_bytes", "elapsed_ns"} <= set(
        summary
    )
    assert resp.header("Content-Length") == str(len(resp.body))


def test_summary_counts_written_rows(server: Server, database: str):
    server.ok(f"CREATE TABLE {database}.t (a UInt32) ENGINE = MergeTree ORDER BY a")
    resp = server.query(f"INSERT INTO {database}.t VALUES (1), (2), (3)")
    assert json.loads(resp.header("X-ClickHouse-Summary"))["written_rows"] == "3"
    resp = server.query(
        f"INSERT INTO {database}.t SELECT number FROM numbers(100) WHERE number % 10 = 0"
    )
    assert json.loads(resp.header("X-ClickHouse-Summary"))["written_rows"] == "10"
    resp = server.query(f"INSERT INTO {database}.t SETTINGS async_insert = 0 VALUES (7), (8)")
    assert json.loads(resp.header("X-ClickHouse-Summary"))["written_rows"] == "2"
    resp = server.query(f"SELECT count() FROM {database}.t")
    assert json.loads(resp.header("X-ClickHouse-Summary"))["written_rows"] == "0"
    assert resp.text == "15\n"


# -- connections -----------------------------------------------------------------------------


def test_keep_alive_reuses_the_connection(server: Server):
    conn = server.connect()
    try:
        first = server.request(body="SELECT 1", conn=conn)
        local = conn.sock.getsockname()
        second = server.request(body="SELECT 2", conn=conn)
        third = server.request("GET", params={"query": "SELECT 3"}, conn=conn)
        assert (first.text, second.text, third.text) == ("1\n", "2\n", "3\n")
        assert conn.sock is not None and conn.sock.getsockname() == local
        # an error answer keeps the connection too
        assert server.request(body="SELEC 1", conn=conn).status == 400
        assert server.request(body="SELECT 4", conn=conn).text == "4\n"
        assert conn.sock.getsockname() == local
    finally:
        conn.close()


# -- the local server itself -----------------------------------------------------------------


def test_private_server_checks_password_and_never_logs_it(private_server):
    srv = private_server.server
    assert srv.ok("SELECT 1") == "1\n"
    assert srv.ok("SELECT name FROM system.databases WHERE name = 'meltano'") == "meltano\n"
    assert (
        srv.request(
            body="SELECT 1", auth=False, params={"user": "alice", "password": srv.password}
        ).status
        == 200
    )
    resp = srv.request(
        body="SELECT 1",
        auth=False,
        headers={"X-ClickHouse-User": "alice", "X-ClickHouse-Key": "nope"},
    )
    assert resp.status == 403
    resp = srv.request(body="SELECT 1", auth=False)  # user default, empty password
    assert resp.status == 403
    log = private_server.log()
    assert "POST / 200" in log  # it does log requests...
    assert srv.password not in log  # ...but never the password, even when sent in the URL


def test_server_refuses_non_loopback_address():
    proc = subprocess.run(
        [sys.executable, str(HERE / "server.py"), "--host", "0.0.0.0", "--port", "1"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode != 0
    assert "127.0.0.1 only" in proc.stderr


def test_connection_close_is_honoured(server: Server):
    import socket

    with socket.create_connection((server.host, server.port), timeout=10) as sock:
        sock.sendall(b"GET /ping HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        answer = b""
        while chunk := sock.recv(4096):  # ends only when the server closes the connection
            answer += chunk
    assert answer.startswith(b"HTTP/1.1 200") and answer.endswith(b"Ok.\n"), answer
