// The component's requests, made in the shim's IO worker (loaded there as a worker extension,
// so that the bodies are the shim's own streams). Each request resolves its name once, checks
// every address against the policy, and connects only to those addresses: the connection's
// `lookup` answers with them, for http and https alike, so a name cannot answer one address to
// the check and another to the connection. https keeps the name for its certificate and SNI.

import { lookup as systemLookup } from "node:dns/promises";
import { Agent as HttpAgent, request as httpRequest } from "node:http";
import { Agent as HttpsAgent, request as httpsRequest } from "node:https";
import { isIP } from "node:net";
import { rootCertificates } from "node:tls";
import { PassThrough } from "node:stream";
import { finished as streamEnded } from "node:stream/promises";
import { aborted, done, finished, release, take, whole, written } from "./bodies.js";
import { check } from "./policy.js";
import { checkAddresses, checkName } from "./tripwire.js";

export { release };

// No proxy from the environment (a proxy would connect where the policy never looked), and
// certificates checked whatever NODE_TLS_REJECT_UNAUTHORIZED says. A kept-alive connection is
// reused only by this store, and went to an address checked when it was opened.
const httpsAgent = (tls = {}) => new HttpsAgent({ keepAlive: true, proxyEnv: null, rejectUnauthorized: true, ...tls });
const agents = {
  "http:": [httpRequest, new HttpAgent({ keepAlive: true, proxyEnv: null })],
  "https:": [httpsRequest, httpsAgent()],
};

/** The addresses a request to `host` may go to: every one it resolves to (the `resolve` table
 * first, then the system resolver), each allowed by `rules`. Throws the contract's error code:
 * `DNS-error` when it resolves to nothing, `destination-IP-prohibited` when any is refused. */
export async function destinations(host, rules, resolver = systemLookup) {
  let addresses;
  if (isIP(host)) {
    addresses = [host];
  } else if (rules.resolve?.has(host.toLowerCase())) {
    addresses = rules.resolve.get(host.toLowerCase());
  } else {
    // A name the system would look up (a query may leave the machine); not a test's resolver.
    if (resolver === systemLookup) checkName(host);
    try {
      addresses = (await resolver(host, { all: true, verbatim: true })).map((a) => a.address);
    } catch (e) {
      throw { tag: "DNS-error", val: { rcode: e.code ?? "no answer", infoCode: undefined } };
    }
  }
  if (addresses.length === 0) throw { tag: "DNS-error", val: { rcode: "no address", infoCode: undefined } };
  if (check(addresses, rules) !== null) throw { tag: "destination-IP-prohibited" };
  checkAddresses(host, addresses);
  return addresses;
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

const CERTIFICATE = /^(CERT_|UNABLE_TO_|DEPTH_ZERO_SELF_SIGNED_CERT$|SELF_SIGNED_CERT_IN_CHAIN$|ERR_TLS_CERT_ALTNAME_INVALID$|HOSTNAME_MISMATCH$)/;

/** A Node error as the contract's `error-code`. A reset is `connection-terminated`, which the
 * guest tries again with its whole budget; a reply that is not HTTP is `HTTP-protocol-error`. */
export function errorCode(e) {
  if (e?.tag) return e;
  const code = typeof e?.code === "string" ? e.code : "";
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
  if (CERTIFICATE.test(code)) return { tag: "TLS-certificate-error" };
  if (code.startsWith("ERR_SSL_") && code.includes("_ALERT_")) {
    return { tag: "TLS-alert-received", val: { alertId: undefined, alertMessage: e.message } };
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

const ms = (ns) => (ns === undefined || ns === null ? undefined : Number(ns / 1_000_000n));

/** Rejects with `error` when `promise` takes longer than `limit` ms. */
function within(promise, limit, error) {
  let timer;
  const late = new Promise((_, reject) => {
    timer = setTimeout(() => reject(error), limit);
  });
  return Promise.race([promise, late]).finally(() => clearTimeout(timer));
}

/** Sends one request; the promise is its response, or its `error-code`. Every failure, thrown
 * anywhere, is an error code, and the body is released. */
async function send(io, request) {
  // The request is done with its body once, whichever way it ends.
  let ended = false;
  request.end = () => {
    if (!ended) done(request.bodySlot);
    ended = true;
  };
  try {
    return await attempt(io, request);
  } catch (e) {
    request.end();
    throw errorCode(e);
  }
}

async function attempt(io, request) {
  const { method, scheme, authority, path, headers, bodySlot, rules, timeouts } = request;
  const agent = agents[scheme];
  if (!agent) throw { tag: "HTTP-protocol-error" };
  const [host, port] = splitAuthority(authority);
  const connectMs = ms(timeouts.connect) ?? 10_000;
  const addresses = await within(destinations(host, rules), connectMs, { tag: "DNS-timeout" });
  const body = await take(bodySlot);

  return new Promise((resolve, reject) => {
    let timer;
    let req;
    const failed = (e) => {
      clearTimeout(timer);
      req?.destroy();
      request.end();
      reject(errorCode(e));
    };
    try {
      const [open, pool] = agent;
      req = open({
        agent: pool,
        method,
        host,
        port: port || undefined,
        path,
        lookup: pinnedLookup(addresses),
        servername: isIP(host) ? undefined : host,
        headers,
      });
    } catch (e) {
      failed(e);
      return;
    }
    // Until the response: the connect timeout while connecting, then the first byte's.
    timer = setTimeout(() => failed({ tag: "connection-timeout" }), connectMs);
    req.once("socket", (socket) => {
      const connected = () => {
        clearTimeout(timer);
        const wait = ms(timeouts.firstByte);
        if (wait !== undefined) timer = setTimeout(() => failed({ tag: "HTTP-response-timeout" }), wait);
      };
      if (socket.connecting) socket.once(scheme === "https:" ? "secureConnect" : "connect", connected);
      else connected();
    });
    // `on`, not `once`: a second error event would otherwise be uncaught in the IO worker.
    req.on("error", failed);
    // Answered (or closed) before the whole body went, the body is released: the component
    // may be waiting to write the rest.
    req.once("close", request.end);
    req.once("response", (res) => {
      clearTimeout(timer);
      const between = ms(timeouts.betweenBytes);
      if (between !== undefined) {
        res.setTimeout(between, () => res.destroy(Object.assign(new Error("no byte in time"), { code: "ETIMEDOUT" })));
      }
      // Header bytes travel as they came: Node reads them as latin1, one byte to a character.
      const raw = res.rawHeaders;
      const pairs = [];
      for (let i = 0; i + 1 < raw.length; i += 2) pairs.push([raw[i], raw[i + 1]]);
      resolve({ status: res.statusCode, headers: pairs, bodyStreamId: io.createReadableStream(res) });
    });
    if (body) {
      // The request ends when the body is whole: its stream ended and the component finished
      // it. Dropped unfinished, the request fails rather than send a part.
      body.pipe(req, { end: false });
      Promise.all([streamEnded(body), whole(bodySlot)]).then(() => req.end(), failed);
    } else {
      req.end();
    }
  });
}

/** The extension: the shim calls it with an operation's name and arguments. */
export default function create(io) {
  return (operation, [args]) => {
    switch (operation) {
      case "body": {
        const body = new PassThrough();
        const id = io.createWritableStream(body);
        written(args, body);
        return id;
      }
      case "finish":
        finished(args);
        return undefined;
      case "abort":
        aborted(args);
        return undefined;
      case "forget":
        aborted(args);
        done(args);
        return undefined;
      case "tls":
        // The system's roots and the bundle's; the client identity, if any. Once per store.
        agents["https:"][1] = httpsAgent({
          ca: args.ca ? [...rootCertificates, args.ca] : undefined,
          cert: args.cert ?? undefined,
          key: args.key ?? undefined,
        });
        return undefined;
      case "send":
        return io.createFuture(send(io, args));
      default:
        throw new Error(`no egress operation ${operation}`);
    }
  };
}
