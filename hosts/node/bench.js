// One batch of the side-by-side benchmark (tests/benches/hosts.rs runs it between batches of the
// Rust host): `node bench.js URI SCHEMA TABLE COUNT` times COUNT calls of each operation through
// this host and prints {"op": [ms, ...]} as one line of JSON.

import { open } from "./src/index.js";

const [uri, schema, table, count] = process.argv.slice(2);
const n = Number(count);
const store = await open(uri, { schema, table, lock_linger_seconds: "5" }, { allowLoopback: true });
const state = (i) => ({ stateId: "bench", partial: "{}", completed: `{"singer_state":{"bookmarks":{"orders":{"id":${i}}}}}` });
const partial = (i) => ({ stateId: "bench", partial: `{"singer_state":{"bookmarks":{"orders":{"id":${i}}}}}`, completed: "{}" });

// Warm: the first calls open the connection and, for update, take the lock it then keeps.
await store.set(state(0));
await store.update(partial(0));
await store.get("bench");

const operations = {
  get: () => store.get("bench"),
  set: (i) => store.set(state(i)),
  update: (i) => store.update(partial(i)),
  state_ids: () => store.stateIds(),
};
const samples = {};
for (const [op, call] of Object.entries(operations)) {
  samples[op] = [];
  for (let i = 1; i <= n; i++) {
    const started = process.hrtime.bigint();
    await call(i);
    samples[op].push(Number(process.hrtime.bigint() - started) / 1e6);
  }
}
await store.close();
console.log(JSON.stringify(samples));
