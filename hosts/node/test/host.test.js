// This host's own cases (the shared ones are in ../conformance.js): its egress policy and how a
// reset connection is retried. Every connection here is to 127.0.0.1, refused or not.

import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { createServer } from "node:net";
import { test } from "node:test";
import { classify } from "../src/policy.js";
import { open } from "../src/index.js";

test("addresses are classed as the Rust host classes them (the shared table)", () => {
  const table = JSON.parse(
    readFileSync(new URL("../../../tests/conformance/addresses.json", import.meta.url), "utf8"),
  ).addresses;
  assert.ok(Object.keys(table).length > 30);
  for (const [ip, kind] of Object.entries(table)) assert.equal(classify(ip), kind, ip);
});

/** A server on 127.0.0.1 that counts connections and resets each one. */
async function resettingServer() {
  const server = createServer((socket) => {
    server.accepted++;
    socket.resetAndDestroy();
  });
  server.accepted = 0;
  await new Promise((resolve) => server.listen(0, "127.0.0.1", resolve));
  return server;
}

test("a name is refused by the address it resolves to, and the message says so", async () => {
  const store = await open("clickhouse://default:@localhost:1/default", { retries: "0" });
  try {
    await assert.rejects(store.get("x"), (e) => e.kind === "unreachable" && /address is refused/.test(e.message));
  } finally {
    await store.close();
  }
});

test("loopback is refused unless allowed, before any connection", async () => {
  const server = await resettingServer();
  const uri = `clickhouse://default:@127.0.0.1:${server.address().port}/default`;
  const store = await open(uri, { retries: "0" });
  try {
    await assert.rejects(store.get("x"), (e) => {
      assert.equal(e.kind, "unreachable");
      assert.match(e.message, /address is refused/);
      return true;
    });
    assert.equal(server.accepted, 0, "no connection was made");
  } finally {
    await store.close();
    server.close();
  }
});

test("a server that resets every connection is tried again", async () => {
  const server = await resettingServer();
  const uri = `clickhouse://default:@127.0.0.1:${server.address().port}/default`;
  const store = await open(uri, { retries: "5", retry_backoff_seconds: "0.01" }, { allowLoopback: true });
  try {
    // The shim words a reset as an HTTP protocol error: tried again until it repeats three
    // times in a row (the guest's GARBLED_TRIES), where it gave up after one before.
    await assert.rejects(store.get("x"), (e) => e.kind === "unreachable" && /3 times in a row/.test(e.message));
    assert.equal(server.accepted, 3);
  } finally {
    await store.close();
    server.close();
  }
});

/** The ClickHouse under test, by name where it is this machine's: a name's request goes to the
 * address the policy checked. */
function clickhouse() {
  const url = new URL(process.env.CLICKHOUSE_URL ?? "http://default:@127.0.0.1:8123");
  if (url.hostname === "127.0.0.1") url.hostname = "localhost";
  if (url.pathname === "/" || url.pathname === "") url.pathname = "/default";
  return url.href;
}

test("a store closed, a lock given back twice, a lock of another store", async () => {
  const uri = clickhouse();
  const settings = { schema: "node_api", table: `t_${process.pid}` };
  const a = await open(uri, settings, { allowLoopback: true });
  const b = await open(uri, settings, { allowLoopback: true });
  try {
    const lock = await a.acquireLock("x");
    await assert.rejects(
      b.setLocked({ stateId: "x", partial: "{}", completed: "{}" }, lock),
      (e) => e.kind === "invalid-input" && /another store/.test(e.message),
    );
    await lock.release();
    await lock.release(); // no error: given back already
    assert.equal(await b.lockInfo("x"), null);
  } finally {
    await a.close();
    await b.close();
  }
  await a.close(); // closing again does nothing
  await assert.rejects(a.get("x"), (e) => e.kind === "host" && /gone/.test(e.message));
});
