// The Node host's API. The contract's types are jco's, generated from the WIT into gen/.
import type {
  State,
  LockInfo,
  HistoryEntry,
  Point,
  Restored,
} from "../gen/interfaces/meltano-state-backend-types.js";

export type { State, LockInfo, HistoryEntry, Point, Restored };

/** The contract's error cases, and "host" for a failure of this host. */
export type ErrorKind =
  | "invalid-config"
  | "invalid-input"
  | "unauthorized"
  | "unreachable"
  | "timeout"
  | "locked"
  | "lock-lost"
  | "server"
  | "host";

export class BackendError extends Error {
  kind: ErrorKind;
  detail?: unknown;
}

export interface Options {
  /** Let the component connect to loopback addresses (a local ClickHouse). */
  allowLoopback?: boolean;
  /** Refuse private networks too. */
  refusePrivate?: boolean;
  /** Names answered by this table ahead of the system resolver, as curl's `--resolve`: the
   * policy checks these addresses, and the connection goes to them. */
  resolve?: Record<string, string | string[]>;
  /** A PEM file of CA certificates to trust besides the system's (a private CA). */
  caBundle?: string;
  /** PEM files of a client certificate chain and its key, for mutual TLS (both or neither). */
  clientCert?: string;
  clientKey?: string;
  logLevel?: "debug" | "info" | "warn" | "error";
  /** A transpiled component module; the default is gen/clickhouse_state.js. */
  component?: string;
}

export const DEFAULT_COMPONENT: string;

export function open(
  uri: string,
  settings?: Record<string, string | number | boolean>,
  options?: Options,
): Promise<Store>;

export class Store {
  get(stateId: string): Promise<State | null>;
  set(state: State): Promise<void>;
  update(state: State): Promise<void>;
  delete(stateId: string): Promise<void>;
  clear(stateId: string): Promise<void>;
  stateIds(pattern?: string): Promise<string[]>;
  getAll(pattern?: string): Promise<State[]>;
  setAll(states: State[]): Promise<bigint>;
  clearAll(): Promise<bigint>;
  acquireLock(stateId: string): Promise<Lock>;
  setLocked(state: State, lock: Lock): Promise<void>;
  deleteLocked(lock: Lock): Promise<void>;
  lockInfo(stateId: string): Promise<LockInfo | null>;
  forceUnlock(stateId: string): Promise<boolean>;
  history(stateId: string, limit?: number): Promise<HistoryEntry[]>;
  getAt(stateId: string, point: Point): Promise<HistoryEntry>;
  restoreLocked(point: Point, lock: Lock): Promise<Restored>;
  clearStreamsLocked(streams: string[], lock: Lock): Promise<State>;
  migrate(): Promise<void>;
  schema(): Promise<string[]>;
  idle(): Promise<bigint | null>;
  close(): Promise<void>;
}

export class Lock {
  readonly stateId: string;
  readonly token: bigint;
  info(): Promise<LockInfo>;
  renew(): Promise<void>;
  release(): Promise<void>;
}
