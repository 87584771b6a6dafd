// This host's own cases (the shared ones are in ../conformance.js): its egress policy and how a
// reset connection is retried. Every connection here is to 127.0.0.1, refused or not.

import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import { mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { PassThrough } from "node:stream";
import { fileURLToPath } from "node:url";
import { createServer as createHttpServer } from "node:http";
import { createServer as createHttpsServer } from "node:https";
import { createServer as createTlsServer } from "node:tls";
import { connect, createServer } from "node:net";
import { test as nodeTest } from "node:test";

/** The ClickHouse under test. */
const CLICKHOUSE = new URL(process.env.CLICKHOUSE_URL ?? "http://default:@127.0.0.1:8123");

/**
 * Skips a test only where the named variable allows it: a check that cannot run here fails,
 * unless `NODE_HOST_ALLOW_SKIP` lists its name (comma-separated: `127.0.0.2`, `ipv6`, `openssl`).
 */
function skipOnlyIfAllowed(t, name, why) {
  const allowed = (process.env.NODE_HOST_ALLOW_SKIP ?? "").split(",").map((s) => s.trim());
  if (!allowed.includes(name)) {
    assert.fail(`${why}: this check cannot run here (NODE_HOST_ALLOW_SKIP=${name} skips it)`);
  }
  t.skip(why);
}

/** Every test with a time limit: a call that never answers fails its test, not the run. */
const test = (name, options, fn) =>
  fn ? nodeTest(name, { timeout: 120_000, ...options }, fn) : nodeTest(name, { timeout: 120_000 }, options);
import createEgress, { destinations, errorCode, release, splitAuthority } from "../src/egress.js";
import { kept } from "../src/bodies.js";
import { CONTRACT_VERSION } from "../src/glue.js";
import { check, classify } from "../src/policy.js";
import { open } from "../src/index.js";

test("the tripwire stops what the policy lets through, and records it (in a process of its own)", () => {
  // Its own process and tripwire file: `just test-node` fails when this run's file has a trip.
  const dir = mkdtempSync(join(tmpdir(), "node-host-tripwire-"));
  const log = join(dir, "trips");
  const index = new URL("../src/index.js", import.meta.url).href;
  const script = `
    import { open } from ${JSON.stringify(index)};
    const seen = [];
    for (const uri of [
      "clickhouse://default:throwaway-pw-0000@10.255.255.1:8123/default",
      "clickhouse://default:@clickhouse.internal.example:8123/default",
    ]) {
      const store = await open(uri, { retries: "0" });
      try { await store.get("x"); seen.push("reached"); } catch (e) { seen.push(e.message); }
      await store.close();
    }
    console.log(JSON.stringify(seen));`;
  const file = join(dir, "trip.mjs");
  writeFileSync(file, script);
  try {
    const env = { ...process.env, NODE_HOST_TRIPWIRE: log, STATE_BACKEND_TRIPWIRE_ALLOW: "" };
    const run = spawnSync(process.execPath, [file], {
      env,
      encoding: "utf8",
      timeout: 60_000,
    });
    assert.equal(run.status, 0, run.stderr);
    const seen = JSON.parse(run.stdout.trim().split("\n").at(-1));
    assert.equal(seen.length, 2);
    for (const message of seen) assert.match(message, /tripwire: refused to leave this machine/);
    const trips = readFileSync(log, "utf8");
    assert.match(trips, /a connection to 10\.255\.255\.1/);
    assert.match(trips, /a lookup of the name clickhouse\.internal\.example/);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

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
  const url = new URL(CLICKHOUSE);
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
  const real = CLICKHOUSE;
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

/** An HTTP proxy on 127.0.0.1 to the ClickHouse under test. `decorate(res)` may add to each
 * answer; `early(req, res)` may answer a request itself, before reading its body (true); with
 * `tls` (node:https server options), it serves https. */
async function proxy(decorate, early = () => false, tls = null) {
  const real = CLICKHOUSE;
  const upstream = `${real.protocol}//${real.host}`;
  const handler = async (req, res) => {
    if (early(req, res)) {
      server.early++;
      return;
    }
    const chunks = [];
    for await (const chunk of req) chunks.push(chunk);
    const headers = { ...req.headers };
    for (const name of ["host", "connection", "transfer-encoding", "content-length"]) delete headers[name];
    const answer = await fetch(upstream + req.url, { method: req.method, headers, body: chunks.length ? Buffer.concat(chunks) : undefined });
    answer.headers.forEach((value, name) => {
      if (!["content-length", "transfer-encoding", "connection", "content-encoding", "keep-alive"].includes(name)) res.setHeader(name, value);
    });
    decorate?.(res);
    res.statusCode = answer.status;
    res.end(Buffer.from(await answer.arrayBuffer()));
    server.answered++;
  };
  const server = tls ? createHttpsServer(tls, handler) : createHttpServer(handler);
  server.early = 0;
  server.answered = 0;
  await new Promise((resolve) => server.listen(0, "127.0.0.1", resolve));
  const user = `${real.username || "default"}:${real.password}`;
  const secure = tls ? "?secure=true" : "";
  return Object.assign(server, { uri: `clickhouse://${user}@127.0.0.1:${server.address().port}/default${secure}` });
}

test("a name from the host's table goes to the address checked, over http and https", async (t) => {
  // `localhost` is mapped to 127.0.0.2, where only the relay listens: a request that reaches
  // it went where the table, checked by the policy, said, and was not resolved again at
  // connect (the system's localhost is 127.0.0.1, where nothing listens on this port).
  const resolve = { LocalHost: ["127.0.0.2"] };
  const plainRelay = await relay("127.0.0.2");
  if (plainRelay === null) {
    skipOnlyIfAllowed(t, "127.0.0.2", "127.0.0.2 is not this machine's (Linux routes all of 127/8 to loopback)");
    return;
  }
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
  // The resolver's answer, every address of it (a resolver standing in for the system's).
  const answers = (...list) => async () => list.map((address) => ({ address }));
  await assert.rejects(
    destinations("two.example", rules(true, []), answers("127.0.0.2", "169.254.169.254")),
    { tag: "destination-IP-prohibited" },
  );
  assert.deepEqual(await destinations("two.example", rules(true, []), answers("127.0.0.2", "::1")), ["127.0.0.2", "::1"]);
  await assert.rejects(destinations("none.example", rules(true, []), answers()), (e) => e.tag === "DNS-error");
  await assert.rejects(
    open("clickhouse://default:@a.test/default", {}, { resolve: { "a.test": ["::ffff:127.0.0.1%lo"] } }),
    (e) => e.kind === "invalid-config" && /zone/.test(e.message),
  );
  await assert.rejects(
    open("clickhouse://default:@a.test/default", {}, { resolve: { "a.test": ["not an address"] } }),
    (e) => e.kind === "invalid-config" && /resolve/.test(e.message),
  );
});

test("header bytes go as they are both ways, with the authority as the one Host", async () => {
  const server = await recordingServer();
  const port = server.address().port;
  const store = await open(`clickhouse://default:p%E2%82%AC%C3%A4ss@127.0.0.1:${port}/default`, { retries: "0" }, { allowLoopback: true });
  try {
    await assert.rejects(store.get("x"));
    const head = server.seen[0];
    assert.ok(head.includes(Buffer.from("X-ClickHouse-Key: p\u20ac\u00e4ss\r\n", "utf8")), head.toString("latin1"));
    const hosts = head.toString("latin1").split("\r\n").filter((line) => /^host:/i.test(line));
    assert.deepEqual(hosts, [`Host: 127.0.0.1:${port}`]);
  } finally {
    await store.close();
    server.close();
  }
  // A server's header that is not ASCII reaches the component as its bytes; the call succeeds.
  const odd = await proxy((res) => res.setHeader("X-Odd", Buffer.from("\u20ac \u00e9", "utf8").toString("latin1")));
  const through = await open(odd.uri, { schema: "node_api", table: `odd_${process.pid}` }, { allowLoopback: true });
  try {
    await through.migrate();
    await through.set({ stateId: "odd", partial: "{}", completed: "{}" });
    assert.deepEqual(await through.stateIds("odd"), ["odd"]);
    assert.ok(odd.answered > 0);
  } finally {
    await through.close();
    odd.close();
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
    skipOnlyIfAllowed(t, "ipv6", "this machine has no ::1");
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

test("a large body is sent whole, and one answered early does not keep the component waiting", { timeout: 60_000 }, async () => {
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
  // A server that answers an insert before reading its body, then closes: the component,
  // still writing the body, must see the end and get the answer.
  const early = await proxy(null, (req, res) => {
    if (!new URL(req.url, "http://x").searchParams.get("query")?.startsWith("INSERT")) return false;
    res.writeHead(500, { "X-ClickHouse-Exception-Code": "60", Connection: "close" });
    res.end("Code: 60. DB::Exception: Unknown table. (UNKNOWN_TABLE)\n");
    return true;
  });
  const refused = await open(early.uri, { schema: "node_api", table: `early_${process.pid}`, retries: "0" }, { allowLoopback: true });
  try {
    await refused.migrate().catch(() => {});
    const huge = JSON.stringify({ singer_state: { blob: "x".repeat(2_000_000) } });
    await assert.rejects(refused.set({ stateId: "big", partial: "{}", completed: huge }), (e) => e.kind !== "host");
    assert.ok(early.early > 0, "an insert was answered early");
  } finally {
    await refused.close();
    early.close();
  }
});

/** The egress extension as the shim's IO worker runs it, over a stand-in for the worker's
 * tables: futures are their outcomes, streams are kept by id. */
function egressHarness() {
  const streams = [];
  const io = {
    createFuture: (promise) => promise.then((ok) => ({ ok }), (err) => ({ err })),
    // A response is read to its end, as the component reads it.
    createReadableStream: (stream) => streams.push(stream.resume()),
    createWritableStream: (stream) => streams.push(stream),
  };
  const call = createEgress(io);
  return {
    body: (slot) => streams[call("body", [slot]) - 1],
    send: (port, bodySlot) =>
      call("send", [{
        method: "POST",
        scheme: "http:",
        authority: `127.0.0.1:${port}`,
        path: "/",
        headers: ["Host", `127.0.0.1:${port}`],
        bodySlot,
        rules: { allowLoopback: true, refusePrivate: false, resolve: null },
        timeouts: { connect: 5_000_000_000n, firstByte: 5_000_000_000n, betweenBytes: 5_000_000_000n },
      }]),
    finish: (slot) => call("finish", [slot]),
    abort: (slot) => call("abort", [slot]),
  };
}

/** An HTTP server on 127.0.0.1 that keeps every request's bytes and answers 200 once it has a
 * whole request (a chunked body's last chunk). */
async function wholeRequests() {
  const server = createServer((socket) => {
    let bytes = Buffer.alloc(0);
    server.connections.push(() => bytes);
    socket.on("data", (chunk) => {
      bytes = Buffer.concat([bytes, chunk]);
      if (bytes.includes("\r\n0\r\n\r\n")) socket.end("HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n\r\n");
    });
    socket.on("error", () => {});
  });
  server.connections = [];
  await new Promise((resolve) => server.listen(0, "127.0.0.1", resolve));
  return server;
}

test("a body is sent when the component finishes it, and a body dropped unfinished is not", { timeout: 30_000 }, async () => {
  const server = await wholeRequests();
  const port = server.address().port;
  const egress = egressHarness();
  try {
    // Written, its stream ended (the component dropped it), then finished: sent whole.
    const sent = egress.send(port, 9001);
    const body = egress.body(9001);
    body.end("hello");
    egress.finish(9001);
    const answer = await sent;
    assert.equal(answer.ok?.status, 200, JSON.stringify(answer.err));
    assert.ok(server.connections[0]().includes("5\r\nhello\r\n0\r\n\r\n"));

    // Written and its stream ended, but dropped unfinished: the request fails and never ends.
    const dropped = egress.send(port, 9002);
    egress.body(9002).end("hello");
    await new Promise((resolve) => setTimeout(resolve, 50));
    egress.abort(9002);
    const failure = await dropped;
    assert.equal(failure.err?.tag, "internal-error");
    assert.match(failure.err.val, /dropped before it was finished/);
    for (const bytes of server.connections.slice(1)) assert.ok(!bytes().includes("\r\n0\r\n\r\n"));

    // Sent before its body, then finished unwritten: a request with no body.
    const empty = egress.send(port, 9003);
    egress.finish(9003);
    assert.equal((await empty).ok?.status, 200);
    // Each request lets go of its body when it closes, just after its answer is read.
    for (let i = 0; i < 200 && kept() > 0; i++) await new Promise((resolve) => setTimeout(resolve, 10));
    assert.equal(kept(), 0, "nothing is kept for bodies that are done");
  } finally {
    server.close();
  }
});

/** A self-signed certificate and its key for 127.0.0.1 (CN `cn`), made with openssl into `dir`:
 * { cert, key } paths, or null where there is no openssl. */
function selfSigned(dir, cn) {
  const cert = join(dir, `${cn}.pem`);
  const key = join(dir, `${cn}.key`);
  const made = spawnSync("openssl", [
    "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
    "-keyout", key, "-out", cert, "-days", "1",
    "-subj", `/CN=${cn}`, "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1",
  ]);
  return made.error || made.status !== 0 ? null : { cert, key };
}

test("certificates are checked whatever NODE_TLS_REJECT_UNAUTHORIZED says", async (t) => {
  const dir = mkdtempSync(join(tmpdir(), "node-host-tls-"));
  const made = selfSigned(dir, "server");
  if (made === null) {
    rmSync(dir, { recursive: true, force: true });
    skipOnlyIfAllowed(t, "openssl", "no openssl here to make a certificate (Debian: apt-get install openssl)");
    return;
  }
  const server = createTlsServer(
    { key: readFileSync(made.key), cert: readFileSync(made.cert) },
    (socket) => {
      server.handshakes++;
      socket.end("HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\n1\n");
    },
  );
  server.handshakes = 0;
  await new Promise((resolve) => server.listen(0, "127.0.0.1", resolve));
  const before = process.env.NODE_TLS_REJECT_UNAUTHORIZED;
  process.env.NODE_TLS_REJECT_UNAUTHORIZED = "0";
  let store;
  try {
    store = await open(`clickhouse://default:@127.0.0.1:${server.address().port}/default?secure=true`, { retries: "0" }, { allowLoopback: true });
    await assert.rejects(store.get("x"), (e) => /certificate/i.test(e.message));
    assert.equal(server.handshakes, 0, "no handshake completed");
  } finally {
    if (before === undefined) delete process.env.NODE_TLS_REJECT_UNAUTHORIZED;
    else process.env.NODE_TLS_REJECT_UNAUTHORIZED = before;
    await store?.close();
    server.close();
    rmSync(dir, { recursive: true, force: true });
  }
});

test("a private CA is trusted when given, and a client certificate sent", async (t) => {
  const dir = mkdtempSync(join(tmpdir(), "node-host-tls-"));
  const server = selfSigned(dir, "server");
  const client = server && selfSigned(dir, "client");
  if (!client) {
    rmSync(dir, { recursive: true, force: true });
    skipOnlyIfAllowed(t, "openssl", "no openssl here to make a certificate (Debian: apt-get install openssl)");
    return;
  }
  const settings = { schema: "node_api", table: `tls_${process.pid}`, retries: "0" };
  // https to ClickHouse, the server's certificate from our own CA; it asks for a client's.
  const https = await proxy(null, undefined, {
    key: readFileSync(server.key),
    cert: readFileSync(server.cert),
    requestCert: true,
    rejectUnauthorized: true,
    ca: readFileSync(client.cert),
  });
  const options = { allowLoopback: true, caBundle: server.cert, clientCert: client.cert, clientKey: client.key };
  try {
    const store = await open(https.uri, settings, options);
    try {
      await store.migrate();
      await store.set({ stateId: "tls", partial: "{}", completed: '{"singer_state":{"t":1}}' });
      assert.equal((await store.get("tls")).completed, '{"singer_state":{"t":1}}');
    } finally {
      await store.close();
    }
    // Without the bundle the server is not trusted; without the client's certificate the
    // server refuses the handshake.
    const missing = [
      [{ caBundle: undefined }, /TLS certificate not trusted/],
      [{ clientCert: undefined, clientKey: undefined }, /TLS alert from the server: .*certificate required/],
    ];
    for (const [without, reason] of missing) {
      const store = await open(https.uri, settings, { ...options, ...without });
      try {
        await assert.rejects(store.get("tls"), (e) => e.kind === "unreachable" && reason.test(e.message));
      } finally {
        await store.close();
      }
    }
    // Bad files are an error of open, naming the option.
    const bad = [
      [{ caBundle: join(dir, "none.pem") }, /caBundle .*cannot read/],
      [{ caBundle: server.key }, /caBundle .*no PEM certificate/],
      [{ clientCert: client.cert, clientKey: undefined }, /both clientCert and clientKey/],
      [{ clientCert: client.cert, clientKey: server.key }, /not usable together/],
    ];
    for (const [given, message] of bad) {
      await assert.rejects(open(https.uri, settings, { ...options, ...given }), (e) => {
        assert.equal(e.kind, "invalid-config");
        assert.match(e.message, message);
        assert.ok(!e.message.includes("PRIVATE KEY"));
        return true;
      });
    }
  } finally {
    https.close();
    rmSync(dir, { recursive: true, force: true });
  }
});
