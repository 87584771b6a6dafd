// Request bodies in the IO worker, by slot (src/http.js numbers them). The component and the
// request meet here in either order: a request may be sent before its body is written, and the
// shim forgets a stream when the component drops it. A body counts as sent only once the
// component finishes it; dropped unfinished, it aborts its request, as WASI says.

/** One body: `stream` once written (null once finished unwritten), and how it ended. */
class Slot {
  stream = undefined;
  finished = false;
  aborted = false;
  /** The component is done with it (finished or aborted); the request is done with it. */
  componentDone = false;
  requestDone = false;
  #listeners = [];

  changed() {
    for (const listener of this.#listeners.splice(0)) listener();
  }

  /** Resolves once `ready()` holds. */
  until(ready) {
    return new Promise((resolve) => {
      const check = () => (ready() ? resolve() : this.#listeners.push(check));
      check();
    });
  }
}

const slots = new Map();

function slot(id) {
  let found = slots.get(id);
  if (!found) {
    found = new Slot();
    slots.set(id, found);
  }
  return found;
}

/** Forgets a slot once both sides are done with it. */
function settle(id, found) {
  if (found.componentDone && found.requestDone) slots.delete(id);
}

/** Ends a body nobody will send, so that the component sees the end rather than waiting: the
 * writes it waits on (a full buffer, a flush) complete first, as destroying alone would leave
 * their callbacks uncalled; then the stream is gone, and its next write fails. */
export function release(stream) {
  if (!stream || stream.destroyed) return;
  stream.unpipe();
  stream.resume();
  setImmediate(() => stream.destroy());
}

/** The component wrote: `stream` is the body. */
export function written(id, stream) {
  const found = slot(id);
  if (found.aborted || found.requestDone) release(stream);
  else found.stream = stream;
  found.changed();
}

/** The component finished the body (unwritten: there is none). */
export function finished(id) {
  const found = slot(id);
  found.finished = true;
  found.componentDone = true;
  if (found.stream === undefined) found.stream = null;
  found.changed();
  settle(id, found);
}

/** The component dropped the body unfinished: its request fails. */
export function aborted(id) {
  const found = slot(id);
  found.aborted = true;
  found.componentDone = true;
  release(found.stream);
  found.changed();
  settle(id, found);
}

/** The body of a request: null for none; a stream once written. Throws when the component
 * dropped it unfinished. */
export async function take(id) {
  if (id === null) return null;
  const found = slot(id);
  await found.until(() => found.stream !== undefined || found.aborted);
  if (found.aborted) throw abortedError();
  return found.stream;
}

/** Resolves once the component finished the body; throws when it dropped it unfinished. */
export async function whole(id) {
  const found = slot(id);
  await found.until(() => found.finished || found.aborted);
  if (found.aborted) throw abortedError();
}

/** The request is done with its body (answered, or failed): a body not sent is released. */
export function done(id) {
  if (id === null) return;
  const found = slot(id);
  found.requestDone = true;
  release(found.stream);
  found.changed();
  settle(id, found);
}

function abortedError() {
  return { tag: "internal-error", val: "the request's body was dropped before it was finished" };
}

/** How many bodies are kept (for tests). */
export const kept = () => slots.size;
