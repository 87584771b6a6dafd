// The component's requests, made in the shim's IO worker (loaded there as a worker extension,
// so that the bodies are the shim's own streams). Each request resolves its name once, checks
// every address against the policy, and connects only to those addresses: the connection's
// `lookup` answers with them, for http and https alike, so a name cannot answer one address to
// the check and another to the connection. https keeps the name for its certificate and SNI.

import { lookup as systemLookup } from "node:dns/promises";
import { Agent as HttpAgent, request as httpRequest } from "node:http";
import { Agent as HttpsAgent, request as httpsRequest } from "node:https";
import { isIP } from "node:net";
import { PassThrough } from "node:stream";
import { check } from "./policy.js";

const agents = {
  "http:": [httpRequest, new HttpAgent({ keepAlive: true })],
  "https:": [httpsRequest, new HttpsAgent({ keepAlive: true })],
};

/** Request bodies by stream id: the shim forgets a stream when the component drops it, which it
 * may do before the request reads the body. */
const bodies = new Map();

/** The addresses `host` resolves to: the host's own table first (`resolve`), then the system
 * resolver. An error is the contract's `DNS-error`. */
async function resolve(host, table) {
  if (isIP(host)) return [host];
  const pinned = table?.[host.toLowerCase()];
  if (pinned) return pinned;
  try {
    return (await systemLookup(host, { all: true, verbatim: true })).map((a) => a.address);
  } catch (e) {
    throw { tag: "DNS-error", val: { rcode: e.code ?? "no answer", infoCode: undefined } };
  }
}

/** A `lookup` for a connection that answers with the addresses checked and nothing else. */
function pinnedLookup(addresses) {
  return (_name, options, callback) => {
    const wanted = options?.family === "IPv6" ? 6 : options?.family === "IPv4" ? 4 : options?.family;
    const found = addresses
      .map((address) => ({ address, family: isIP(address) }))
      .filter((a) => !wanted || a.family === wanted);
    if (found.length === 0) {
      const e = Object.assign(new Error("no checked address of this family"), { code: "ENOTFOUND" });
      callback(e);
    } else if (options?.all) {
      callback(null, found);
    } else {
      callback(null, found[0].address, found[0].family);
    }
  };
}

/** A Node error as the contract's `error-code`. A reset is `connection-terminated`, which the
 * guest tries again with its whole budget; a reply that is not HTTP is `HTTP-protocol-error`. */
export function errorCode(e) {
  if (e?.tag) return e;
  const code = e?.code ?? "";
  if (code === "ECONNRESET" || code === "EPIPE" || code === "ECONNABORTED") {
    return { tag: "connection-terminated" };
  }
  if (code === "ECONNREFUSED") return { tag: "connection-refused" };
  if (code === "ETIMEDOUT") return { tag: "connection-timeout" };
  if (code === "EHOSTUNREACH" || code === "ENETUNREACH") return { tag: "destination-unavailable" };
  if (code === "ENOTFOUND" || code === "EAI_AGAIN") {
    return { tag: "DNS-error", val: { rcode: code, infoCode: undefined } };
  }
  if (code.startsWith("HPE_")) return { tag: "HTTP-protocol-error" };
  if (
    code.startsWith("CERT_") ||
    code.includes("SELF_SIGNED") ||
    code === "UNABLE_TO_VERIFY_LEAF_SIGNATURE" ||
    code === "UNABLE_TO_GET_ISSUER_CERT_LOCALLY" ||
    code === "ERR_TLS_CERT_ALTNAME_INVALID"
  ) {
    return { tag: "TLS-certificate-error" };
  }
  if (code.startsWith("ERR_SSL_") || code === "EPROTO") return { tag: "TLS-protocol-error" };
  return { tag: "internal-error", val: e?.message ?? String(e) };
}

/** `host:port`, `host`, `[v6]:port` or `[v6]` as [host, port]. */
export function splitAuthority(authority) {
  const bracketed = /^\[([0-9A-Fa-f:.]+)\](?::(\d+))?$/.exec(authority);
  if (bracketed) return [bracketed[1], bracketed[2] ?? ""];
  const colon = authority.lastIndexOf(":");
  return colon >= 0 ? [authority.slice(0, colon), authority.slice(colon + 1)] : [authority, ""];
}

const ms = (ns) => (ns === undefined ? undefined : Number(ns / 1_000_000n));

/** Sends one request; the promise is its response, or its `error-code`. */
async function send(io, { method, scheme, authority, path, headers, bodyId, rules, timeouts }) {
  const body = bodies.get(bodyId);
  bodies.delete(bodyId);
  const fail = (e) => {
    // The component may be waiting to write more of the body: let it see the end.
    body?.destroy();
    throw errorCode(e);
  };
  const agent = agents[scheme];
  if (!agent) fail({ tag: "HTTP-protocol-error" });
  const [host, port] = splitAuthority(authority);
  const addresses = await resolve(host, rules.resolve).catch(fail);
  const why = check(addresses, rules);
  if (why !== null) fail({ tag: "destination-IP-prohibited" });

  return new Promise((resolve, reject) => {
    const failed = (e) => {
      clearTimeout(timer);
      req.destroy();
      body?.destroy();
      reject(errorCode(e));
    };
    const [request, pool] = agent;
    const req = request({
      agent: pool,
      method,
      host,
      port: port || undefined,
      path,
      lookup: pinnedLookup(addresses),
      servername: isIP(host) ? undefined : host,
      headers,
    });
    // Until the response: the connect timeout while connecting, then the first byte's.
    let timer = setTimeout(() => failed({ tag: "connection-timeout" }), ms(timeouts.connect) ?? 10_000);
    req.once("socket", (socket) => {
      const connected = () => {
        clearTimeout(timer);
        const wait = ms(timeouts.firstByte);
        if (wait !== undefined) timer = setTimeout(() => failed({ tag: "HTTP-response-timeout" }), wait);
      };
      if (socket.connecting) socket.once(scheme === "https:" ? "secureConnect" : "connect", connected);
      else connected();
    });
    req.once("error", failed);
    req.once("response", (res) => {
      clearTimeout(timer);
      const between = ms(timeouts.betweenBytes);
      if (between !== undefined) {
        res.setTimeout(between, () => res.destroy(Object.assign(new Error("no byte in time"), { code: "ETIMEDOUT" })));
      }
      const raw = res.rawHeaders;
      const pairs = [];
      for (let i = 0; i + 1 < raw.length; i += 2) pairs.push([raw[i], raw[i + 1]]);
      resolve({ status: res.statusCode, headers: pairs, bodyStreamId: io.createReadableStream(res) });
    });
    if (body) body.pipe(req);
    else req.end();
  });
}

/** The extension: the shim calls it with an operation's name and arguments. */
export default function create(io) {
  return (operation, [args]) => {
    switch (operation) {
      case "body": {
        const body = new PassThrough();
        const id = io.createWritableStream(body);
        bodies.set(id, body);
        return id;
      }
      case "forget":
        bodies.delete(args);
        return undefined;
      case "send":
        return io.createFuture(send(io, args));
      default:
        throw new Error(`no egress operation ${operation}`);
    }
  };
}
