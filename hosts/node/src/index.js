// The Node host's API: one Worker per store, where the component runs; every call is a message
// to it and a promise of its answer. The types are in index.d.ts, over the ones jco generates
// from the WIT (gen/).

import { readFileSync } from "node:fs";
import { isIP } from "node:net";
import { createSecureContext } from "node:tls";
import { Worker } from "node:worker_threads";
import { fileURLToPath } from "node:url";

const WORKER = fileURLToPath(new URL("./worker.js", import.meta.url));
/** The transpiled component (`just node-host` writes it). */
export const DEFAULT_COMPONENT = fileURLToPath(new URL("../gen/clickhouse_state.js", import.meta.url));

/** A failure of the contract (`kind` is its error case: "locked", "unreachable"...), or of
 * this host ("host"). */
export class BackendError extends Error {
  constructor({ kind, message, detail }) {
    super(`${kind}: ${message}`);
    this.name = "BackendError";
    this.kind = kind;
    this.detail = detail;
  }
}

/** Opens a store: `settings` as the component takes them (`{ table: "state" }`); `options`:
 * `allowLoopback`, `refusePrivate`, `resolve` (names to addresses, ahead of the system
 * resolver), `caBundle`, `clientCert`, `clientKey` (PEM files), `logLevel` ("warn"),
 * `component` (a transpiled module). */
export async function open(uri, settings = {}, options = {}) {
  const worker = new Worker(WORKER, {
    workerData: {
      component: options.component ?? DEFAULT_COMPONENT,
      allowLoopback: options.allowLoopback ?? false,
      refusePrivate: options.refusePrivate ?? false,
      resolve: names(options.resolve),
      tls: tlsFiles(options),
      logLevel: options.logLevel ?? "warn",
    },
  });
  const store = new Store(worker);
  try {
    await store.call("open", uri, Object.entries(settings ?? {}).map(([k, v]) => [k, String(v)]));
  } catch (e) {
    await worker.terminate();
    throw e;
  }
  return store;
}

/** The TLS options' files, read here so that a bad path is an error of `open`, naming the
 * option (never a file's content): `caBundle`, PEM certificates to trust besides the system's
 * (a private CA); `clientCert` and `clientKey`, PEM, for mutual TLS. */
function tlsFiles({ caBundle, clientCert, clientKey }) {
  if (Boolean(clientCert) !== Boolean(clientKey)) {
    throw new BackendError({ kind: "invalid-config", message: "mutual TLS needs both clientCert and clientKey" });
  }
  const read = (option, path, marker) => {
    let text;
    try {
      text = readFileSync(path, "utf8");
    } catch (e) {
      throw new BackendError({ kind: "invalid-config", message: `${option} ${path}: cannot read it (${e.code ?? e.message})` });
    }
    if (!text.includes(marker)) {
      throw new BackendError({ kind: "invalid-config", message: `${option} ${path}: no PEM ${marker.toLowerCase()} in it` });
    }
    return text;
  };
  const files = {
    ca: caBundle ? read("caBundle", caBundle, "CERTIFICATE") : null,
    cert: clientCert ? read("clientCert", clientCert, "CERTIFICATE") : null,
    key: clientKey ? read("clientKey", clientKey, "PRIVATE KEY") : null,
  };
  try {
    createSecureContext({ ca: files.ca ?? undefined, cert: files.cert ?? undefined, key: files.key ?? undefined });
  } catch (e) {
    // OpenSSL's reason names no content of the files.
    throw new BackendError({ kind: "invalid-config", message: `the TLS files are not usable together: ${e.message}` });
  }
  return files;
}

/** The `resolve` option checked, as a Map from lower-case name to its addresses. An address
 * takes no zone (`%eth0`): the policy classes addresses, not interfaces. */
function names(table) {
  if (table === undefined || table === null) return null;
  const out = new Map();
  for (const [name, addresses] of Object.entries(table)) {
    const list = Array.isArray(addresses) ? addresses : [addresses];
    if (list.length === 0 || !list.every((a) => typeof a === "string" && isIP(a) && !a.includes("%"))) {
      throw new BackendError({ kind: "invalid-config", message: `resolve: ${name} needs IP addresses, without a zone` });
    }
    out.set(name.toLowerCase(), list);
  }
  return out;
}

export class Store {
  #worker;
  #pending = new Map();
  #next = 1;
  /** Why the worker is gone (closed, crashed), once it is: every call then fails at once. */
  #dead = null;

  constructor(worker) {
    this.#worker = worker;
    worker.on("message", ({ id, ok, value, error }) => {
      const waiting = this.#pending.get(id);
      this.#pending.delete(id);
      if (ok) waiting?.resolve(value);
      else waiting?.reject(new BackendError(error));
    });
    worker.on("error", (e) => this.#failAll(e));
    worker.on("exit", (code) => this.#failAll(new Error(`the store's worker exited (${code})`)));
  }

  #failAll(cause) {
    this.#dead ??= cause.message;
    for (const { reject } of this.#pending.values()) {
      reject(new BackendError({ kind: "host", message: cause.message }));
    }
    this.#pending.clear();
  }

  /** One operation of the component, by name (see src/worker.js). */
  call(op, ...args) {
    if (this.#dead !== null) {
      return Promise.reject(new BackendError({ kind: "host", message: `the store is gone: ${this.#dead}` }));
    }
    const id = this.#next++;
    return new Promise((resolve, reject) => {
      this.#pending.set(id, { resolve, reject });
      this.#worker.postMessage({ id, op, args });
    });
  }

  get(stateId) { return this.call("get", stateId); }
  set(state) { return this.call("set", state); }
  update(state) { return this.call("update", state); }
  delete(stateId) { return this.call("delete", stateId); }
  clear(stateId) { return this.call("clear", stateId); }
  stateIds(pattern) { return this.call("stateIds", pattern ?? null); }
  getAll(pattern) { return this.call("getAll", pattern ?? null); }
  setAll(states) { return this.call("setAll", states); }
  clearAll() { return this.call("clearAll"); }
  lockInfo(stateId) { return this.call("lockInfo", stateId); }
  forceUnlock(stateId) { return this.call("forceUnlock", stateId); }
  history(stateId, limit = 20) { return this.call("history", stateId, limit); }
  getAt(stateId, point) { return this.call("getAt", stateId, point); }
  migrate() { return this.call("migrate"); }
  schema() { return this.call("schema"); }
  idle() { return this.call("idle"); }

  async acquireLock(stateId) {
    const { handle, token } = await this.call("acquireLock", stateId);
    return new Lock(this, handle, stateId, token);
  }
  async setLocked(state, lock) { return this.call("setLocked", state, this.#own(lock)); }
  async deleteLocked(lock) { return this.call("deleteLocked", this.#own(lock)); }
  async restoreLocked(point, lock) { return this.call("restoreLocked", point, this.#own(lock)); }
  async clearStreamsLocked(streams, lock) { return this.call("clearStreamsLocked", streams, this.#own(lock)); }

  /** A lock's handle, if it is this store's: handles are numbered per store. */
  #own(lock) {
    if (lock?.store !== this) {
      throw new BackendError({ kind: "invalid-input", message: "the lock is another store's" });
    }
    return lock.handle;
  }

  /** Gives back what the store holds and ends its worker; closing again does nothing. */
  async close() {
    if (this.#dead !== null) return;
    try {
      await this.call("close");
    } finally {
      this.#dead = "closed";
      await this.#worker.terminate();
    }
  }
}

/** A held lock: its id, fencing token, and what renews or gives it back. */
export class Lock {
  constructor(store, handle, stateId, token) {
    this.store = store;
    this.handle = handle;
    this.stateId = stateId;
    this.token = token;
  }
  info() { return this.store.call("lockInfoOf", this.handle); }
  renew() { return this.store.call("renew", this.handle); }
  release() { return this.store.call("release", this.handle); }
}
