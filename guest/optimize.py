"""Shrinks the component's core module with Binaryen's `wasm-opt -Oz`, in place.

rustc's `opt-level = "z"` with LTO still leaves about a fifth of the code that Binaryen removes
(measured: the core module's code section 392 KB -> 306 KB). `wasm-opt` works on core modules,
not components, so this takes the component's core modules out, optimizes each, and puts them
back in the same place: a component refers to its core modules by index and to their functions
by export name, and `wasm-opt` keeps every import and export.

    python guest/optimize.py target/wasm32-wasip2/release-guest/clickhouse_state.wasm

Without `wasm-opt` on PATH (Debian: `apt-get install binaryen`) the component is left as cargo
built it, with a warning: it works the same, and is larger. cargo copies its output over the
file on every build, so the optimized result is cached beside it, under the hash of what cargo
built, and reused while that has not changed.
"""

from __future__ import annotations

import argparse
import hashlib
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

# What rustc's wasm32 targets enable by default: wasm-opt may use these and no others.
FEATURES = [
    "--enable-bulk-memory",
    "--enable-sign-ext",
    "--enable-mutable-globals",
    "--enable-nontrapping-float-to-int",
    "--enable-multivalue",
    "--enable-reference-types",
]
CORE_MODULE = 1  # a component's section id for an embedded core module
SMALL = 16 * 1024  # adapter shims: nothing to gain


def leb128(data: bytes, at: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = data[at]
        at += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if byte < 0x80:
            return value, at


def encode_leb128(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def sections(data: bytes) -> list[tuple[int, bytes]]:
    """The top-level sections of a component (after its 8-byte preamble)."""
    out, at = [], 8
    while at < len(data):
        section_id = data[at]
        size, at = leb128(data, at + 1)
        out.append((section_id, data[at : at + size]))
        at += size
    if at != len(data):
        sys.exit("optimize: the component's sections overrun the file")
    return out


def optimize_module(wasm_opt: str, module: bytes) -> bytes:
    with tempfile.TemporaryDirectory() as tmp:
        source, target = Path(tmp, "in.wasm"), Path(tmp, "out.wasm")
        source.write_bytes(module)
        subprocess.run([wasm_opt, "-Oz", *FEATURES, str(source), "-o", str(target)], check=True)
        return target.read_bytes()


def optimize(data: bytes, wasm_opt: str) -> bytes:
    if data[4:8] != b"\x0d\x00\x01\x00":
        sys.exit("optimize: not a component (a core module, or another layer)")
    out = bytearray(data[:8])
    for section_id, body in sections(data):
        if section_id == CORE_MODULE and len(body) > SMALL:
            body = optimize_module(wasm_opt, body)
        out += bytes([section_id]) + encode_leb128(len(body)) + body
    return bytes(out)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("component", type=Path, help="the component (.wasm), rewritten in place")
    args = parser.parse_args()
    component: Path = args.component
    data = component.read_bytes()
    built = hashlib.sha256(data).hexdigest()
    cache = component.with_name(component.name + ".optimized")
    stamp = component.with_name(component.name + ".optimized.from")
    if cache.is_file() and stamp.is_file():
        if cache.read_bytes() == data:
            print(f"optimize: {component.name} is optimized already")
            return 0
        if stamp.read_text().strip() == built:
            shutil.copyfile(cache, component)
            print(f"optimize: {component.name} unchanged since the last run: cached result")
            return 0
    wasm_opt = shutil.which("wasm-opt")
    if wasm_opt is None:
        print(
            "optimize: no wasm-opt on PATH (Debian: apt-get install binaryen); the component "
            "stays as cargo built it",
            file=sys.stderr,
        )
        return 0
    smaller = optimize(data, wasm_opt)
    cache.write_bytes(smaller)
    stamp.write_text(built + "\n")
    shutil.copyfile(cache, component)
    print(f"optimize: {component.name} {len(data)} -> {len(smaller)} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
