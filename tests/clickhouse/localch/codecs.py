"""Compression as a ClickHouse server does it over HTTP.

- HTTP content codings: a request body with `Content-Encoding` gzip, deflate, br, xz, zstd, lz4
  or bz2 is decoded; a response is encoded when `enable_http_compression` is on and
  `Accept-Encoding` names one, chosen in the server's order of preference.
- ClickHouse's own compressed block format: a request body with `decompress=1`, a response
  with `compress=1`. Each block is a CityHash128 (v1.0.2) checksum, a method byte, the
  compressed size (with the 9-byte header) and the raw size, then the data.

Maintained packages do the work: lz4, backports.zstd (the standard library's zstd before
Python 3.14), brotli and clickhouse-cityhash; gzip, deflate, xz and bz2 are in the standard
library.
"""

from __future__ import annotations

import bz2
import lzma
import struct
import zlib

import brotli
import lz4.block
import lz4.frame
from backports import zstd
from clickhouse_cityhash.cityhash import CityHash128

from .errors import ErrorCodes

# Content-Encoding names as ClickHouse's chooseCompressionMethod reads them.
_ALIASES = {
    "gzip": "gzip",
    "gz": "gzip",
    "deflate": "deflate",
    "br": "br",
    "brotli": "br",
    "xz": "xz",
    "lzma": "xz",
    "zstd": "zstd",
    "zst": "zstd",
    "lz4": "lz4",
    "bz2": "bz2",
}
# The engine's error name when a body does not decode.
_DECODE_ERROR = {
    "gzip": "ZLIB_INFLATE_FAILED",
    "deflate": "ZLIB_INFLATE_FAILED",
    "br": "BROTLI_READ_FAILED",
    "xz": "LZMA_STREAM_DECODER_FAILED",
    "zstd": "ZSTD_DECODER_FAILED",
    "lz4": "LZ4_DECODER_FAILED",
    "bz2": "BZIP2_STREAM_DECODER_FAILED",
}
# ClickHouse's chooseHTTPCompressionMethod: the first of these named anywhere in Accept-Encoding
# (snappy, which a server can read but not write, is left out).
_RESPONSE_PREFERENCE = ("zstd", "br", "lz4", "gzip", "deflate", "xz", "bz2")


def _decode(name: str, data: bytes) -> bytes:
    if name == "gzip":
        return zlib.decompress(data, 31)
    if name == "deflate":
        return zlib.decompress(data, 15)
    if name == "br":
        return brotli.decompress(data)
    if name == "xz":
        return lzma.decompress(data)
    if name == "zstd":
        return zstd.decompress(data)
    if name == "lz4":
        return lz4.frame.decompress(data)
    return bz2.decompress(data)


def decode_body(encoding: str, data: bytes, codes: ErrorCodes) -> bytes:
    """A request body with its `Content-Encoding` undone."""
    key = encoding.strip().lower()
    if key in ("", "none", "auto"):
        return data
    name = _ALIASES.get(key)
    if name is None:
        raise codes.error(
            "NOT_IMPLEMENTED",
            f"Unknown compression method '{encoding.strip()}'. Only 'auto', 'none', 'gzip', "
            "'deflate', 'br', 'xz', 'zstd', 'lz4', 'bz2' are supported as compression methods",
        )
    try:
        return _decode(name, data)
    except Exception as exc:  # each library raises its own error type
        raise codes.error(
            _DECODE_ERROR[name], f"Cannot decode {name} request body: {exc}"
        ) from None


def choose_response_encoding(accept_encoding: str) -> str | None:
    """The coding a server picks for this `Accept-Encoding`, or None."""
    for name in _RESPONSE_PREFERENCE:
        if name in accept_encoding:
            return name
    return None


def encode_body(name: str, data: bytes, level: int) -> bytes:
    """A response body in coding `name`, at `http_zlib_compression_level` where it applies."""
    if name == "gzip":
        compressor = zlib.compressobj(level, zlib.DEFLATED, 31)
        return compressor.compress(data) + compressor.flush()
    if name == "deflate":
        return zlib.compress(data, level)
    if name == "br":
        return brotli.compress(data)
    if name == "xz":
        return lzma.compress(data)
    if name == "zstd":
        return zstd.compress(data, level)
    if name == "lz4":
        return lz4.frame.compress(data)
    return bz2.compress(data)


# -- ClickHouse's compressed block format (compress=1 / decompress=1) --------------------------

METHOD_NONE = 0x02
METHOD_LZ4 = 0x82
METHOD_ZSTD = 0x90
_HEADER = struct.Struct("<BII")  # method, compressed size (with this header), raw size
_CHECKSUM_SIZE = 16
# A server's max_compress_block_size: the raw size of one block it writes.
BLOCK_SIZE = 1 << 20
# Refuse a block that claims more than this (a server's limit is 1 GiB).
MAX_BLOCK_SIZE = 1 << 30


def _checksum(block: bytes) -> bytes:
    value = CityHash128(block)
    # CityHash128 is a pair of 64-bit words; the package gives it as (first << 64) | second, and
    # ClickHouse writes the pair as it lies in memory: first, then second, each little-endian.
    return struct.pack("<QQ", value >> 64, value & 0xFFFF_FFFF_FFFF_FFFF)


def compress_blocks(data: bytes) -> bytes:
    """`data` as LZ4 blocks, as a server answers `compress=1`."""
    out = bytearray()
    for start in range(0, len(data), BLOCK_SIZE) if data else ():
        raw = data[start : start + BLOCK_SIZE]
        packed = lz4.block.compress(raw, store_size=False)
        block = _HEADER.pack(METHOD_LZ4, _HEADER.size + len(packed), len(raw)) + packed
        out += _checksum(block) + block
    return bytes(out)


def decompress_blocks(data: bytes, codes: ErrorCodes, *, verify: bool = True) -> bytes:
    """A `decompress=1` request body: blocks of LZ4, ZSTD or no compression."""
    out = bytearray()
    pos = 0
    while pos < len(data):
        if len(data) - pos < _CHECKSUM_SIZE + _HEADER.size:
            raise codes.error(
                "CANNOT_DECOMPRESS", "Cannot read compressed block header: data is truncated"
            )
        checksum = data[pos : pos + _CHECKSUM_SIZE]
        method, size, raw_size = _HEADER.unpack_from(data, pos + _CHECKSUM_SIZE)
        if size < _HEADER.size or size > MAX_BLOCK_SIZE or raw_size > MAX_BLOCK_SIZE:
            raise codes.error(
                "TOO_LARGE_SIZE_COMPRESSED", f"Too large size_compressed_without_checksum: {size}"
            )
        block = data[pos + _CHECKSUM_SIZE : pos + _CHECKSUM_SIZE + size]
        if len(block) < size:
            raise codes.error(
                "CANNOT_DECOMPRESS", "Cannot read compressed block: data is truncated"
            )
        if verify and _checksum(block) != checksum:
            raise codes.error("CHECKSUM_DOESNT_MATCH", "Checksum doesn't match: corrupted data")
        payload = block[_HEADER.size :]
        try:
            if method == METHOD_LZ4:
                raw = lz4.block.decompress(payload, uncompressed_size=raw_size)
            elif method == METHOD_ZSTD:
                raw = zstd.decompress(payload)
            elif method == METHOD_NONE:
                raw = payload
            else:
                raise codes.error(
                    "UNKNOWN_COMPRESSION_METHOD", f"Unknown compression method: {method:#x}"
                )
        except (lz4.block.LZ4BlockError, zstd.ZstdError) as exc:
            raise codes.error("CANNOT_DECOMPRESS", f"Cannot decompress block: {exc}") from None
        if len(raw) != raw_size:
            raise codes.error(
                "CANNOT_DECOMPRESS", f"Block decompressed to {len(raw)} bytes, expected {raw_size}"
            )
        out += raw
        pos += _CHECKSUM_SIZE + size
    return bytes(out)
