"""The most used Python client, clickhouse-connect, with its defaults: lz4-compressed binary
(Native) inserts, compressed responses, a session per client, and server-side parameters.

The Rust client (the `clickhouse` crate) has its own test: tests/tests/integration/clickhouse_crate.rs.
"""

from __future__ import annotations

import datetime as dt

import clickhouse_connect
import pytest
from clickhouse_connect.driver.exceptions import DatabaseError

from conftest import Server


@pytest.fixture()
def client(server: Server, database: str):
    client = clickhouse_connect.get_client(
        host=server.host,
        port=server.port,
        username=server.user,
        password=server.password,
        secure=server.scheme == "https",
        database=database,
    )
    yield client
    client.close()


def test_defaults_are_what_this_test_means(client):
    # With its defaults the client compresses inserts with lz4 and asks for compressed answers.
    assert client.write_compression == "lz4"
    assert "lz4" in client.compression and "gzip" in client.compression


def test_create_insert_select_command(client, database: str):
    client.command(
        "CREATE TABLE t (id UInt32, name String, score Nullable(Int64), tags Array(String), "
        "at DateTime64(3, 'UTC')) ENGINE = MergeTree ORDER BY id"
    )
    base = dt.datetime(2026, 11, 30, 12, 0, tzinfo=dt.timezone.utc)
    rows = [
        [
            n,
            f"näme {n}\t'quoted' \\ ✓",
            None if n % 3 else -n,
            [str(n), ""],
            base + dt.timedelta(milliseconds=n),
        ]
        for n in range(5000)
    ]
    summary = client.insert("t", rows, column_names=["id", "name", "score", "tags", "at"])
    assert summary.written_rows == 5000

    result = client.query(
        "SELECT id, name, score, tags, at FROM t WHERE id >= {lo:UInt32} AND name LIKE {pat:String} ORDER BY id",
        parameters={"lo": 4997, "pat": "näme%"},
    )
    # the client hands back UTC times without a tzinfo
    assert result.result_rows == [(*r[:4], r[4].replace(tzinfo=None)) for r in rows[4997:]]
    assert client.command("SELECT count() FROM t WHERE score IS NULL") == sum(
        1 for n in range(5000) if n % 3
    )
    # a large answer, which the server compresses for the client
    big = client.query("SELECT id, name FROM t ORDER BY id")
    assert len(big.result_rows) == 5000 and big.result_rows[-1][1] == rows[-1][1]


def test_settings_and_session(client):
    assert client.command("SELECT getSetting('max_threads')", settings={"max_threads": 3}) == 3
    client.command("SET max_block_size = 4321")  # the client's own session keeps it
    assert client.command("SELECT getSetting('max_block_size')") == 4321


def test_errors_are_the_clients_exception_types(client):
    with pytest.raises(DatabaseError) as err:
        client.query("SELECT * FROM no_such_table")
    assert "UNKNOWN_TABLE" in str(err.value) and "code: 60" in str(err.value)
    with pytest.raises(DatabaseError) as err:
        client.command("SELEC 1")
    assert "SYNTAX_ERROR" in str(err.value)
    client.command("CREATE TABLE n (a UInt8) ENGINE = MergeTree ORDER BY a")
    with pytest.raises(DatabaseError):
        client.insert("n", [["not a number"]], column_names=["a"], column_type_names=["String"])
    assert client.command("SELECT count() FROM n") == 0
