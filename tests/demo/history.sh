#!/usr/bin/env bash
# The README's history session, run for real: a Meltano pipeline (the test tap and target in
# python/tests/plugins, nothing installed) whose bad run moves the bookmark past every real file;
# then `history`, `diff` and `restore` with the CLI beside Meltano, on Meltano's own variables;
# then the next run resumes from the restored bookmark. Needs the package in Meltano's venv
# (the workspace's builds are used: `just demo-history` makes them) and the local ClickHouse. Long JSON is cut to its first lines.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
venv="$root/.venv/bin"
work="$(mktemp -d "${TMPDIR:-/tmp}/history-demo.XXXXXX")"
trap 'rm -rf "$work"' EXIT
# Meltano picks the backend by the URI's scheme.
url="${CLICKHOUSE_URL:-http://default:@127.0.0.1:8123}"
export MELTANO_STATE_BACKEND_URI="clickhouse://${url#*://}"
export MELTANO_STATE_BACKEND_URI="${MELTANO_STATE_BACKEND_URI%/}/default"
export MELTANO_STATE_BACKEND_CLICKHOUSE_SCHEMA=demo
export MELTANO_STATE_BACKEND_CLICKHOUSE_TABLE="history_$(date +%s)"
export MELTANO_STATE_BACKEND_CLICKHOUSE_ALLOW_LOOPBACK=true
export MELTANO_SEND_ANONYMOUS_USAGE_STATS=false MELTANO_CLI_DISABLE_VERSION_CHECK=true
# The workspace's builds (`just build`), for Meltano's bridge and on the PATH.
export STATE_BACKEND_BIN="$root/target/debug/state-backend"
export STATE_BACKEND_COMPONENT="$root/target/wasm32-wasip2/release-guest/clickhouse_state.wasm"
export PATH="$root/target/debug:$venv:$PATH"
plugins="$root/python/tests/plugins"

cd "$work"
meltano init project --no-usage-stats >/dev/null 2>&1
cd project
cat > meltano.yml <<YML
default_environment: dev
project_id: history-demo
send_anonymous_usage_stats: false
environments:
- name: dev
plugins:
  extractors:
  - name: tap-files
    namespace: tap_files
    executable: $plugins/tap_files.py
    capabilities: [catalog, discover, state]
    config: {directory: \$MELTANO_PROJECT_ROOT/data, stream: events, key_properties: [id]}
  loaders:
  - name: target-lines
    namespace: target_lines
    executable: $plugins/target_lines.py
    config: {destination: \$MELTANO_PROJECT_ROOT/out}
YML
mkdir data out
file() { # file NAME TOUCH-STAMP IDS...
    { printf 'id,name\n'; for i in "${@:3}"; do printf '%s,event %s\n' "$i" "$i"; done; } > "data/$1"
    touch -d "$2" "data/$1"
}
say() { printf '\n# %s\n' "$*"; }
show() { printf '$ %s\n' "$*"; "$@"; }
loaded() { cat out/*.jsonl 2>/dev/null | wc -l | xargs printf '(%s records loaded)\n'; rm -f out/*.jsonl; }
run() { printf '$ meltano run tap-files target-lines\n'; meltano run --no-install tap-files target-lines >"$work/run.log" 2>&1 || { cat "$work/run.log"; exit 1; }; loaded; }
id=dev:tap-files-to-target-lines
version() { state-backend history "$id" --limit 50 | "$venv/python" -c "
import json, sys
entries = json.load(sys.stdin)
print(next(e['version'] for e in entries[::-1] if e['state']['singer_state']['bookmarks']['events']['replication_key_value'].startswith('$1')))"; }

say "a good run, then a bad one: a file stamped 2030 moves the bookmark past every real file"
file a.csv '2026-11-01 10:00Z' 1 2 3; run
file bad.csv '2030-01-01 00:00Z' 666; run; rm data/bad.csv
say "the next day's file is skipped"
file b.csv '2026-11-02 10:00Z' 4 5; run
say "the history, newest first"
show state-backend history "$id" --limit 2 | head -22
good="$(version 2026-11-01)"
say "what the bad run changed"
show state-backend diff "$id" "$good" "$(version 2030)" | head -16
show state-backend restore "$id" --to "$good" | head -12
say "the next run resumes from the restored bookmark"
run
