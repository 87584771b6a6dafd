"""Shrinks the component's core module with Binaryen's `wasm-opt -Oz`, in place.

rustc's `opt-level = "z"` with LTO still leaves about a fifth of the code that Binaryen removes
(measured: the core module's code section 392 KB -> 306 KB). `wasm-opt` works on core modules,
not components, so this takes the component's core modules out, optimizes each, and puts them
back in the same place: a component refers to its core modules by index and to their functions
by export name, and `wasm-opt` keeps every import and export.

    python guest/optimize.py target/wasm32-wasip2/release-guest/clickhouse_state.wasm

Without `wasm-opt` on PATH (Debian: `apt-get install binaryen`), or when it fails, the component
is left as cargo built it, with a warning: it works the same, and is larger. The result replaces
the file (a new file, so cargo's own copy in `deps/`, a hard link to it, stays as built), and is
cached beside it under a key of what cargo built, the wasm-opt version, its arguments and this
script, so a rebuild that changes none of them costs nothing.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

# -Oz until a round changes nothing more (--converge: 0.4 KB), and the features rustc's wasm32
# targets enable by default: wasm-opt may use these and no others.
ARGS = [
    "-Oz",
    "--converge",
    "--enable-bulk-memory",
    "--enable-sign-ext",
    "--enable-mutable-globals",
    "--enable-nontrapping-float-to-int",
    "--enable-multivalue",
    "--enable-reference-types",
]
CORE_MODULE = 1  # a component's section id for an embedded core module
CUSTOM = 0
# Custom sections of the component itself that no host reads: the names of its internal
# instances and functions, for debugging (a twelfth of the component; the core module's own names
# are stripped by cargo already).
DROPPED = {"component-name"}


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
        if at + size > len(data):
            raise ValueError("a section runs past the end of the file")
        out.append((section_id, data[at : at + size]))
        at += size
    return out


def custom_name(body: bytes) -> str:
    size, at = leb128(body, 0)
    return body[at : at + size].decode("utf-8", errors="replace")


def optimize_module(wasm_opt: str, module: bytes) -> bytes:
    with tempfile.TemporaryDirectory() as tmp:
        source, target = Path(tmp, "in.wasm"), Path(tmp, "out.wasm")
        source.write_bytes(module)
        subprocess.run(
            [wasm_opt, *ARGS, str(source), "-o", str(target)], check=True, capture_output=True
        )
        return target.read_bytes()


def optimize(data: bytes, wasm_opt: str) -> bytes:
    """The component with its largest core module (the guest's code; the others are the
    shims that tie its imports together) optimized."""
    if data[:8] != b"\0asm\x0d\x00\x01\x00":
        raise ValueError("not a component (a core module, or another encoding)")
    parts = sections(data)
    modules = [i for i, (section_id, _) in enumerate(parts) if section_id == CORE_MODULE]
    if not modules:
        raise ValueError("no core module in it")
    largest = max(modules, key=lambda i: len(parts[i][1]))
    out = bytearray(data[:8])
    for i, (section_id, body) in enumerate(parts):
        if section_id == CUSTOM and custom_name(body) in DROPPED:
            continue
        if i == largest:
            body = optimize_module(wasm_opt, body)
        out += bytes([section_id]) + encode_leb128(len(body)) + body
    return bytes(out)


def replace(path: Path, data: bytes) -> None:
    """Writes a new file in place of `path`, whole or not at all."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("component", type=Path, help="the component (.wasm), replaced")
    parser.add_argument(
        "--require",
        action="store_true",
        help="fail (exit 1) rather than leave the component unoptimized (a release build)",
    )
    args = parser.parse_args()
    failed = 1 if args.require else 0
    component: Path = args.component
    data = component.read_bytes()
    wasm_opt = shutil.which("wasm-opt")
    if wasm_opt is None:
        print(
            "optimize: no wasm-opt on PATH (Debian: apt-get install binaryen); the component "
            "stays as cargo built it",
            file=sys.stderr,
        )
        return failed
    version = subprocess.run([wasm_opt, "--version"], capture_output=True, text=True).stdout
    key = hashlib.sha256()
    for part in (version.encode(), " ".join(ARGS).encode(), Path(__file__).read_bytes()):
        key.update(hashlib.sha256(part).digest())
    cached = component.with_name(f"{component.name}.optimized")
    stamp = component.with_name(f"{component.name}.optimized.key")
    if cached.is_file() and stamp.is_file():
        if cached.read_bytes() == data:
            print(f"optimize: {component.name} is optimized already")
            return 0
        if stamp.read_text().strip() == keyed(key, data):
            replace(component, cached.read_bytes())
            print(f"optimize: {component.name} as last time (cached)")
            return 0
    try:
        smaller = optimize(data, wasm_opt)
    except (ValueError, IndexError, subprocess.CalledProcessError) as e:
        detail = getattr(e, "stderr", b"") or b""
        print(
            f"optimize: {component.name} stays as cargo built it: {e} "
            f"{detail.decode(errors='replace').strip()}",
            file=sys.stderr,
        )
        return failed
    # The stamp goes first and last: a run cut short leaves no key that names the wrong result.
    stamp.unlink(missing_ok=True)
    replace(cached, smaller)
    replace(stamp, (keyed(key, data) + "\n").encode())
    replace(component, smaller)
    print(f"optimize: {component.name} {len(data)} -> {len(smaller)} bytes")
    return 0


def keyed(key: hashlib._Hash, data: bytes) -> str:
    """The cache key of `data` under this wasm-opt, its arguments and this script."""
    whole = key.copy()
    whole.update(hashlib.sha256(data).digest())
    return whole.hexdigest()


if __name__ == "__main__":
    sys.exit(main())
