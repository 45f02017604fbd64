// The console is a client of the public HTTP API like any other: every request carries
// the logged-in user's credentials (HTTP Basic, kept in sessionStorage so a reload stays
// logged in and closing the tab forgets them), and the broker's grants decide what it
// may see and do.

export interface ApiErrorBody {
  code: string;
  message: string;
}

/** An answer other than 2xx, carrying the broker's JSON error as is. */
export class ApiError extends Error {
  constructor(
    readonly status: number,
    readonly code: string,
    message: string,
  ) {
    super(message);
  }
}

const storeKey = "narad-console-auth";

export interface Login {
  user: string;
  header: string; // the Authorization header value
}

export function savedLogin(): Login | null {
  const raw = sessionStorage.getItem(storeKey);
  if (!raw) return null;
  try {
    const v = JSON.parse(raw) as Login;
    return typeof v.user === "string" && typeof v.header === "string" ? v : null;
  } catch {
    return null;
  }
}

export function basicLogin(user: string, password: string): Login {
  // btoa takes Latin-1 only: encode the UTF-8 bytes first (the broker decodes UTF-8).
  const bytes = new TextEncoder().encode(`${user}:${password}`);
  let bin = "";
  for (const b of bytes) bin += String.fromCharCode(b);
  return { user, header: `Basic ${btoa(bin)}` };
}

export function saveLogin(l: Login | null): void {
  if (l) sessionStorage.setItem(storeKey, JSON.stringify(l));
  else sessionStorage.removeItem(storeKey);
}

let current: Login | null = savedLogin();

export function setLogin(l: Login | null): void {
  current = l;
  saveLogin(l);
}

export function login(): Login | null {
  return current;
}

/**
 * Calls the API. credentials: "omit" keeps the browser from showing its own password
 * prompt on a 401 (and from sending cached credentials); the Authorization header is
 * ours. Same-origin requests carry the Origin the broker's cross-site checks accept.
 */
export async function api<T>(method: string, path: string, body?: unknown): Promise<T> {
  const headers: Record<string, string> = { Accept: "application/json" };
  if (current) headers.Authorization = current.header;
  const init: RequestInit = { method, headers, credentials: "omit", cache: "no-store" };
  if (body !== undefined) {
    headers["Content-Type"] = "application/json";
    init.body = JSON.stringify(body);
  }
  const resp = await fetch(path, init);
  const text = await resp.text();
  if (!resp.ok) {
    let code = `http_${resp.status}`;
    let message = text || resp.statusText;
    try {
      const e = (JSON.parse(text) as { error?: ApiErrorBody }).error;
      if (e) {
        code = e.code;
        message = e.message;
      }
    } catch {
      // not JSON: show the text as it came
    }
    throw new ApiError(resp.status, code, message);
  }
  return (text ? JSON.parse(text) : undefined) as T;
}

export const enc = encodeURIComponent;

// The shapes the console reads, as openapi.yaml defines them (the parts it uses).

export interface Topic {
  name: string;
  incarnation: string;
  partitions: number;
  retention_ms: number;
  visibility_timeout_ms: number;
  max_in_flight_per_partition: number;
  max_acked_ahead_per_partition: number;
  replication_factor: number;
  schema?: unknown;
  parent?: string | null;
  fanout_delay_ms?: number;
  created_at: string;
}

export interface PartitionStats {
  partition: number;
  oldest_offset: number;
  next_offset: number;
  high_watermark: number;
  ack_frontier: number;
  acked_ahead: number;
  in_flight: number;
  backlog: number;
  leader: string;
  replicas: string[];
}

export interface TopicDetail extends Topic {
  partition_stats: PartitionStats[];
}

export interface StatsSample {
  at_ms: number;
  produced: number;
  acked: number;
  produce_rate: number;
  ack_rate: number;
  backlog: number;
  in_flight: number;
  oldest_unacked_age_ms: number;
}

export interface TopicStats {
  topic: string;
  node: string;
  interval_ms: number;
  samples: StatsSample[];
}

export interface SyncRounds {
  at_ms: number;
  interval_ms: number;
  rounds: number;
  files: number;
  rounds_per_second: number;
  mean_ms: number;
  max_ms: number;
}

/** The answering node's health and storage; /v1/stats carries it for admins only. */
export interface NodeHealth {
  id: string;
  ready: boolean;
  disk_free_bytes?: number;
  disk_size_bytes?: number;
  sync_mode: "group" | "file";
  sync?: SyncRounds;
}

export interface TopicStatsList {
  node: string;
  interval_ms: number;
  topics: TopicStats[];
  node_health?: NodeHealth;
}

export interface Message {
  topic: string;
  partition: number;
  offset: number;
  key?: string | null;
  payload: unknown;
  payload_encoding?: "base64";
  timestamp: number;
}

export interface ChildLag {
  partition: number;
  parent_next_offset: number;
  child_cursor: number;
  lag: number;
}

export interface Child {
  child: string;
  fanout_delay_ms: number;
  state?: "running" | "paused";
  paused_reason?: string;
  lag?: ChildLag[];
}

export interface Member {
  id: string;
  address: string;
  http_address?: string;
  status: string;
  voter?: boolean;
  partitions_held?: number;
  partitions_led?: number;
}

export interface Cluster {
  node_id: string;
  cluster_id?: string;
  controller: string;
  members: Member[];
}

export interface Grant {
  action: "produce" | "consume" | "create" | "admin";
  topics: string[];
}

export interface User {
  username: string;
  grants: Grant[];
}
