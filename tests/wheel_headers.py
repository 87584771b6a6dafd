"""Checks the wheels whose executables cannot run here, by what their headers say.

    python tests/wheel_headers.py target/wheels/*-macosx_*.whl target/wheels/*-win_amd64.whl

For each wheel, its `state-backend` executable must:
- be an executable for the architecture its tag names;
- load only what every machine of that platform has:
  - on macOS, libSystem, libiconv, libcharset and system frameworks (nothing from Homebrew or
    @rpath);
  - on Windows, system DLLs and the Universal CRT (no Visual C++ redistributable, no MinGW
    runtime DLLs);
- on macOS, need no newer macOS than the tag admits (LC_BUILD_VERSION's minimum, or the older
  LC_VERSION_MIN_MACOSX), so that pip never installs it where it cannot start;
- on macOS arm64, carry a code signature whose page hashes match the file. Ad hoc is enough,
  but macOS kills unsigned or altered arm64 code.
The wheel must hold the component and the package too. What the headers cannot show is whether
each imported symbol exists on the platform: only running there does (the release workflow).
"""

from __future__ import annotations

import hashlib
import re
import struct
import sys
import tempfile
import zipfile
from pathlib import Path

import pefile
from macholib import mach_o
from macholib.MachO import MachO

MACOS_TAG = re.compile(r"-macosx_(\d+)_(\d+)_(arm64|x86_64)\.whl$")
#: Mach-O CPU types as macholib names them.
MACOS_CPU = {"arm64": "ARM64", "x86_64": "x86_64"}
MACOS_LIBRARIES = re.compile(
    r"^(/usr/lib/lib(System\.B|iconv\.2|charset\.1|c\+\+\.1|objc\.A)\.dylib"
    r"|/System/Library/Frameworks/\w+\.framework/Versions/[A-Z]/\w+)$"
)
WINDOWS_DLLS = re.compile(
    r"^(api-ms-win-[\w-]+|kernel32|kernelbase|ntdll|advapi32|bcrypt|bcryptprimitives|combase"
    r"|crypt32|secur32|shell32|userenv|ws2_32|ole32|oleaut32|user32|ucrtbase|msvcrt)\.dll$",
    re.IGNORECASE,
)
PACKAGE = ("meltano_clickhouse_state/clickhouse_state.wasm", "meltano_clickhouse_state/manager.py")
CODE_DIRECTORY = 0xFADE0C02
HASHES = {1: hashlib.sha1, 2: hashlib.sha256}


def signature_problem(binary: bytes, offset: int) -> str | None:
    """Whether the code signature's CodeDirectory hashes every page of the file as it is."""
    magic, _, count = struct.unpack_from(">III", binary, offset)
    if magic != 0xFADE0CC0:
        return f"the code signature is not a SuperBlob ({magic:#x})"
    for i in range(count):
        _, at = struct.unpack_from(">II", binary, offset + 12 + 8 * i)
        directory = offset + at
        if struct.unpack_from(">I", binary, directory)[0] != CODE_DIRECTORY:
            continue
        hash_offset, _, _, slots, limit = struct.unpack_from(">IIIII", binary, directory + 16)
        size, kind, _, page_log2 = struct.unpack_from(">BBBB", binary, directory + 36)
        digest = HASHES.get(kind)
        if digest is None:
            return f"unknown hash type {kind}"
        page = 1 << page_log2
        for slot in range(slots):
            want = binary[directory + hash_offset + slot * size :][:size]
            got = digest(binary[slot * page : min((slot + 1) * page, limit)]).digest()[:size]
            if got != want:
                return f"page {slot} does not match its signature: the file changed after signing"
        return None
    return "the code signature has no CodeDirectory"


def check_macos(host: Path, tag: re.Match[str]) -> tuple[list[str], str]:
    admits = (int(tag[1]), int(tag[2]))
    arch = tag[3]
    problems = []
    headers = MachO(str(host)).headers
    if len(headers) != 1:
        problems.append(f"{len(headers)} architectures in one file; the tag names one")
    header = headers[0]
    cpu = mach_o.CPU_TYPE_NAMES.get(header.header.cputype, hex(header.header.cputype))
    if cpu != MACOS_CPU[arch]:
        problems.append(f"CPU type {cpu}, the tag says {arch}")
    if header.filetype != "execute":
        problems.append(f"a Mach-O {header.filetype}, not an executable")
    minimum = None
    signature = None
    libraries = []
    for load, command, data in header.commands:
        if load.cmd == mach_o.LC_BUILD_VERSION:
            minimum = (command.minos >> 16, (command.minos >> 8) & 0xFF)
        elif load.cmd == mach_o.LC_VERSION_MIN_MACOSX:
            minimum = (command.version >> 16, (command.version >> 8) & 0xFF)
        elif load.cmd == mach_o.LC_CODE_SIGNATURE:
            signature = command.dataoff
        elif load.cmd in (mach_o.LC_LOAD_DYLIB, mach_o.LC_LOAD_WEAK_DYLIB):
            libraries.append(data.rstrip(b"\0").decode())
    if minimum is None:
        problems.append("no minimum macOS version in the headers")
    elif minimum > admits:
        problems.append(f"needs macOS {minimum}, the tag admits {admits}")
    for library in libraries:
        if not MACOS_LIBRARIES.match(library):
            problems.append(f"loads {library}, which a Mac may not have")
    signed = "unsigned"
    if signature is not None:
        problem = signature_problem(host.read_bytes(), signature)
        signed = "signed" if problem is None else "badly signed"
        if problem:
            problems.append(problem)
    if arch == "arm64" and signature is None:
        problems.append("no code signature: macOS kills unsigned arm64 executables")
    needs = f"{minimum[0]}.{minimum[1]}" if minimum else "?"
    return problems, f"{arch}, macOS >= {needs}, {signed}, loads {', '.join(libraries)}"


def check_windows(host: Path) -> tuple[list[str], str]:
    problems = []
    pe = pefile.PE(str(host))
    if pe.FILE_HEADER.Machine != pefile.MACHINE_TYPE["IMAGE_FILE_MACHINE_AMD64"]:
        problems.append(f"machine {pe.FILE_HEADER.Machine:#x}, the tag says amd64")
    if not pe.is_exe():
        problems.append("not an executable")
    dlls = sorted({entry.dll.decode() for entry in getattr(pe, "DIRECTORY_ENTRY_IMPORT", [])})
    for dll in dlls:
        if not WINDOWS_DLLS.match(dll):
            problems.append(f"imports {dll}, which Windows does not ship")
    return problems, f"amd64, imports {', '.join(dlls)}"


def check(wheel: Path) -> list[str]:
    macos = MACOS_TAG.search(wheel.name)
    windows = wheel.name.endswith("-win_amd64.whl")
    if not (macos or windows):
        return ["neither a macOS nor a Windows wheel"]
    script = "state-backend.exe" if windows else "state-backend"
    with tempfile.TemporaryDirectory() as tmp, zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        problems = [f"{needed} is missing" for needed in PACKAGE if needed not in names]
        hosts = [n for n in names if n.endswith(f".data/scripts/{script}")]
        if len(hosts) != 1:
            return [*problems, f"expected one {script} among the scripts, found {hosts}"]
        host = Path(archive.extract(hosts[0], tmp))
        found, summary = check_windows(host) if windows else check_macos(host, macos)
        print(f"{wheel.name}: {summary}")
        return problems + found


def main() -> None:
    wheels = [Path(a) for a in sys.argv[1:]]
    if not wheels:
        sys.exit("usage: wheel_headers.py WHEEL...")
    failed = False
    for wheel in wheels:
        for problem in check(wheel):
            print(f"{wheel.name}: {problem}", file=sys.stderr)
            failed = True
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
