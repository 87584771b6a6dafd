// One batch of the side-by-side benchmark (tests/benches/hosts.rs runs it between batches of the
// Rust host): `node bench.js URI SCHEMA TABLE COUNT` times COUNT calls of each operation through
// this host and prints {"op": [ms, ...]} as one line of JSON. Two parts of the path are timed
// alone as well: one synchronous call to the shim's IO worker (`shim_call`: a call that does
// nothing there), and one message to a store's Worker and back (`worker_message`: an operation
// the Worker refuses at once).

import { callExtension } from "@bytecodealliance/preview2-shim/io-worker";
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
const nothing = new URL("data:text/javascript,export default () => () => 0");
callExtension(nothing, "nothing", []);
samples.shim_call = [];
samples.worker_message = [];
for (let i = 1; i <= n; i++) {
  let started = process.hrtime.bigint();
  callExtension(nothing, "nothing", []);
  samples.shim_call.push(Number(process.hrtime.bigint() - started) / 1e6);
  started = process.hrtime.bigint();
  await store.call("nothing").catch(() => {});
  samples.worker_message.push(Number(process.hrtime.bigint() - started) / 1e6);
}
await store.close();
console.log(JSON.stringify(samples));
