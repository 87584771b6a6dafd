// This host's own cases (the shared ones are in ../conformance.js): its egress policy and how a
// reset connection is retried. Every connection here is to 127.0.0.1, refused or not.

import assert from "node:assert/strict";
import { createServer } from "node:net";
import { test } from "node:test";
import { classify } from "../src/policy.js";
import { open } from "../src/index.js";

test("addresses are classed as the Rust host classes them", () => {
  const cases = {
    "127.0.0.1": "loopback",
    "127.5.6.7": "loopback",
    "::1": "loopback",
    "::ffff:127.0.0.1": "loopback",
    "169.254.169.254": "metadata",
    "fd00:ec2::254": "metadata",
    "169.254.1.1": "link-local",
    "fe80::1": "link-local",
    "10.1.2.3": "private",
    "172.16.0.1": "private",
    "172.31.255.255": "private",
    "192.168.1.1": "private",
    "100.64.0.1": "private",
    "fc00::1": "private",
    "0.0.0.0": "unspecified",
    "::": "unspecified",
    "172.32.0.1": "public",
    "8.8.8.8": "public",
    "2001:db8::1": "public",
  };
  for (const [ip, kind] of Object.entries(cases)) assert.equal(classify(ip), kind, ip);
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
    await assert.rejects(store.get("x"), (e) => e.kind === "unreachable");
    // The shim words a reset as an HTTP protocol error: tried again until it repeats three
    // times in a row (the guest's GARBLED_TRIES), where it gave up after one before.
    assert.ok(server.accepted >= 3, `${server.accepted} connections`);
  } finally {
    await store.close();
    server.close();
  }
});
