"""Compression as a ClickHouse server does it: HTTP content codings both ways, and ClickHouse's
own compressed blocks (`decompress=1` request bodies, `compress=1` responses).

The block format is written and read here independently of the server's code (from the
format's definition: CityHash128 v1.0.2 checksum, method byte, two little-endian sizes), so
a mistake on one side cannot hide behind the same mistake on the other.
"""

from __future__ import annotations

import bz2
import gzip
import json
import lzma
import struct
import zlib

import brotli
import lz4.block as lz4_block
import lz4.frame as lz4_frame
import pytest
from backports import zstd
from clickhouse_cityhash import cityhash
from test_conformance import assert_error

from conftest import Server

ENCODERS = {
    "gzip": gzip.compress,
    "deflate": zlib.compress,
    "br": brotli.compress,
    "xz": lzma.compress,
    "zstd": zstd.compress,
    "lz4": lz4_frame.compress,
    "bz2": bz2.compress,
}
DECODERS = {
    "gzip": gzip.decompress,
    "deflate": zlib.decompress,
    "br": brotli.decompress,
    "xz": lzma.decompress,
    "zstd": zstd.decompress,
    "lz4": lz4_frame.decompress,
    "bz2": bz2.decompress,
}
EXPECTED = "".join(f"{n}\tvalue {n}\n" for n in range(2000))
QUERY = "SELECT number, concat('value ', toString(number)) FROM numbers(2000)"


def enabled_by_default(server: Server) -> bool:
    return (
        server.ok(
            "SELECT value FROM system.settings WHERE name = 'enable_http_compression'"
        ).strip()
        == "1"
    )


# -- request bodies --------------------------------------------------------------------------


@pytest.mark.parametrize("coding", sorted(ENCODERS))
def test_compressed_query_body(server: Server, coding: str):
    resp = server.request(
        body=ENCODERS[coding](QUERY.encode()), headers={"Content-Encoding": coding}
    )
    assert resp.status == 200, resp.text
    assert resp.text == EXPECTED


@pytest.mark.parametrize("coding", sorted(ENCODERS))
def test_compressed_insert_data(server: Server, database: str, coding: str):
    server.ok(f"CREATE TABLE {database}.t (a UInt32, s String) ENGINE = MergeTree ORDER BY a")
    rows = "".join(json.dumps({"a": n, "s": f"zeile {n} ✓"}) + "\n" for n in range(500))
    resp = server.request(
        params={"query": f"INSERT INTO {database}.t FORMAT JSONEachRow"},
        body=ENCODERS[coding](rows.encode()),
        headers={"Content-Encoding": coding},
    )
    assert resp.status == 200, resp.text
    assert (
        server.ok(f"SELECT count(), sum(a), max(s) FROM {database}.t")
        == "500\t124750\tzeile 99 ✓\n"
    )


def test_unknown_content_encoding_is_refused(server: Server, database: str):
    server.ok(f"CREATE TABLE {database}.t (a UInt32) ENGINE = MergeTree ORDER BY a")
    resp = server.request(
        params={"query": f"INSERT INTO {database}.t FORMAT TabSeparated"},
        body=b"1\n",
        headers={"Content-Encoding": "compress"},
    )
    assert_error(resp, 48, 501, "NOT_IMPLEMENTED")
    assert "Unknown compression method 'compress'" in resp.text
    assert server.ok(f"SELECT count() FROM {database}.t") == "0\n"


def test_corrupt_body_is_an_error_and_inserts_nothing(server: Server, database: str):
    server.ok(f"CREATE TABLE {database}.t (a UInt32) ENGINE = MergeTree ORDER BY a")
    good = gzip.compress(b"1\n2\n3\n")
    resp = server.request(
        params={"query": f"INSERT INTO {database}.t FORMAT TabSeparated"},
        body=good[:-6] + b"garbage",
        headers={"Content-Encoding": "gzip"},
    )
    assert resp.status >= 400, resp.text
    assert resp.header("X-ClickHouse-Exception-Code")
    assert server.ok(f"SELECT count() FROM {database}.t") == "0\n"


# -- responses -------------------------------------------------------------------------------


@pytest.mark.parametrize("coding", sorted(DECODERS))
def test_response_compressed_when_asked(server: Server, coding: str):
    resp = server.request(
        body=QUERY, params={"enable_http_compression": "1"}, headers={"Accept-Encoding": coding}
    )
    assert resp.status == 200
    assert resp.header("Content-Encoding") == coding
    assert resp.header("Content-Length") == str(len(resp.body))
    assert DECODERS[coding](resp.body).decode() == EXPECTED


def test_response_coding_is_chosen_in_the_servers_order(server: Server):
    # A server prefers zstd, then br, lz4, gzip, deflate, xz, bz2, whatever order the client lists.
    for accept, chosen in [
        ("gzip, deflate, zstd", "zstd"),
        ("gzip, lz4", "lz4"),
        ("deflate, gzip", "gzip"),
        ("bz2, xz", "xz"),
        ("identity", None),
    ]:
        resp = server.request(
            body="SELECT 1",
            params={"enable_http_compression": "1"},
            headers={"Accept-Encoding": accept},
        )
        assert resp.status == 200
        assert resp.header("Content-Encoding") == chosen, accept


def test_no_compression_when_disabled_or_not_accepted(server: Server):
    resp = server.request(
        body=QUERY, params={"enable_http_compression": "0"}, headers={"Accept-Encoding": "gzip"}
    )
    assert resp.header("Content-Encoding") is None
    assert resp.text == EXPECTED
    resp = server.request(body=QUERY, params={"enable_http_compression": "1"})
    assert resp.header("Content-Encoding") is None
    assert resp.text == EXPECTED


def test_default_follows_the_servers_setting(server: Server):
    # enable_http_compression is 1 by default since 25.10: Accept-Encoding alone then compresses.
    resp = server.request(body=QUERY, headers={"Accept-Encoding": "gzip"})
    assert resp.status == 200
    if enabled_by_default(server):
        assert resp.header("Content-Encoding") == "gzip"
        assert gzip.decompress(resp.body).decode() == EXPECTED
    else:
        assert resp.header("Content-Encoding") is None
        assert resp.text == EXPECTED


def test_errors_are_compressed_too(server: Server):
    resp = server.request(
        body="SELEC 1", params={"enable_http_compression": "1"}, headers={"Accept-Encoding": "gzip"}
    )
    assert resp.status == 400
    assert resp.header("X-ClickHouse-Exception-Code") == "62"
    assert resp.header("Content-Encoding") == "gzip"
    assert "(SYNTAX_ERROR)" in gzip.decompress(resp.body).decode()


# -- ClickHouse's own blocks -----------------------------------------------------------------


def block(method: int, payload: bytes, raw_size: int) -> bytes:
    header = struct.pack("<BII", method, 9 + len(payload), raw_size) + payload
    value = cityhash.CityHash128(header)  # (first << 64) | second; written first, second
    return struct.pack("<QQ", value >> 64, value & (2**64 - 1)) + header


def lz4_blocks(data: bytes, size: int = 1000) -> bytes:
    return b"".join(
        block(
            0x82, lz4_block.compress(data[i : i + size], store_size=False), len(data[i : i + size])
        )
        for i in range(0, len(data), size)
    )


def read_blocks(data: bytes) -> bytes:
    out, pos = b"", 0
    while pos < len(data):
        checksum = data[pos : pos + 16]
        method, size, raw_size = struct.unpack_from("<BII", data, pos + 16)
        header = data[pos + 16 : pos + 16 + size]
        assert block(method, header[9:], raw_size)[:16] == checksum, "checksum"
        assert method == 0x82, hex(method)
        out += lz4_block.decompress(header[9:], uncompressed_size=raw_size)
        pos += 16 + size
    return out


def rowbinary(rows: list[tuple[int, str]]) -> bytes:
    out = b""
    for number, text in rows:
        encoded = text.encode()
        assert len(encoded) < 128
        out += struct.pack("<I", number) + bytes([len(encoded)]) + encoded
    return out


@pytest.mark.parametrize("method", ["lz4", "zstd", "none"])
def test_decompress_blocks_with_binary_insert(server: Server, database: str, method: str):
    server.ok(f"CREATE TABLE {database}.t (a UInt32, s String) ENGINE = MergeTree ORDER BY a")
    rows = [(n, f"\n\t{n}\x00 ✓") for n in range(300)]
    data = rowbinary(rows)
    if method == "lz4":
        body = lz4_blocks(data)
    elif method == "zstd":
        body = block(0x90, zstd.compress(data), len(data))
    else:
        body = block(0x02, data, len(data))
    resp = server.request(
        params={"query": f"INSERT INTO {database}.t FORMAT RowBinary", "decompress": "1"}, body=body
    )
    assert resp.status == 200, resp.text
    assert json.loads(resp.header("X-ClickHouse-Summary"))["written_rows"] == "300"
    got = server.ok(f"SELECT a, hex(s) FROM {database}.t ORDER BY a")
    assert got == "".join(f"{n}\t{s.encode().hex().upper()}\n" for n, s in rows)


def test_bad_block_checksum_is_refused_and_inserts_nothing(server: Server, database: str):
    server.ok(f"CREATE TABLE {database}.t (a UInt32, s String) ENGINE = MergeTree ORDER BY a")
    body = bytearray(lz4_blocks(rowbinary([(1, "one"), (2, "two")])))
    body[3] ^= 0xFF
    resp = server.request(
        params={"query": f"INSERT INTO {database}.t FORMAT RowBinary", "decompress": "1"},
        body=bytes(body),
    )
    assert_error(resp, 40, 500, "CHECKSUM_DOESNT_MATCH")
    assert server.ok(f"SELECT count() FROM {database}.t") == "0\n"


def test_compress_returns_blocks(server: Server):
    resp = server.request(body=QUERY, params={"compress": "1"})
    assert resp.status == 200
    assert resp.header("Content-Encoding") is None  # the blocks are not an HTTP coding
    assert read_blocks(resp.body).decode() == EXPECTED


def test_binary_insert_with_http_lz4(server: Server, database: str):
    # What clickhouse-connect sends by default: a binary format in an lz4 HTTP coding.
    server.ok(f"CREATE TABLE {database}.t (a UInt32, s String) ENGINE = MergeTree ORDER BY a")
    rows = [(n, "é\r\n\x80"[: n % 4]) for n in range(100)]
    resp = server.request(
        params={"query": f"INSERT INTO {database}.t FORMAT RowBinary"},
        body=lz4_frame.compress(rowbinary(rows)),
        headers={"Content-Encoding": "lz4"},
    )
    assert resp.status == 200, resp.text
    assert (
        server.ok(f"SELECT count(), sum(length(s)) FROM {database}.t")
        == f"100\t{sum(len(s.encode()) for _, s in rows)}\n"
    )
