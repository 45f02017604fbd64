// The console is a client of the public HTTP API like any other: every request carries
// the logged-in user's credentials (HTTP Basic, kept in sessionStorage so a reload stays
// logged in and closing the tab forgets them), and the broker's grants decide what it
// may see and do.

import type { components } from "../../sdk-js/src/generated/openapi";

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

let unauthenticated: ((e: ApiError) => void) | null = null;

/**
 * Sets what happens when the API answers 401: the credentials no longer work (the
 * password changed, the user was deleted, or security was turned on), so they are
 * forgotten and the console asks for others.
 */
export function onUnauthenticated(f: ((e: ApiError) => void) | null): void {
  unauthenticated = f;
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
    const err = new ApiError(resp.status, code, message);
    if (resp.status === 401) {
      setLogin(null);
      unauthenticated?.(err);
    }
    throw err;
  }
  return (text ? JSON.parse(text) : undefined) as T;
}

export const enc = encodeURIComponent;

// The shapes the console reads, as openapi.yaml defines them (the parts it uses).

// The API's types, generated from openapi.yaml for the TypeScript SDK: the console
// uses the same, so a change of the spec reaches it through tsc.
type Schemas = components["schemas"];
export type Topic = Schemas["Topic"];
export type PartitionStats = Schemas["PartitionStats"];
export type TopicDetail = Schemas["TopicDetail"];
export type StatsSample = Schemas["StatsSample"];
export type TopicStats = Schemas["TopicStats"];
export type SyncRounds = Schemas["SyncRounds"];
export type NodeHealth = Schemas["NodeHealth"];
export type TopicStatsList = Schemas["TopicStatsList"];
export type Message = Schemas["Message"];
export type MessageRange = Schemas["MessageRange"];
export type ChildLag = Schemas["ChildLag"];
export type Child = Schemas["Child"];
export type Member = Schemas["Member"];
export type Cluster = Schemas["Cluster"];
export type Grant = Schemas["Grant"];
export type User = Schemas["User"];
