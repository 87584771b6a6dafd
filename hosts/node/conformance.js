// Runs the shared conformance cases (tests/conformance/cases.json) through this host against the
// ClickHouse at $CLICKHOUSE_URL (default http://default:@127.0.0.1:8123), each case on a table of
// its own. `node conformance.js [--component gen/clickhouse_state.js] [NAME-SUBSTRING]`.
// Prints one line per case; exits 1 when any fails.

import { readFileSync } from "node:fs";
import { randomBytes } from "node:crypto";
import { isIP } from "node:net";
import { BackendError, open } from "./src/index.js";

// A call that never answers fails the run rather than hanging it.
setTimeout(() => {
  console.error("conformance.js: no result after 15 minutes");
  process.exit(1);
}, 15 * 60_000).unref();

const args = process.argv.slice(2);
const componentAt = args.indexOf("--component");
const component = componentAt >= 0 ? args.splice(componentAt, 2)[1] : undefined;
const only = args[0];

const cases = JSON.parse(
  readFileSync(new URL("../../tests/conformance/cases.json", import.meta.url), "utf8"),
).cases;

const url = new URL(process.env.CLICKHOUSE_URL ?? "http://default:@127.0.0.1:8123");
if (url.pathname === "/" || url.pathname === "") url.pathname = "/default";
const host = url.hostname.replace(/^\[|\]$/g, "");
const loopback = host === "localhost" || (isIP(host) && /^(127\.|::1$)/.test(host));
const run = randomBytes(4).toString("hex");

/** Host values in the cases' form: snake_case keys, numbers for u64s, parts parsed as JSON. */
function canonical(value) {
  if (typeof value === "bigint") return Number(value);
  if (Array.isArray(value)) return value.map(canonical);
  if (value && typeof value === "object") {
    const out = {};
    for (const [key, v] of Object.entries(value)) {
      const snake = key.replace(/[A-Z]/g, (c) => `_${c.toLowerCase()}`);
      out[snake] = (snake === "partial" || snake === "completed") && typeof v === "string"
        ? JSON.parse(v)
        : canonical(v);
    }
    return out;
  }
  return value ?? null;
}

/** A value of the cases with its states' parts parsed, as `canonical` gives them. */
const expected = (value) =>
  canonical(JSON.parse(JSON.stringify(value), (k, v) =>
    (k === "partial" || k === "completed") && typeof v === "string" ? JSON.parse(v) : v));

/** The point a step names: a version, or the version of an entry of the last listing. */
const point = (s, listed) =>
  "at_history" in s
    ? { tag: "version", val: listed[s.at_history].version }
    : { tag: "version", val: BigInt(s.version) };

/** A state of the cases as the host takes it. */
const state = (s) => ({ stateId: s.state_id, partial: s.partial, completed: s.completed });

const equal = (a, b) => JSON.stringify(sorted(a)) === JSON.stringify(sorted(b));
function sorted(v) {
  if (Array.isArray(v)) return v.map(sorted);
  if (v && typeof v === "object") {
    return Object.fromEntries(Object.keys(v).sort().map((k) => [k, sorted(v[k])]));
  }
  return v;
}

async function step(stores, locks, listed, s) {
  const store = stores[s.store ?? "a"];
  switch (s.op) {
    case "get": return store.get(s.state_id);
    case "set": return store.set(state(s.state));
    case "update": return store.update(state(s.state));
    case "delete": return store.delete(s.state_id);
    case "clear": return store.clear(s.state_id);
    case "state_ids": return store.stateIds(s.pattern ?? undefined);
    case "get_all": return store.getAll(s.pattern ?? undefined);
    case "set_all": return store.setAll(s.states.map(state));
    case "clear_all": return store.clearAll();
    case "lock_info": return store.lockInfo(s.state_id);
    case "force_unlock": return store.forceUnlock(s.state_id);
    case "acquire_lock": locks[s.lock] = await store.acquireLock(s.state_id); return undefined;
    case "release": return locks[s.lock].release();
    case "renew": return locks[s.lock].renew();
    case "set_locked": return store.setLocked(state(s.state), locks[s.lock]);
    case "delete_locked": return store.deleteLocked(locks[s.lock]);
    case "clear_streams_locked": return store.clearStreamsLocked(s.streams, locks[s.lock]);
    case "restore_locked": return store.restoreLocked(point(s, listed), locks[s.lock]);
    case "get_at": return (await store.getAt(s.state_id, point(s, listed))).state ?? null;
    case "history": {
      listed.splice(0, listed.length, ...(await store.history(s.state_id, s.limit)));
      return listed;
    }
    case "migrate": return store.migrate();
    default: throw new Error(`the cases name an operation this runner lacks: ${s.op}`);
  }
}

/** How the case's table differs from its `rows`, read with SQL of this runner's own rather than
 * through the host: the newest row of each id (`FINAL`), but for a delete's tombstone (both parts
 * NULL), sorted by id. A table never created holds none. */
/** The case's tables that exist, from `system.tables`, as an error; null when there are none. */
async function tablesCreated({ schema, table }) {
  const body = await rawQuery(
    `SELECT name FROM system.tables WHERE database = '${schema}' AND startsWith(name, '${table}') ORDER BY name`,
  );
  if (body.error) return `system.tables: ${body.error}`;
  const names = body.text.split("\n").filter(Boolean);
  return names.length ? `a failed open created ${names.join(", ")}` : null;
}

/** Runs SQL on the ClickHouse under test over plain HTTP: its text, or the error. */
async function rawQuery(sql) {
  const response = await fetch(`${url.protocol}//${url.host}/`, {
    method: "POST",
    headers: {
      "X-ClickHouse-User": decodeURIComponent(url.username) || "default",
      "X-ClickHouse-Key": decodeURIComponent(url.password),
    },
    body: sql,
  });
  const text = await response.text();
  return response.ok ? { text } : { error: `HTTP ${response.status}: ${text}` };
}

async function rowsDiffer(c, { schema, table }) {
  if (!("rows" in c)) return "the case has no `rows`";
  const sql = `SELECT state_id, ifNull(partial_state, '') AS partial, ifNull(completed_state, '') AS completed
    FROM ${schema}.${table} FINAL WHERE NOT (partial_state IS NULL AND completed_state IS NULL)
    ORDER BY state_id FORMAT JSONEachRow`;
  const response = await fetch(`${url.protocol}//${url.host}/`, {
    method: "POST",
    headers: {
      "X-ClickHouse-User": decodeURIComponent(url.username) || "default",
      "X-ClickHouse-Key": decodeURIComponent(url.password),
    },
    body: sql,
  });
  const body = await response.text();
  if (!response.ok && !body.includes("UNKNOWN_TABLE")) return `rows: HTTP ${response.status}: ${body}`;
  const parse = (text) => { try { return JSON.parse(text); } catch { return text; } };
  const got = (response.ok ? body.split("\n").filter(Boolean) : [])
    .map((line) => JSON.parse(line))
    .map((r) => ({ state_id: r.state_id, partial: parse(r.partial), completed: parse(r.completed) }));
  const want = expected(c.rows);
  return equal(got, want) ? null : `rows: expected ${JSON.stringify(want)}, got ${JSON.stringify(got)}`;
}

async function runCase(c, n) {
  const settings = { schema: "conformance", table: `node_${run}_${n}` };
  const names = new Set(["a", ...Object.keys(c.settings ?? {}), ...(c.steps ?? []).map((s) => s.store ?? "a")]);
  const stores = {};
  try {
    for (const name of names) {
      try {
        stores[name] = await open(url.href, { ...settings, ...(c.settings?.[name] ?? {}) }, {
          allowLoopback: loopback,
          component,
        });
        if (c.open_error) return `opened, expected ${c.open_error}`;
      } catch (e) {
        // Bad input changes nothing: the rows are checked all the same.
        if (c.open_error && e instanceof BackendError && e.kind === c.open_error) {
          // Bad input changes nothing: not even the schema is created.
          return (await tablesCreated(settings)) ?? (await rowsDiffer(c, settings));
        }
        throw e;
      }
    }
    const locks = {};
    const listed = [];
    for (const [i, s] of (c.steps ?? []).entries()) {
      let got;
      try {
        got = canonical(await step(stores, locks, listed, s));
      } catch (e) {
        if (!(e instanceof BackendError)) throw e;
        if (s.error === e.kind) continue;
        return `step ${i + 1} (${s.op}): ${e.kind}: ${e.message}`;
      }
      if (s.error) return `step ${i + 1} (${s.op}): expected ${s.error}, got ${JSON.stringify(got)}`;
      const want = "expect" in s ? expected(s.expect) : undefined;
      if ("expect" in s && !equal(got, want)) {
        return `step ${i + 1} (${s.op}): expected ${JSON.stringify(want)}, got ${JSON.stringify(got)}`;
      }
      if ("expect_ops" in s && !equal(got.map((e) => e.op), s.expect_ops)) {
        return `step ${i + 1} (${s.op}): ops ${JSON.stringify(got.map((e) => e.op))}, expected ${JSON.stringify(s.expect_ops)}`;
      }
      if ("expect_replaced" in s && !equal(got.replaced, expected(s.expect_replaced))) {
        return `step ${i + 1} (${s.op}): replaced ${JSON.stringify(got.replaced)}, expected ${JSON.stringify(expected(s.expect_replaced))}`;
      }
      for (const [k, v] of Object.entries(s.expect_fields ?? {})) {
        if (!got || !equal(got[k], v)) return `step ${i + 1} (${s.op}): ${k} is ${JSON.stringify(got?.[k])}, expected ${JSON.stringify(v)}`;
      }
    }
    return await rowsDiffer(c, settings);
  } finally {
    for (const store of Object.values(stores)) await store.close().catch(() => {});
  }
}

let failed = 0;
let ran = 0;
for (const [n, c] of cases.entries()) {
  if (only && !c.name.includes(only)) continue;
  ran++;
  const problem = await runCase(c, n).catch((e) => `${e?.stack ?? e}`);
  console.log(`${problem ? "FAIL" : "ok  "} ${c.name}${problem ? `: ${problem}` : ""}`);
  if (problem) failed++;
}
console.log(`node host: ${ran - failed} of ${ran} conformance cases passed`);
process.exit(failed || ran === 0 ? 1 : 0);
