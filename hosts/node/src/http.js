// wasi:http/types and wasi:http/outgoing-handler for the component: the fields (src/fields.js)
// and the resources of an outgoing request are this host's, and the request is made by
// src/egress.js in the shim's IO worker, behind the egress policy (src/policy.js). The rest of
// wasi:http/types (options, the server side) is the shim's; streams and pollables are the
// shim's wasi:io, as for any resource.

import { workerData } from "node:worker_threads";
import { types as shim } from "@bytecodealliance/preview2-shim/http";
import {
  callExtension,
  futureDispose,
  futureSubscribe,
  futureTakeValue,
  inputStreamCreate,
  outputStreamCreate,
} from "@bytecodealliance/preview2-shim/io-worker";

import { Fields, freezeFields, receivedFields } from "./fields.js";

const EGRESS = new URL("./egress.js", import.meta.url);
const symbolDispose = Symbol.dispose ?? Symbol.for("dispose");

/** Where this store's requests may go: src/policy.js's rules, and the host's own name table. */
const rules = {
  allowLoopback: Boolean(workerData?.allowLoopback),
  refusePrivate: Boolean(workerData?.refusePrivate),
  resolve: workerData?.resolve ?? null,
};

const egress = (operation, args) => callExtension(EGRESS, operation, [args]);

// The store's TLS (a private CA, a client identity), given to the IO worker once.
const tls = workerData?.tls;
if (tls && (tls.ca || tls.cert)) egress("tls", tls);

let nextSlot = 1;

/** A request's body, known to the IO worker by its slot (src/bodies.js). Its stream is made
 * only when the component writes, so a body finished unwritten is no body, and costs no call
 * when it is finished before the request is sent. */
class OutgoingBody {
  #slot = nextSlot++;
  /** "open", "written", "finished" or "aborted". */
  #state = "open";
  #wrote = false;
  #sent = false;

  write() {
    if (this.#state !== "open" || this.#wrote) throw undefined;
    this.#state = "written";
    this.#wrote = true;
    return outputStreamCreate(egress("body", this.#slot));
  }

  /** The body is whole: the request may end it (a written one, or one its request waits for). */
  static finish(body, trailers) {
    if (trailers) throw { tag: "internal-error", val: "trailers are not supported" };
    if (bodyDone(body.#state)) return;
    body.#state = "finished";
    if (body.#wrote || body.#sent) egress("finish", body.#slot);
  }

  /** Dropped unfinished: WASI's corrupted body, so its request fails rather than send a part. */
  [symbolDispose]() {
    if (bodyDone(this.#state)) return;
    this.#state = "aborted";
    if (this.#wrote || this.#sent) egress("abort", this.#slot);
  }

  /** The slot the request takes its body from, or null for none; the body is sent. */
  static _send(body) {
    if (body === null) return null;
    body.#sent = true;
    return body.#state === "finished" && !body.#wrote ? null : body.#slot;
  }

  /** The request was never sent: what the IO worker keeps for the body goes. */
  static _unsent(body) {
    if (body !== null && body.#wrote && !body.#sent) egress("forget", body.#slot);
  }
}
const bodyDone = (state) => state === "finished" || state === "aborted";
const sendBody = OutgoingBody._send;
const unsentBody = OutgoingBody._unsent;
delete OutgoingBody._send;
delete OutgoingBody._unsent;

class OutgoingRequest {
  #method = { tag: "get" };
  #scheme = undefined;
  #authority = undefined;
  #pathWithQuery = undefined;
  #headers;
  #body = null;
  #bodyTaken = false;
  #sent = false;

  constructor(headers) {
    this.#headers = freezeFields(headers);
  }

  body() {
    if (this.#bodyTaken) throw undefined;
    this.#bodyTaken = true;
    this.#body = new OutgoingBody();
    return this.#body;
  }

  method() {
    return this.#method;
  }

  setMethod(method) {
    if (method.tag === "other" && !/^[A-Za-z-]+$/.test(method.val)) throw undefined;
    this.#method = method;
  }

  pathWithQuery() {
    return this.#pathWithQuery;
  }

  setPathWithQuery(path) {
    if (path && !/^[A-Za-z0-9.\-_~!$&'()*+,;=:@%?/]+$/.test(path)) throw undefined;
    this.#pathWithQuery = path;
  }

  scheme() {
    return this.#scheme;
  }

  setScheme(scheme) {
    if (scheme?.tag === "other") throw undefined;
    this.#scheme = scheme;
  }

  authority() {
    return this.#authority;
  }

  /** `host`, `host:port`, `[v6]` or `[v6]:port`. */
  setAuthority(authority) {
    if (authority && !/^(?:[A-Za-z0-9.-]+|\[[0-9A-Fa-f:.]+\])(?::\d{1,5})?$/.test(authority)) {
      throw undefined;
    }
    this.#authority = authority;
  }

  headers() {
    return this.#headers;
  }

  [symbolDispose]() {
    if (!this.#sent) unsentBody(this.#body);
  }

  static _send(request, options) {
    request.#sent = true;
    if (!request.#pathWithQuery || !request.#authority) {
      unsentBody(request.#body);
      throw { tag: "HTTP-request-URI-invalid" };
    }
    // Node writes header values as latin1, one byte to a character: the bytes go as they are.
    // Given raw headers, Node adds no Host: it is the authority, as the Rust host sends it.
    const headers = ["Host", request.#authority];
    for (const [name, value] of request.#headers.entries()) {
      if (name.toLowerCase() !== "host") headers.push(name, Buffer.from(value).toString("latin1"));
    }
    const method = request.#method.tag === "other" ? request.#method.val : request.#method.tag;
    return egress("send", {
      method: method.toUpperCase(),
      scheme: request.#scheme?.tag === "HTTP" ? "http:" : "https:",
      authority: request.#authority,
      path: request.#pathWithQuery,
      headers,
      bodySlot: sendBody(request.#body),
      rules,
      timeouts: {
        connect: options?.connectTimeout(),
        firstByte: options?.firstByteTimeout(),
        betweenBytes: options?.betweenBytesTimeout(),
      },
    });
  }
}
const send = OutgoingRequest._send;
delete OutgoingRequest._send;

class IncomingBody {
  #stream;

  constructor(streamId) {
    this.#stream = inputStreamCreate(streamId);
  }

  stream() {
    if (this.#stream === null) throw undefined;
    const stream = this.#stream;
    this.#stream = null;
    return stream;
  }

  static finish() {
    return new shim.FutureTrailers();
  }
}

class IncomingResponse {
  #status;
  #headers;
  #body;

  constructor(status, headers, bodyStreamId) {
    this.#status = status;
    // As the bytes came (Node reads them as latin1, one byte to a character), without the
    // connection's own headers.
    this.#headers = receivedFields(
      headers.map(([name, value]) => [name, new Uint8Array(Buffer.from(value, "latin1"))]),
    );
    this.#body = new IncomingBody(bodyStreamId);
  }

  status() {
    return this.#status;
  }

  headers() {
    return this.#headers;
  }

  consume() {
    if (this.#body === null) throw undefined;
    const body = this.#body;
    this.#body = null;
    return body;
  }
}

class FutureIncomingResponse {
  #id;

  constructor(id) {
    this.#id = id;
  }

  subscribe() {
    return futureSubscribe(this.#id, this);
  }

  get() {
    const taken = futureTakeValue(this.#id);
    if (taken?.tag === "ok" && taken.val.tag === "ok") {
      const { status, headers, bodyStreamId } = taken.val.val;
      return { tag: "ok", val: { tag: "ok", val: new IncomingResponse(status, headers, bodyStreamId) } };
    }
    return taken;
  }

  [symbolDispose]() {
    if (this.#id !== null) futureDispose(this.#id);
    this.#id = null;
  }
}

export const types = {
  ...shim,
  Fields,
  FutureIncomingResponse,
  IncomingBody,
  IncomingResponse,
  OutgoingBody,
  OutgoingRequest,
};

export const outgoingHandler = {
  handle(request, options) {
    return new FutureIncomingResponse(send(request, options));
  },
};
