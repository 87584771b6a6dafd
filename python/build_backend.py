"""The package's build backend: maturin's, after making sure the component is there.

The component (`clickhouse_state.wasm`) is built from the repository's `guest/` crate and is not
in git. Wheels and the sdist built by the justfile or the release workflow have it copied in
first; a build straight from a git checkout (`pip install "git+…#subdirectory=python"`) does
not, so here it is built before maturin runs: `cargo build` of the guest for `wasm32-wasip2`
(the target added by rustup first), then shrunk by `guest/optimize.py` where Binaryen's
`wasm-opt` is on PATH. An sdist carries the
component, and has no guest to build it from: missing there, it is an error.

A wheel also carries the host built as a library (``libstate_host.so`` and the like), which
Meltano's process loads (``embedded.py``); where it is missing, it is built here for this
machine, with ``cargo rustc --crate-type cdylib --features embedded``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import maturin
from maturin import *  # noqa: F403 (the hooks this backend does not wrap)

HERE = Path(__file__).resolve().parent
COMPONENT = HERE / "src" / "meltano_clickhouse_state" / "clickhouse_state.wasm"
ROOT = HERE.parent
GUEST = "clickhouse-state-guest"
TARGET = "wasm32-wasip2"
PROFILE = "release-guest"


def _say(message: str) -> None:
    print(f"meltano-state-backend build: {message}", file=sys.stderr, flush=True)


def _ensure_component() -> None:
    if COMPONENT.is_file():
        return
    if not (ROOT / "guest" / "Cargo.toml").is_file():
        raise RuntimeError(
            f"{COMPONENT.name} is missing, and there is no guest crate beside this package to "
            "build it from: build from a whole checkout of the repository, or from its sdist"
        )
    cargo = os.environ.get("CARGO", "cargo")
    if shutil.which("rustup"):
        # rust-toolchain.toml's targets are added when rustup installs the toolchain, not when
        # the toolchain is already there: add it (a no-op when present).
        subprocess.run(["rustup", "target", "add", TARGET], cwd=ROOT, check=True)
    # Where cargo puts it (CARGO_TARGET_DIR, a .cargo/config.toml), as cargo itself says.
    metadata = subprocess.run(
        [cargo, "metadata", "--format-version", "1", "--no-deps"],
        cwd=ROOT,
        check=True,
        capture_output=True,
        text=True,
    )
    target_dir = Path(json.loads(metadata.stdout)["target_directory"])
    _say(f"building the component ({GUEST}, {TARGET}) into {target_dir}")
    command = [cargo, "build", "-p", GUEST, "--target", TARGET, "--profile", PROFILE]
    subprocess.run(command, cwd=ROOT, check=True)
    built = target_dir / TARGET / PROFILE / COMPONENT.name
    optimize = [sys.executable, str(ROOT / "guest" / "optimize.py"), str(built)]
    subprocess.run(optimize, cwd=ROOT, check=True)
    shutil.copyfile(built, COMPONENT)
    _say(f"component: {COMPONENT.stat().st_size} bytes")


def _library_name() -> str:
    if sys.platform == "win32":
        return "state_host.dll"
    return "libstate_host.dylib" if sys.platform == "darwin" else "libstate_host.so"


def _ensure_library() -> None:
    """The host as a library for Meltano's process (``embedded.py``), built for this machine
    from the host crate (beside this file in an sdist, in the checkout otherwise)."""
    library = COMPONENT.with_name(_library_name())
    # Built every time (cargo makes it a no-op when nothing changed): a copy left in the tree
    # by an earlier build may be of older code.
    manifest = next(
        (p for p in (HERE / "host" / "Cargo.toml", ROOT / "host" / "Cargo.toml") if p.is_file()),
        None,
    )
    if manifest is None:
        raise RuntimeError("the host crate (host/Cargo.toml) is missing: build from an sdist")
    cargo = os.environ.get("CARGO", "cargo")
    metadata = subprocess.run(
        [cargo, "metadata", "--format-version", "1", "--no-deps", "--manifest-path", manifest],
        check=True,
        capture_output=True,
        text=True,
    )
    target_dir = Path(json.loads(metadata.stdout)["target_directory"])
    _say(f"building the host library (embedded) into {target_dir}")
    command = [cargo, "rustc", "--release", "--manifest-path", str(manifest), "--lib"]
    command += ["--crate-type", "cdylib", "--features", "embedded"]
    # A cross build (CARGO_BUILD_TARGET) builds the library for its target when that is Linux;
    # for another system the wheel goes without (its host runs as a child process), and never
    # with this machine's.
    target = os.environ.get("CARGO_BUILD_TARGET")
    for stale in COMPONENT.parent.glob("*state_host.*"):
        stale.unlink()
    if target and "-linux-" not in target:
        _say(f"no host library for {target}: its wheel runs the host as a child process")
        return
    built = target_dir / target / "release" if target else target_dir / "release"
    if target:
        command += ["--target", target]
    command += ["--", "-C", "strip=symbols"]
    subprocess.run(command, cwd=manifest.parent, check=True)
    shutil.copyfile(built / library.name, library)
    _say(f"host library: {library.stat().st_size} bytes")


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    _ensure_component()
    _ensure_library()
    return maturin.build_wheel(wheel_directory, config_settings, metadata_directory)


def build_editable(wheel_directory, config_settings=None, metadata_directory=None):
    _ensure_component()
    _ensure_library()
    return maturin.build_editable(wheel_directory, config_settings, metadata_directory)


def build_sdist(sdist_directory, config_settings=None):
    _ensure_component()
    return maturin.build_sdist(sdist_directory, config_settings)
