// The endpoint pool: the nodes in their configured order, with a per-node circuit
// breaker. Calls stick to the first healthy node (or to the node a call names, such as
// the one that leased a message) and move on only when it fails: rotating per call
// would split produces over nodes that may not be one cluster and send acks to nodes
// that never issued the lease. A node that fails `failureThreshold` times in a row leaves the rotation and
// is probed (GET /readyz) in the background, outside the rotation, with a doubling
// interval; the first 200 puts it back. When every node is out, calls still go to the
// one that has been out the longest, so a whole-cluster blip never turns into a
// client that refuses to try.

import type { BreakerOptions } from "../options.js";
import { unrefTimer } from "./util.js";

export interface Node {
  readonly url: string;
  failures: number;
  open: boolean;
  openedAt: number;
  probeDelay: number;
  probeTimer: ReturnType<typeof setTimeout> | undefined;
}

export class Pool {
  readonly nodes: Node[];
  private closed = false;
  private readonly threshold: number;
  private readonly probeMs: number;
  private readonly maxProbeMs: number;

  constructor(
    urls: readonly string[],
    opts: BreakerOptions,
    private readonly probe: (url: string) => Promise<boolean>,
    private readonly onChange: (url: string, state: "open" | "closed") => void,
  ) {
    this.nodes = urls.map((url) => ({ url, failures: 0, open: false, openedAt: 0, probeDelay: 0, probeTimer: undefined }));
    this.threshold = Math.max(1, opts.failureThreshold ?? 2);
    this.probeMs = Math.max(10, opts.probeIntervalMs ?? 2000);
    this.maxProbeMs = Math.max(this.probeMs, opts.maxProbeIntervalMs ?? 30_000);
  }

  /** find returns the node with this base URL, if it is one of the pool's. */
  find(url: string | undefined): Node | undefined {
    if (url === undefined) return undefined;
    const u = url.replace(/\/+$/, "");
    return this.nodes.find((n) => n.url === u);
  }

  /**
   * pick returns the node for the next attempt: `preferred` when it is in rotation and
   * not yet tried in this call, else the first node in the configured order that is in
   * rotation and not yet tried; when every node in rotation was tried, the same order
   * again (tried ones allowed). Nodes in `held` (asked the call to wait, Retry-After)
   * come only when no other node in rotation is left.
   */
  pick(tried: ReadonlySet<Node>, preferred?: Node, held?: ReadonlySet<Node>): Node {
    for (const allowHeld of held && held.size > 0 ? [false, true] : [true]) {
      for (const allowTried of [false, true]) {
        const ok = (n: Node) => !n.open && (allowTried || !tried.has(n)) && (allowHeld || !held?.has(n));
        if (preferred && ok(preferred)) return preferred;
        for (const node of this.nodes) if (ok(node)) return node;
      }
    }
    // Every node is out of rotation: try the one that has been out the longest.
    let best = this.nodes[0] as Node;
    for (const node of this.nodes) if (node.openedAt < best.openedAt) best = node;
    return best;
  }

  /** hasUntried reports whether a node in rotation is not in `tried`. */
  hasUntried(tried: ReadonlySet<Node>): boolean {
    return this.nodes.some((n) => !n.open && !tried.has(n));
  }

  success(node: Node): void {
    node.failures = 0;
    if (node.open) this.close(node);
  }

  failure(node: Node): void {
    node.failures++;
    if (!node.open && node.failures >= this.threshold && !this.closed) {
      node.open = true;
      node.openedAt = Date.now();
      node.probeDelay = this.probeMs;
      this.onChange(node.url, "open");
      this.scheduleProbe(node);
    }
  }

  private close(node: Node): void {
    node.open = false;
    node.failures = 0;
    if (node.probeTimer !== undefined) clearTimeout(node.probeTimer);
    node.probeTimer = undefined;
    this.onChange(node.url, "closed");
  }

  private scheduleProbe(node: Node): void {
    if (this.closed) return;
    node.probeTimer = setTimeout(() => {
      node.probeTimer = undefined;
      this.probe(node.url).then(
        (ok) => {
          if (!node.open || this.closed) return;
          if (ok) this.close(node);
          else {
            node.probeDelay = Math.min(this.maxProbeMs, node.probeDelay * 2);
            this.scheduleProbe(node);
          }
        },
        () => {
          if (!node.open || this.closed) return;
          node.probeDelay = Math.min(this.maxProbeMs, node.probeDelay * 2);
          this.scheduleProbe(node);
        },
      );
    }, node.probeDelay);
    unrefTimer(node.probeTimer);
  }

  shutdown(): void {
    this.closed = true;
    for (const node of this.nodes) {
      if (node.probeTimer !== undefined) clearTimeout(node.probeTimer);
      node.probeTimer = undefined;
    }
  }
}
