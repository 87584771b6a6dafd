#!/usr/bin/env bash
# Install what this project needs on a fresh machine, then run a justfile recipe.
#
#   tests/bootstrap.sh demo     # the demo on the local ClickHouse
#   tests/bootstrap.sh test     # every test
#   tests/bootstrap.sh          # install only
#
# Idempotent and quick when everything is already there: the Python venv (.venv, with chDB and
# the compression libraries of the local ClickHouse, pytest, clickhouse-connect, Meltano, `just`,
# maturin) is rebuilt only when requirements.txt changes (this project's Meltano package is
# installed from its wheel by the recipes that need it), and
# the wasm32-wasip2 Rust target is added only when missing.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"

venv=.venv
req=tests/clickhouse/requirements.txt
stamp="$venv/.requirements.sha256"
want="$(sha256sum < "$req" | cut -d' ' -f1)"

if [[ ! -x "$venv/bin/python" || "$(cat "$stamp" 2>/dev/null)" != "$want" ]]; then
  echo "bootstrap: creating Python venv in $venv (chDB, pytest, clickhouse-connect, Meltano, just)" >&2
  python3 -m venv "$venv"
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check -r "$req"
  echo "$want" > "$stamp"
fi

if ! rustup target list --installed 2>/dev/null | grep -qx wasm32-wasip2; then
  echo "bootstrap: adding the wasm32-wasip2 Rust target" >&2
  rustup target add wasm32-wasip2
fi

if (($#)); then
  exec "$venv/bin/just" "$@"
fi
