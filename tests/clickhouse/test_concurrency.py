"""A server runs queries in parallel and keeps each request's database, settings and session
its own. These tests count violations and assert there are none."""

from __future__ import annotations

import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

from test_conformance import assert_error

from conftest import Server, start_private_server, stop_private_server

SLEEPERS = 8


def test_concurrent_sleeps_take_about_one_sleep(server: Server):
    # Eight `SELECT sleep(1)` on eight connections: a server that ran one query at a time would
    # need 8 s; a server runs them together in about 1 s. The bound leaves room for a busy machine.
    barrier = threading.Barrier(SLEEPERS)

    def sleeper(_: int) -> tuple[int, str]:
        conn = server.connect()
        try:
            conn.connect()
            barrier.wait()
            resp = server.request(body="SELECT sleep(1)", conn=conn)
            return resp.status, resp.text
        finally:
            conn.close()

    started = time.monotonic()
    with ThreadPoolExecutor(SLEEPERS) as pool:
        results = list(pool.map(sleeper, range(SLEEPERS)))
    elapsed = time.monotonic() - started
    assert results == [(200, "0\n")] * SLEEPERS
    assert elapsed < SLEEPERS / 2, f"{SLEEPERS} concurrent sleeps of 1 s took {elapsed:.2f} s"


def test_concurrent_writers_each_land(server: Server, database: str):
    server.ok(f"CREATE TABLE {database}.t (w UInt32, n UInt32) ENGINE = MergeTree ORDER BY (w, n)")
    errors: list[str] = []

    def writer(w: int) -> None:
        conn = server.connect()
        try:
            for n in range(25):
                resp = server.request(body=f"INSERT INTO {database}.t VALUES ({w}, {n})", conn=conn)
                if resp.status != 200:
                    errors.append(resp.text)
        finally:
            conn.close()

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(writer, range(8)))
    assert errors == []
    assert server.ok(f"SELECT count(), uniqExact(w, n) FROM {database}.t") == "200\t200\n"


def test_overlapping_requests_keep_their_database_and_settings(server: Server):
    names = [f"iso_{uuid.uuid4().hex[:10]}" for _ in range(4)]
    for name in names:
        server.ok(f"CREATE DATABASE {name}")
    violations: list[str] = []
    errors: list[str] = []

    def client(index: int) -> None:
        conn = server.connect()
        try:
            for round_ in range(10):
                db = names[(index + round_) % len(names)]
                threads = str(1 + (index * 7 + round_) % 9)
                # the sleep keeps each query open while the others run
                resp = server.request(
                    body="SELECT currentDatabase(), getSetting('max_threads'), sleep(0.05)",
                    params={"database": db, "max_threads": threads},
                    conn=conn,
                )
                if resp.status != 200:
                    errors.append(resp.text)
                elif resp.text != f"{db}\t{threads}\t0\n":
                    violations.append(f"client {index} asked {db}/{threads}, got {resp.text!r}")
                plain = server.request(body="SELECT currentDatabase(), sleep(0.02)", conn=conn)
                if plain.text != "default\t0\n":
                    violations.append(f"client {index} leaked database: {plain.text!r}")
        finally:
            conn.close()

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(client, range(8)))
    for name in names:
        server.query(f"DROP DATABASE IF EXISTS {name}")
    assert errors == []
    assert violations == []


# -- sessions --------------------------------------------------------------------------------


def in_session(server: Server, session: str, sql: str, **params: str):
    return server.request(body=sql, params={"session_id": session, **params})


def test_session_keeps_its_set_use_and_temporary_tables(server: Server, database: str):
    a, b = f"a-{uuid.uuid4()}", f"b-{uuid.uuid4()}"
    default = server.ok("SELECT getSetting('max_block_size')")
    assert in_session(server, a, "SET max_block_size = 4321").status == 200
    assert in_session(server, a, f"USE {database}").status == 200
    assert in_session(server, a, "CREATE TEMPORARY TABLE tmp (x UInt8)").status == 200
    assert in_session(server, a, "INSERT INTO tmp VALUES (7)").status == 200

    assert (
        in_session(server, a, "SELECT getSetting('max_block_size'), currentDatabase()").text
        == f"4321\t{database}\n"
    )
    assert in_session(server, a, "SELECT x FROM tmp").text == "7\n"
    # another session, and a request without one, see none of it
    assert (
        in_session(server, b, "SELECT getSetting('max_block_size'), currentDatabase()").text
        == f"{default.strip()}\tdefault\n"
    )
    assert in_session(server, b, "EXISTS TEMPORARY TABLE tmp").text == "0\n"
    assert (
        server.ok("SELECT getSetting('max_block_size'), currentDatabase()")
        == f"{default.strip()}\tdefault\n"
    )


def test_url_settings_in_a_session_last_one_query(server: Server):
    s = f"s-{uuid.uuid4()}"
    assert in_session(server, s, "SET max_threads = 3").status == 200
    assert in_session(server, s, "SELECT getSetting('max_threads')", max_threads="5").text == "5\n"
    assert in_session(server, s, "SELECT getSetting('max_threads')").text == "3\n"


def test_url_settings_in_a_session_follow_each_request(server: Server):
    # Requests in one session whose URL settings come, change, repeat and go, around the
    # session's own SET, and one whose setting the server refuses.
    s = f"u-{uuid.uuid4()}"
    probe = "SELECT getSetting('max_threads'), getSetting('max_block_size')"
    assert in_session(server, s, "SET max_threads = 3").status == 200
    default_block = server.ok("SELECT getSetting('max_block_size')").strip()
    steps = [
        ({"max_threads": "5"}, f"5\t{default_block}"),
        ({"max_threads": "5"}, f"5\t{default_block}"),
        ({"max_block_size": "777"}, "3\t777"),
        ({}, f"3\t{default_block}"),
        ({"max_threads": "6", "max_block_size": "778"}, "6\t778"),
        ({"max_threads": "6"}, f"6\t{default_block}"),
    ]
    for params, expected in steps:
        assert in_session(server, s, probe, **params).text == f"{expected}\n", params
    assert in_session(server, s, "SET max_block_size = 4321", max_threads="7").status == 200
    assert in_session(server, s, probe).text == "3\t4321\n"
    assert in_session(server, s, probe, max_threads="not a number").status != 200
    assert in_session(server, s, probe).text == "3\t4321\n"
    assert in_session(server, s, probe, max_block_size="99").text == "3\t99\n"
    assert in_session(server, s, probe).text == "3\t4321\n"


def test_concurrent_sessions_never_see_each_other(server: Server):
    sessions = [f"c{i}-{uuid.uuid4()}" for i in range(6)]
    violations: list[str] = []
    errors: list[str] = []

    def client(index: int) -> None:
        sid = sessions[index]
        value = str(1000 + index)
        for step in range(8):
            resp = in_session(server, sid, f"SET max_block_size = {value}{step}")
            if resp.status != 200:
                errors.append(resp.text)
            resp = in_session(server, sid, "SELECT getSetting('max_block_size'), sleep(0.03)")
            if resp.status != 200:
                errors.append(resp.text)
            elif resp.text != f"{value}{step}\t0\n":
                violations.append(f"session {index} step {step} saw {resp.text!r}")

    with ThreadPoolExecutor(len(sessions)) as pool:
        list(pool.map(client, range(len(sessions))))
    assert errors == []
    assert violations == []


def test_one_session_used_twice_at_once_is_locked(server: Server):
    s = f"l-{uuid.uuid4()}"
    assert in_session(server, s, "SELECT 1").status == 200

    def holder():
        # A poll may hold the session when this arrives; then it is refused too, and tries again.
        while True:
            resp = in_session(server, s, "SELECT sleep(2)")
            if resp.header("X-ClickHouse-Exception-Code") != "373":
                return resp
            time.sleep(0.02)

    holding = ThreadPoolExecutor(1).submit(holder)
    locked, others = 0, []
    while not holding.done():
        resp = in_session(server, s, "SELECT 2")
        if resp.status != 200:
            if resp.header("X-ClickHouse-Exception-Code") == "373":
                assert "SESSION_IS_LOCKED" in resp.text
                locked += 1
            else:
                others.append(resp.text)
        time.sleep(0.1)
    assert holding.result().status == 200, holding.result().text
    assert others == []
    assert locked > 0, "a second query in a busy session was not refused"


def test_session_check_for_an_unknown_session(server: Server):
    resp = in_session(server, f"none-{uuid.uuid4()}", "SELECT 1", session_check="1")
    assert resp.header("X-ClickHouse-Exception-Code") == "372", resp.text
    assert "(SESSION_NOT_FOUND)" in resp.text


# -- the local server's own limits -----------------------------------------------------------


def test_a_full_pool_answers_too_many_simultaneous_queries(tmp_path):
    private = start_private_server(tmp_path, "--max-concurrent-queries", "2")
    srv = private.server
    barrier = threading.Barrier(3)

    def sleeper(_: int):
        conn = srv.connect()
        try:
            conn.connect()
            barrier.wait()
            return srv.request(body="SELECT sleep(1.5)", conn=conn)
        finally:
            conn.close()

    try:
        with ThreadPoolExecutor(3) as pool:
            results = list(pool.map(sleeper, range(3)))
        refused = [r for r in results if r.status != 200]
        assert sorted(r.status for r in results) == [200, 200, 500], [r.text for r in results]
        assert_error(refused[0], 202, 500, "TOO_MANY_SIMULTANEOUS_QUERIES")
        assert "Maximum: 2" in refused[0].text
        assert srv.ok("SELECT 1") == "1\n"  # and the pool is whole again
    finally:
        stop_private_server(private)
