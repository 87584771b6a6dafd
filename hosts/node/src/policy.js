// The egress policy: wasi:http/outgoing-handler, as the component sees it, is the shim's, behind
// a check of where the request goes. Like the Rust host's (host/src/http/policy.rs), it refuses
// link-local addresses and cloud metadata always, loopback unless allowed, and private networks
// when asked to, by the addresses a name resolves to.

import { execFileSync } from "node:child_process";
import { isIP } from "node:net";
import { workerData } from "node:worker_threads";
import { outgoingHandler as shim } from "@bytecodealliance/preview2-shim/http";

const allowLoopback = Boolean(workerData?.allowLoopback);
const refusePrivate = Boolean(workerData?.refusePrivate);

/** What kind of address `ip` is: "loopback", "link-local", "metadata", "private",
 * "unspecified" or "public". */
export function classify(ip) {
  const v4 = ip.startsWith("::ffff:") && isIP(ip.slice(7)) === 4 ? ip.slice(7) : ip;
  if (isIP(v4) === 4) {
    const [a, b] = v4.split(".").map(Number);
    if (v4 === "169.254.169.254" || v4 === "100.100.100.200") return "metadata";
    if (a === 127) return "loopback";
    if (a === 0) return "unspecified";
    if (a === 169 && b === 254) return "link-local";
    if (a === 10 || (a === 172 && b >= 16 && b <= 31) || (a === 192 && b === 168)) {
      return "private";
    }
    if (a === 100 && b >= 64 && b <= 127) return "private";
    return "public";
  }
  const lower = ip.toLowerCase();
  if (lower === "::1") return "loopback";
  if (lower === "::") return "unspecified";
  if (lower === "fd00:ec2::254") return "metadata";
  if (/^fe[89ab]/.test(lower)) return "link-local";
  if (/^f[cd]/.test(lower)) return "private";
  return "public";
}

/** Why a destination of this kind is refused, or null when it is allowed. */
export function refusal(kind) {
  switch (kind) {
    case "metadata":
    case "link-local":
    case "unspecified":
      return `${kind} addresses are always refused`;
    case "loopback":
      return allowLoopback ? null : "loopback is refused unless allowed (allowLoopback)";
    case "private":
      return refusePrivate ? "private networks are refused (refusePrivate)" : null;
    default:
      return null;
  }
}

const resolved = new Map();

/** The addresses `host` resolves to, as the shim will look them up (the system resolver),
 * synchronously: the component's call is synchronous. Once per name per process. */
function addresses(host) {
  if (isIP(host)) return [host];
  if (!resolved.has(host)) {
    const script =
      "require('node:dns').lookup(process.argv[1], { all: true }, (e, a) => " +
      "process.stdout.write(JSON.stringify(e ? [] : a.map((x) => x.address))))";
    let found = [];
    try {
      found = JSON.parse(execFileSync(process.execPath, ["-e", script, host]).toString());
    } catch {
      found = [];
    }
    resolved.set(host, found);
  }
  return resolved.get(host);
}

/** The host part of an authority: `h:p`, `[v6]:p`, `h`. */
export function hostOf(authority) {
  const bracketed = /^\[([^\]]+)\]/.exec(authority);
  if (bracketed) return bracketed[1];
  const colon = authority.lastIndexOf(":");
  return colon >= 0 && authority.indexOf(":") === colon ? authority.slice(0, colon) : authority;
}

function handle(request, options) {
  const host = hostOf(request.authority() ?? "");
  const found = addresses(host);
  if (found.length === 0) {
    throw { tag: "DNS-error", val: { rcode: "not found", infoCode: undefined } };
  }
  for (const ip of found) {
    if (refusal(classify(ip)) !== null) {
      throw { tag: "destination-IP-prohibited" };
    }
  }
  return shim.handle(request, options);
}

/** wasi:http/outgoing-handler for the component: the shim's, behind the policy. */
export const outgoingHandler = { handle };
