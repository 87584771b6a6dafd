// The egress policy, as plain functions: which addresses a request may go to. The address
// classes are the Rust host's
// (host/src/http/policy.rs), held to the same table (tests/conformance/addresses.json): link-local
// addresses and cloud metadata are refused always, loopback unless allowed, private networks
// when asked to, by every address a name resolves to, and by the IPv4 address an IPv6 one
// embeds (mapped, NAT64, 6to4).

import { isIP } from "node:net";

const METADATA_V4 = ["169.254.169.254", "169.254.170.2", "169.254.170.23", "100.100.100.200", "192.0.0.192"];
const METADATA_V6 = [[0xfd00, 0xec2, 0, 0, 0, 0, 0, 0x254], [0xfd00, 0xec2, 0, 0, 0, 0, 0, 0x23]];
const PRIVATE_V4 = [
  ["0.0.0.0", 8], ["10.0.0.0", 8], ["100.64.0.0", 10], ["172.16.0.0", 12], ["192.0.0.0", 24],
  ["192.0.2.0", 24], ["192.31.196.0", 24], ["192.52.193.0", 24], ["192.88.99.0", 24],
  ["192.168.0.0", 16], ["198.18.0.0", 15], ["198.51.100.0", 24], ["203.0.113.0", 24],
  ["224.0.0.0", 3],
];
const PRIVATE_V6 = [
  [[0, 0, 0, 0, 0, 0, 0, 0], 96], [[0x64, 0xff9b, 1, 0, 0, 0, 0, 0], 48],
  [[0x100, 0, 0, 0, 0, 0, 0, 0], 64], [[0x2001, 0, 0, 0, 0, 0, 0, 0], 23],
  [[0x2001, 0xdb8, 0, 0, 0, 0, 0, 0], 32], [[0x3fff, 0, 0, 0, 0, 0, 0, 0], 20],
  [[0xfc00, 0, 0, 0, 0, 0, 0, 0], 7], [[0xfec0, 0, 0, 0, 0, 0, 0, 0], 10],
  [[0xff00, 0, 0, 0, 0, 0, 0, 0], 8],
];

const v4Number = (ip) => ip.split(".").reduce((n, o) => n * 256n + BigInt(o), 0n);
const v6Number = (words) => words.reduce((n, w) => n * 65536n + BigInt(w), 0n);
const inPrefix = (n, net, len, bits) => n >> BigInt(bits - len) === net >> BigInt(bits - len);

/** The eight 16-bit words of an IPv6 address (`::`, and a dotted IPv4 tail, expanded). */
function v6Words(ip) {
  let text = ip;
  const dotted = /(\d+\.\d+\.\d+\.\d+)$/.exec(text);
  if (dotted) {
    const n = v4Number(dotted[1]);
    text = `${text.slice(0, dotted.index)}${(n >> 16n).toString(16)}:${(n & 0xffffn).toString(16)}`;
  }
  const [head, tail] = text.includes("::") ? text.split("::") : [text, null];
  const parse = (part) => (part ? part.split(":").map((w) => parseInt(w, 16)) : []);
  const left = parse(head);
  const right = parse(tail);
  return tail === null ? left : [...left, ...Array(8 - left.length - right.length).fill(0), ...right];
}

/** What kind of address `ip` is, as the Rust host's `AddressClass`: "metadata", "loopback",
 * "link-local", "private", or "public". */
export function classify(address) {
  // A zone (`fe80::1%eth0`) names an interface, not another address: classed without it.
  let ip = address.toLowerCase().replace(/%.*$/, "");
  if (isIP(ip) === 6) {
    const w = v6Words(ip);
    const n = v6Number(w);
    const v4 = (hi, lo) => [hi >> 8, hi & 255, lo >> 8, lo & 255].join(".");
    if (w.slice(0, 6).join() === "0,0,0,0,0,65535") ip = v4(w[6], w[7]);
    else if (w.slice(0, 6).join() === [0x64, 0xff9b, 0, 0, 0, 0].join()) ip = v4(w[6], w[7]);
    else if (w[0] === 0x2002) ip = v4(w[1], w[2]);
    else {
      if (METADATA_V6.some((m) => m.join() === w.join())) return "metadata";
      if (n === 1n || n === 0n) return "loopback";
      if ((w[0] & 0xffc0) === 0xfe80) return "link-local";
      if (PRIVATE_V6.some(([net, len]) => inPrefix(n, v6Number(net), len, 128))) return "private";
      return "public";
    }
  }
  if (METADATA_V4.includes(ip)) return "metadata";
  const n = v4Number(ip);
  if (ip.startsWith("127.") || ip === "0.0.0.0") return "loopback";
  if (ip.startsWith("169.254.")) return "link-local";
  if (PRIVATE_V4.some(([net, len]) => inPrefix(n, v4Number(net), len, 32))) return "private";
  return "public";
}

/** Why a destination of this kind is refused under `rules` ({ allowLoopback, refusePrivate }),
 * or null when it is allowed. */
export function refusal(kind, rules) {
  switch (kind) {
    case "metadata":
    case "link-local":
      return `${kind} addresses are always refused`;
    case "loopback":
      return rules.allowLoopback ? null : "loopback is refused unless allowed (allowLoopback)";
    case "private":
      return rules.refusePrivate ? "private networks are refused (refusePrivate)" : null;
    default:
      return null;
  }
}

/** Why a request to these addresses (every one a name resolved to) is refused, or null: one
 * refused address refuses the request, whichever of them a connection would use. */
export function check(addresses, rules) {
  if (addresses.length === 0) return "no address to check";
  for (const ip of addresses) {
    const why = refusal(classify(ip), rules);
    if (why !== null) return `${ip}: ${why}`;
  }
  return null;
}
