// A tripwire under the egress policy, as the Rust host has (host/src/http/tripwire.rs): armed
// when NODE_HOST_TRIPWIRE names a file, it lets a request connect to this machine only (loopback
// or unspecified addresses) and look up no name but `localhost`, whatever the policy allows. A
// trip fails the request and appends a line to the file. The tests arm it, and `just test-node`
// fails when the file is not empty: a refusal that broke shows as a failed run instead of packets
// leaving the machine. STATE_BACKEND_TRIPWIRE_ALLOW names hosts it lets through besides (the
// ClickHouse under test, when it is elsewhere).

import { appendFileSync } from "node:fs";
import { isIP } from "node:net";

export const TRIPWIRE_ENV = "NODE_HOST_TRIPWIRE";
export const TRIPPED = "tripwire: refused to leave this machine";

const file = () => process.env[TRIPWIRE_ENV] || null;

function allowed(host) {
  return (process.env.STATE_BACKEND_TRIPWIRE_ALLOW ?? "")
    .split(",")
    .map((h) => h.trim().toLowerCase())
    .some((h) => h !== "" && h === host.toLowerCase());
}

/** Whether `ip` is this machine: 127/8, ::1, an IPv4-mapped 127/8, or unspecified. */
export function local(ip) {
  const v4 = ip.toLowerCase().replace(/^::ffff:/, "");
  if (isIP(v4) === 4) return v4.startsWith("127.") || v4 === "0.0.0.0";
  return ip === "::1" || ip === "::" || /^(0{1,4}:){7}0{0,3}1$/.test(ip);
}

function trip(what) {
  const line = `${TRIPPED}: ${what} (the policy allowed it)`;
  appendFileSync(file(), `${line}\n`);
  return { tag: "internal-error", val: line };
}

/** Before looking `host` up: only IP literals and `localhost`. Throws an error code. */
export function checkName(host) {
  if (!file() || isIP(host) || host.toLowerCase() === "localhost" || allowed(host)) return;
  throw trip(`a lookup of the name ${host}`);
}

/** Before connecting to `addresses` of `host`: only this machine's. Throws an error code. */
export function checkAddresses(host, addresses) {
  if (!file() || allowed(host)) return;
  const away = addresses.find((ip) => !local(ip));
  if (away !== undefined) throw trip(`a connection to ${away}`);
}
