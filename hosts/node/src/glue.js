// The component's own imports (meltano:state-backend/clock and /log): what a host supplies
// beside wasi:http. The component runs in a Worker (src/worker.js), so a blocking sleep blocks
// that thread only.

import { workerData } from "node:worker_threads";

/** The version of meltano:state-backend this glue is written for (build.js holds a component to
 * it, and the tests hold it to wit/state-backend.wit). */
export const CONTRACT_VERSION = "0.9.0";

const LEVELS = ["debug", "info", "warn", "error"];
const shown = LEVELS.indexOf(workerData?.logLevel ?? "warn");
const sleeper = new Int32Array(new SharedArrayBuffer(4));

export const clock = {
  nowMs() {
    return BigInt(Date.now());
  },
  sleepMs(ms) {
    // Nothing ever notifies it: the wait is the sleep.
    Atomics.wait(sleeper, 0, 0, Number(ms));
  },
};

export const log = {
  log(level, message) {
    if (LEVELS.indexOf(level) >= shown) {
      console.error(`${new Date().toISOString()} ${level.toUpperCase()} ${message}`);
    }
  },
};
