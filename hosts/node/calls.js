// How many synchronous calls to the shim's IO worker each operation makes (for the side-by-side
// benchmark, tests/benches/hosts.rs): `node calls.js URI SCHEMA TABLE` prints {"op": calls, ...}.
// The shim prints each call when PREVIEW2_SHIM_DEBUG is set, so this runs itself again with it
// set and counts the lines between one operation's marks.

import { spawnSync } from "node:child_process";
import { fileURLToPath } from "node:url";

const OPERATIONS = ["set", "get", "update", "state_ids"];
const [uri, schema, table] = process.argv.slice(2);

if (process.env.PREVIEW2_SHIM_DEBUG) {
  const { open } = await import("./src/index.js");
  const store = await open(uri, { schema, table, lock_linger_seconds: "5" }, { allowLoopback: true });
  const state = { stateId: "calls", partial: "{}", completed: '{"singer_state":{"a":1}}' };
  const calls = {
    get: () => store.get("calls"),
    set: () => store.set(state),
    update: () => store.update({ ...state, partial: '{"singer_state":{"b":2}}', completed: "{}" }),
    state_ids: () => store.stateIds(),
  };
  // Each counted call follows one of its own, as in the benchmark's batches: the connection is
  // open and the update's lock held.
  for (const op of OPERATIONS) {
    await calls[op]();
    process._rawDebug(`MARK ${op}`);
    await calls[op]();
    process._rawDebug("MARK end");
  }
  await store.close();
} else {
  const child = spawnSync(process.execPath, [fileURLToPath(import.meta.url), uri, schema, table], {
    env: { ...process.env, PREVIEW2_SHIM_DEBUG: "1" },
    encoding: "utf8",
    maxBuffer: 64 << 20,
  });
  if (child.status !== 0) {
    console.error(child.stderr.split("\n").filter((l) => !/^\d+ /.test(l)).join("\n"));
    process.exit(1);
  }
  const counts = {};
  let op = null;
  for (const line of child.stderr.split("\n")) {
    const mark = /^MARK (\S+)$/.exec(line);
    if (mark) op = mark[1] === "end" ? null : mark[1];
    else if (op && /^\d+ [A-Z_]+ /.test(line)) counts[op] = (counts[op] ?? 0) + 1;
  }
  console.log(JSON.stringify(counts));
}
