// wasi:http/types `fields`, by bytes: a value is any bytes but control characters (tab
// allowed), as hyper takes them in the Rust host, so a header is never re-encoded or refused
// for a character outside ASCII. Names are RFC 9110 tokens, compared without case.

/** Headers a component may not set: the connection's own, and Host (the request's authority). */
const FORBIDDEN = new Set([
  "connection",
  "keep-alive",
  "proxy-connection",
  "transfer-encoding",
  "upgrade",
  "te",
  "http2-settings",
  "host",
]);
const TOKEN = /^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$/;

/** Whether `bytes` may be a header value. */
export function validValue(bytes) {
  for (const b of bytes) {
    if ((b < 0x20 && b !== 0x09) || b === 0x7f) return false;
  }
  return true;
}

export class Fields {
  #entries = [];
  #immutable = false;

  static fromList(entries) {
    const fields = new Fields();
    for (const [name, value] of entries) fields.append(name, value);
    return fields;
  }

  /** Fields the host builds from what a server sent, as they came (the connection's own
   * headers left out), immutable. */
  static _received(pairs) {
    const fields = new Fields();
    for (const [name, value] of pairs) {
      if (TOKEN.test(name) && !FORBIDDEN.has(name.toLowerCase()) && validValue(value)) {
        fields.#entries.push([name, value]);
      }
    }
    fields.#immutable = true;
    return fields;
  }

  /** Makes `fields` immutable (a request's headers, once it has them). */
  static _freeze(fields) {
    fields.#immutable = true;
    return fields;
  }

  #check(name, values) {
    if (this.#immutable) throw { tag: "immutable" };
    if (!TOKEN.test(name) || !values.every(validValue)) throw { tag: "invalid-syntax" };
    if (FORBIDDEN.has(name.toLowerCase())) throw { tag: "forbidden" };
  }

  get(name) {
    const key = name.toLowerCase();
    return this.#entries.filter(([n]) => n.toLowerCase() === key).map(([, v]) => v);
  }

  has(name) {
    const key = name.toLowerCase();
    return this.#entries.some(([n]) => n.toLowerCase() === key);
  }

  set(name, values) {
    this.#check(name, values);
    const key = name.toLowerCase();
    this.#entries = this.#entries.filter(([n]) => n.toLowerCase() !== key);
    for (const value of values) this.#entries.push([name, value]);
  }

  delete(name) {
    if (this.#immutable) throw { tag: "immutable" };
    const key = name.toLowerCase();
    this.#entries = this.#entries.filter(([n]) => n.toLowerCase() !== key);
  }

  append(name, value) {
    this.#check(name, [value]);
    this.#entries.push([name, value]);
  }

  entries() {
    return this.#entries.map(([name, value]) => [name, value]);
  }

  clone() {
    const copy = new Fields();
    copy.#entries = this.entries();
    return copy;
  }
}

export const receivedFields = Fields._received;
export const freezeFields = Fields._freeze;
delete Fields._received;
delete Fields._freeze;
