// One store's thread: the component runs here, synchronously (its clock sleeps block this
// thread, not the caller's). Calls come as messages, one at a time; answers go back the same way.

import { parentPort, workerData } from "node:worker_threads";
import { _setArgs, _setEnv } from "@bytecodealliance/preview2-shim/cli";

// The component gets no environment and no arguments, as in the Rust host: the shim would
// otherwise hand it this process's, secrets included.
_setEnv({});
_setArgs([]);

const { backend } = await import(workerData.component);

let store = null;
const locks = new Map();
let nextLock = 1;

/** The lock object a message names by number. */
function lock(handle) {
  const found = locks.get(handle);
  if (!found) throw { kind: "invalid-input", message: `no lock ${handle} is held here` };
  return found;
}

/** The component's operations by name: each takes the message's arguments. */
const operations = {
  open: (uri, settings) => {
    store = backend.Store.open(uri, settings);
  },
  get: (id) => store.get(id) ?? null,
  set: (state) => store.set(state),
  update: (state) => store.update(state),
  delete: (id) => store.delete(id),
  clear: (id) => store.clear(id),
  stateIds: (pattern) => store.stateIds(pattern ?? undefined),
  getAll: (pattern) => store.getAll(pattern ?? undefined),
  setAll: (states) => store.setAll(states),
  clearAll: () => store.clearAll(),
  acquireLock: (id) => {
    const held = store.acquireLock(id);
    const handle = nextLock++;
    locks.set(handle, held);
    return { handle, stateId: held.stateId(), token: held.token() };
  },
  lockInfoOf: (handle) => lock(handle).info(),
  renew: (handle) => lock(handle).renew(),
  // Giving back a lock given back already is no error (the WIT's `release`); the handle goes
  // only once the release succeeded, so a failed one can be tried again.
  release: (handle) => {
    const held = locks.get(handle);
    if (!held) return;
    held.release();
    locks.delete(handle);
  },
  setLocked: (state, handle) => store.setLocked(state, lock(handle)),
  deleteLocked: (handle) => store.deleteLocked(lock(handle)),
  lockInfo: (id) => store.lockInfo(id) ?? null,
  forceUnlock: (id) => store.forceUnlock(id),
  history: (id, limit) => store.history(id, limit),
  getAt: (id, point) => store.getAt(id, point),
  restoreLocked: (point, handle) => store.restoreLocked(point, lock(handle)),
  clearStreamsLocked: (streams, handle) => store.clearStreamsLocked(streams, lock(handle)),
  migrate: () => store.migrate(),
  schema: () => store.schema(),
  idle: () => store.idle() ?? null,
  close: () => {
    for (const held of locks.values()) held[Symbol.dispose]?.();
    locks.clear();
    store?.close();
    store = null;
  },
};

/** A thrown value as a message: the contract's error (its kind and detail), or the host's. */
function failure(e) {
  if (e && Object.hasOwn(e, "payload")) {
    const { tag, val } = e.payload;
    return typeof val === "string"
      ? { kind: tag, message: val }
      : { kind: tag, message: JSON.stringify(val, (_, v) => (typeof v === "bigint" ? `${v}` : v)), detail: val };
  }
  if (e && typeof e.kind === "string") return e;
  return { kind: "host", message: e instanceof Error ? e.message : String(e) };
}

parentPort.on("message", ({ id, op, args }) => {
  const operation = Object.hasOwn(operations, op) ? operations[op] : undefined;
  try {
    if (!operation) throw { kind: "invalid-input", message: `no operation ${op}` };
    if (op !== "open" && store === null) throw { kind: "invalid-input", message: "the store is closed" };
    parentPort.postMessage({ id, ok: true, value: operation(...args) });
  } catch (e) {
    parentPort.postMessage({ id, ok: false, error: failure(e) });
  }
});
