// This host's own cases (the shared ones are in ../conformance.js): its egress policy and how a
// reset connection is retried. Every connection here is to 127.0.0.1, refused or not.

import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import { mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { PassThrough } from "node:stream";
import { fileURLToPath } from "node:url";
import { connect, createServer } from "node:net";
import { test } from "node:test";
import { destinations, errorCode, release, splitAuthority } from "../src/egress.js";
import { CONTRACT_VERSION } from "../src/glue.js";
import { check, classify } from "../src/policy.js";
import { open } from "../src/index.js";

test("addresses are classed as the Rust host classes them (the shared table)", () => {
  const table = JSON.parse(
    readFileSync(new URL("../../../tests/conformance/addresses.json", import.meta.url), "utf8"),
  ).addresses;
  assert.ok(Object.keys(table).length > 30);
  for (const [ip, kind] of Object.entries(table)) assert.equal(classify(ip), kind, ip);
});

test("the glue is for the contract's version in wit/", () => {
  const wit = readFileSync(new URL("../../../wit/state-backend.wit", import.meta.url), "utf8");
  assert.equal(/^package meltano:state-backend@([^;]+);/m.exec(wit)?.[1], CONTRACT_VERSION);
});

test("one refused address refuses the request, whichever a connection would use", () => {
  const rules = { allowLoopback: false, refusePrivate: true };
  assert.equal(check(["8.8.8.8"], rules), null);
  assert.match(check(["8.8.8.8", "127.0.0.1"], rules), /127.0.0.1: loopback/);
  assert.match(check(["::ffff:10.1.2.3", "8.8.8.8"], rules), /private networks/);
  assert.match(check(["fe80::1"], { allowLoopback: true }), /link-local/);
  assert.match(check([], rules), /no address/);
  assert.equal(check(["127.0.0.1"], { allowLoopback: true }), null);
});

test("Node's errors are the contract's error codes", () => {
  const code = (c) => errorCode(Object.assign(new Error(c), { code: c })).tag;
  assert.equal(code("ECONNRESET"), "connection-terminated");
  assert.equal(code("EPIPE"), "connection-terminated");
  assert.equal(code("ECONNREFUSED"), "connection-refused");
  assert.equal(code("ENOTFOUND"), "DNS-error");
  assert.equal(code("HPE_INVALID_CONSTANT"), "HTTP-protocol-error");
  assert.equal(code("DEPTH_ZERO_SELF_SIGNED_CERT"), "TLS-certificate-error");
  assert.equal(code("ERR_TLS_CERT_ALTNAME_INVALID"), "TLS-certificate-error");
  assert.equal(code("ERR_SSL_WRONG_VERSION_NUMBER"), "TLS-protocol-error");
  assert.equal(code("ESOMETHINGELSE"), "internal-error");
  assert.deepEqual(splitAuthority("[::1]:8123"), ["::1", "8123"]);
  assert.deepEqual(splitAuthority("h.example:8443"), ["h.example", "8443"]);
  assert.deepEqual(splitAuthority("h.example"), ["h.example", ""]);
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

test("a server that resets every connection is tried with the whole budget", async () => {
  const server = await resettingServer();
  const uri = `clickhouse://default:@127.0.0.1:${server.address().port}/default`;
  const store = await open(uri, { retries: "5", retry_backoff_seconds: "0.01" }, { allowLoopback: true });
  try {
    // A reset is connection-terminated, as in the Rust host: the first try and 5 retries.
    await assert.rejects(store.get("x"), (e) => {
      assert.equal(e.kind, "unreachable");
      assert.match(e.message, /connection closed by the server \(tried 6 times/);
      return true;
    });
    assert.equal(server.accepted, 6);
  } finally {
    await store.close();
    server.close();
  }
});

test("a server that does not speak HTTP is given up after three garbled answers", async () => {
  const server = createServer((socket) => {
    server.accepted++;
    socket.end("SSH-2.0-OpenSSH_9.2\r\n\r\n");
  });
  server.accepted = 0;
  await new Promise((resolve) => server.listen(0, "127.0.0.1", resolve));
  const uri = `clickhouse://default:@127.0.0.1:${server.address().port}/default`;
  const store = await open(uri, { retries: "5", retry_backoff_seconds: "0.01" }, { allowLoopback: true });
  try {
    // HTTP-protocol-error: the guest's GARBLED_TRIES, not the budget.
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

/** A server on `host` that keeps the first bytes of each connection, then closes it. */
async function recordingServer(host = "127.0.0.1") {
  const server = createServer((socket) => {
    socket.once("data", (bytes) => {
      server.seen.push(bytes);
      socket.destroy();
    });
  });
  server.seen = [];
  await new Promise((resolve) => server.listen(0, host, resolve));
  return server;
}

/** A relay on `host` to the ClickHouse under test that keeps each connection's first bytes. */
async function relay(host) {
  const real = new URL(process.env.CLICKHOUSE_URL ?? "http://default:@127.0.0.1:8123");
  const server = createServer((socket) => {
    const upstream = connect(Number(real.port || 8123), real.hostname.replace(/^\[|\]$/g, ""));
    socket.once("data", (bytes) => server.seen.push(bytes));
    socket.pipe(upstream).pipe(socket);
    socket.on("error", () => upstream.destroy());
    upstream.on("error", () => socket.destroy());
  });
  server.seen = [];
  const listening = await new Promise((resolve) => {
    server.once("error", () => resolve(false));
    server.listen(0, host, () => resolve(true));
  });
  const user = `${real.username || "default"}:${real.password}`;
  return listening ? Object.assign(server, { user }) : null;
}

test("a name from the host's table goes to the address checked, over http and https", async () => {
  // `localhost` is mapped to 127.0.0.2, where only the relay listens: a request that reaches
  // it went where the table, checked by the policy, said, and was not resolved again at
  // connect (the system's localhost is 127.0.0.1, where nothing listens on this port).
  const resolve = { LocalHost: ["127.0.0.2"] };
  const plainRelay = await relay("127.0.0.2");
  const port = plainRelay.address().port;
  const plain = await open(
    `clickhouse://${plainRelay.user}@localhost:${port}/default`,
    { schema: "node_api", table: `pinned_${process.pid}`, retries: "0" },
    { allowLoopback: true, resolve },
  );
  try {
    await plain.migrate();
    await plain.set({ stateId: "pinned", partial: "{}", completed: '{"singer_state":{"a":1}}' });
    assert.equal((await plain.get("pinned")).completed, '{"singer_state":{"a":1}}');
    assert.ok(plainRelay.seen.length >= 1);
    assert.match(plainRelay.seen[0].toString("latin1"), new RegExp(`\r\nHost: localhost:${port}\r\n`));
  } finally {
    await plain.close();
    plainRelay.close();
  }

  const server = await recordingServer("127.0.0.2");
  const secure = await open(
    `clickhouse://default:@localhost:${server.address().port}/default?secure=true`,
    { retries: "0" },
    { allowLoopback: true, resolve },
  );
  try {
    await assert.rejects(secure.get("x"), (e) => e.kind === "unreachable");
    assert.equal(server.seen.length, 1, "one connection, to the address checked");
    const hello = server.seen[0];
    assert.equal(hello[0], 0x16, "a TLS handshake");
    assert.ok(hello.includes(Buffer.from("localhost")), "the name is kept for the certificate (SNI)");
  } finally {
    await secure.close();
    server.close();
  }
});

test("every address of a name is checked, the table's as the resolver's", async () => {
  // No connection here: what a request may go to, decided.
  const rules = (allowLoopback, table) => ({ allowLoopback, refusePrivate: false, resolve: new Map(table) });
  const table = [["two.test", ["127.0.0.2", "169.254.169.254"]], ["one.test", ["127.0.0.2"]]];
  await assert.rejects(destinations("two.test", rules(true, table)), { tag: "destination-IP-prohibited" });
  await assert.rejects(destinations("ONE.test", rules(false, table)), { tag: "destination-IP-prohibited" });
  assert.deepEqual(await destinations("One.Test", rules(true, table)), ["127.0.0.2"]);
  await assert.rejects(destinations("none.test", rules(true, [["none.test", []]])), (e) => e.tag === "DNS-error");
  await assert.rejects(destinations("::ffff:169.254.169.254%lo", rules(true, [])), { tag: "destination-IP-prohibited" });
  await assert.rejects(destinations("localhost", rules(false, [])), { tag: "destination-IP-prohibited" });
  assert.ok((await destinations("localhost", rules(true, []))).length >= 1);
  await assert.rejects(
    open("clickhouse://default:@a.test/default", {}, { resolve: { "a.test": ["::ffff:127.0.0.1%lo"] } }),
    (e) => e.kind === "invalid-config" && /zone/.test(e.message),
  );
  await assert.rejects(
    open("clickhouse://default:@a.test/default", {}, { resolve: { "a.test": ["not an address"] } }),
    (e) => e.kind === "invalid-config" && /resolve/.test(e.message),
  );
});

test("header bytes go as they are, with the authority as Host", async () => {
  const server = await recordingServer();
  const port = server.address().port;
  const store = await open(`clickhouse://default:p%C3%A4ss@127.0.0.1:${port}/default`, { retries: "0" }, { allowLoopback: true });
  try {
    await assert.rejects(store.get("x"));
    const head = server.seen[0];
    assert.ok(head.includes(Buffer.from("X-ClickHouse-Key: p\u00e4ss\r\n", "utf8")), head.toString("latin1"));
    assert.ok(head.includes(Buffer.from(`Host: 127.0.0.1:${port}\r\n`)), head.toString("latin1"));
  } finally {
    await store.close();
    server.close();
  }
});

test("a released body lets the writes waiting on it finish", { timeout: 5000 }, async () => {
  const body = new PassThrough();
  // Past the buffer, unread: the write's callback waits, as the component's flush does.
  const waiting = new Promise((resolve) => body.write(Buffer.alloc(64 * 1024), resolve));
  release(body);
  await waiting;
  await new Promise((resolve) => setImmediate(resolve));
  assert.ok(body.destroyed);
});

test("a component of another contract version is refused, and the output is left alone", async () => {
  const wasm = readFileSync(new URL("../../../target/wasm32-wasip2/release-guest/clickhouse_state.wasm", import.meta.url));
  const text = wasm.toString("latin1");
  const patched = Buffer.from(text.replaceAll(`state-backend/clock@${CONTRACT_VERSION}`, "state-backend/clock@9.9.9"), "latin1");
  assert.notEqual(Buffer.compare(patched, wasm), 0, "the version is in the component");
  const dir = mkdtempSync(join(tmpdir(), "node-host-build-"));
  try {
    writeFileSync(join(dir, "other.wasm"), patched);
    mkdirSync(join(dir, "out"));
    writeFileSync(join(dir, "out", "kept.txt"), "kept");
    const build = fileURLToPath(new URL("../build.js", import.meta.url));
    const run = spawnSync(process.execPath, [build, join(dir, "other.wasm"), join(dir, "out")], { encoding: "utf8" });
    assert.equal(run.status, 1, run.stderr);
    assert.match(run.stderr, /9\.9\.9/);
    assert.deepEqual(readdirSync(join(dir, "out")), ["kept.txt"]);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

test("an IPv6 authority reaches its server", async (t) => {
  const v6 = await relay("::1");
  if (v6 === null) {
    t.skip("this machine has no ::1");
    return;
  }
  const port = v6.address().port;
  const store = await open(
    `clickhouse://${v6.user}@[::1]:${port}/default`,
    { schema: "node_api", table: `v6_${process.pid}` },
    { allowLoopback: true },
  );
  try {
    await store.migrate();
    await store.set({ stateId: "v6", partial: "{}", completed: "{}" });
    assert.deepEqual(await store.stateIds("v6"), ["v6"]);
    assert.match(v6.seen[0].toString("latin1"), new RegExp(`\r\nHost: \\[::1\\]:${port}\r\n`));
  } finally {
    await store.close();
    v6.close();
  }
});

test("a large body is sent whole, and a refused one does not keep the component waiting", async () => {
  // Over the stream's 16 KiB, so that the component waits on the body to drain.
  const big = JSON.stringify({ singer_state: { bookmarks: { s: { blob: "x".repeat(300_000) } } } });
  const store = await open(clickhouse(), { schema: "node_api", table: `big_${process.pid}` }, { allowLoopback: true });
  try {
    await store.migrate();
    await store.set({ stateId: "big", partial: "{}", completed: big });
    assert.equal((await store.get("big")).completed, big);
  } finally {
    await store.close();
  }
  const server = await recordingServer();
  const refused = await open(`clickhouse://default:@127.0.0.1:${server.address().port}/default`, { retries: "0" });
  try {
    await assert.rejects(
      refused.set({ stateId: "big", partial: "{}", completed: big }),
      (e) => e.kind === "unreachable" && /address is refused/.test(e.message),
    );
    assert.equal(server.seen.length, 0);
  } finally {
    await refused.close();
    server.close();
  }
});
