import type { Body } from "./body.js";
import type { components } from "./generated/openapi.js";

type S = components["schemas"];

/** Produced says where a message was stored: it is durable once you have this. */
export interface Produced {
  /** The topic. */
  topic: string;
  /** The partition it went to. */
  partition: number;
  /** Its offset in that partition. */
  offset: number;
}

/** Outgoing is one message of a batch: a body and, optionally, where it goes. */
export interface Outgoing {
  /** The message (bytes, text or a JSON value; see {@link Body}). */
  body: Body;
  /** The key: the same key always lands in the same partition. */
  key?: string;
  /** A partition to pin, from 0; overrides `key` for placement. */
  partition?: number;
}

/** TopicSettings are a topic's tunables; every field is optional on create. */
export interface TopicSettings {
  /** Number of partitions (1 to 256, default 3). Fixed after create. */
  partitions?: number;
  /** How long messages are kept, in ms (default 7 days). */
  retentionMs?: number;
  /** Lease length of consumed messages, in ms (100 ms to 12 h, default 30 s). */
  visibilityTimeoutMs?: number;
  /** Most unacked leases per partition (default 1024). */
  maxInFlightPerPartition?: number;
  /** Most messages settled out of order past the ack frontier, per partition (default 1024). */
  maxAckedAheadPerPartition?: number;
  /** Replicas per partition (default 1 on a single node). */
  replicationFactor?: number;
  /** A JSON Schema (draft 2020-12) every produced payload must match (400 `schema_violation` otherwise). A child without one inherits its parent's. */
  schema?: Record<string, unknown> | null;
}

/** TopicSpec is what {@link Client.createTopic} takes. */
export interface TopicSpec extends TopicSettings {
  /** 1 to 249 characters of `a-z A-Z 0-9 . _ -`, not `.` or `..`. */
  name: string;
  /** Create the topic as a child of this one (fan-out; not yet offered by the broker: 501). */
  parent?: string;
  /** With `parent`: delay copies by this much, in ms (a delay child). */
  fanoutDelayMs?: number;
}

/** TopicChanges are the live-tunable settings {@link Client.alterTopic} can change. */
export interface TopicChanges {
  /** New retention, in ms. */
  retentionMs?: number;
  /** New lease length for leases taken from now on, in ms. */
  visibilityTimeoutMs?: number;
  /** New in-flight cap per partition. */
  maxInFlightPerPartition?: number;
  /** New acked-ahead cap per partition. */
  maxAckedAheadPerPartition?: number;
  /** New JSON Schema; null (sent as `{}`) removes it. */
  schema?: Record<string, unknown> | null;
  /**
   * New number of replicas per partition (1 to 7), reached in the background: the broker
   * adds or removes replicas through moves ({@link Client.listMoves}). More than the
   * cluster's nodes is a Conflict.
   */
  replicationFactor?: number;
}

/** TopicInfo is a topic's settings as the broker reports them. */
export interface TopicInfo {
  /** The name. */
  name: string;
  /** This life of the name: a topic deleted and created again gets a new one. */
  incarnation: string;
  /** Number of partitions. */
  partitions: number;
  /** Retention in ms. */
  retentionMs: number;
  /** Lease length in ms. */
  visibilityTimeoutMs: number;
  /** In-flight cap per partition. */
  maxInFlightPerPartition: number;
  /** Acked-ahead cap per partition. */
  maxAckedAheadPerPartition: number;
  /** Replicas per partition. */
  replicationFactor: number;
  /** The JSON Schema, or null when there is none. */
  schema: Record<string, unknown> | null;
  /** The parent topic, for a child. */
  parent: string | null;
  /** For a child: how long copies are delayed, in ms. */
  fanoutDelayMs: number | undefined;
  /** When the topic was created. */
  createdAt: Date;
}

/** PartitionStats describe one partition of a topic. */
export interface PartitionStats {
  /** The partition index. */
  partition: number;
  /** First offset still stored. */
  oldestOffset: number;
  /** The offset the next message will get. */
  nextOffset: number;
  /** Messages below this are durable and deliverable. */
  highWatermark: number;
  /** Every message below this is settled (or aged out). */
  ackFrontier: number;
  /** Messages at or past the frontier already settled. */
  ackedAhead: number;
  /** Messages under a lease now. */
  inFlight: number;
  /** Messages not yet settled. */
  backlog: number;
  /** The node that leads this partition. */
  leader: string;
  /** The nodes holding a replica. */
  replicas: string[];
  /**
   * False when the node holding the partition cannot be reached (or its replica is
   * handing its leadership over): the partition answers 503 for now, and the counters
   * above are unknown and given as 0.
   */
  available: boolean;
}

/** TopicDetail is a topic with one {@link PartitionStats} per partition. */
export interface TopicDetail extends TopicInfo {
  /** One entry per partition. */
  partitionStats: PartitionStats[];
}

/** AckEntry is one entry of {@link Client.ackBatch}. */
export interface AckEntry {
  /** The message's receipt handle. */
  receiptHandle: string;
  /** As ack's `extend`: `true` renews, a number of ms sets the lease end, 0 hands back. */
  extend?: true | number;
  /**
   * The endpoint that leased the message (`message.endpoint`). Entries are sent, one
   * request per endpoint, to the node that leased them; default the preferred endpoint.
   */
  endpoint?: string;
}

/** AckResult is the outcome of one {@link AckEntry}. */
export interface AckResult {
  /** The receipt handle of the entry. */
  receiptHandle: string;
  /**
   * Whether the entry succeeded: 204, or a 410 for an ack or hand-back whose earlier
   * attempt's reply was lost (that attempt settled it; reported as 204).
   */
  ok: boolean;
  /**
   * The status the entry would have had alone: 204, 400, 404, 410 or 503 (a 503 only
   * once the resends of that entry ran out).
   */
  status: number;
  /** The error, when it failed. */
  error: import("./errors.js").NaradError | undefined;
}

/** ChildLag is how far a child is behind its parent on one partition. */
export interface ChildLag {
  /** The parent's partition. */
  partition: number;
  /** The parent's next offset. */
  parentNextOffset: number;
  /** How far the copy to the child got. */
  childCursor: number;
  /** Messages not yet copied. */
  lag: number;
}

/** ChildInfo is one child topic of a parent. */
export interface ChildInfo {
  /** The child's name. */
  child: string;
  /** How long copies are delayed, in ms (0: plain fan-out). */
  fanoutDelayMs: number;
  /**
   * `running`, or `paused` while the child's owner may no longer consume the parent:
   * nothing is copied until the grant returns, then the copy resumes where it stopped.
   * `failing` for a remote child (a topic of another cluster) whose copy fails in some
   * partition; it is retried. Absent from a broker that does not say.
   */
  state?: "running" | "paused" | "failing";
  /** Why the copy is paused, and what to do; absent while it runs. */
  pausedReason?: string;
  /** Per-partition lag, when the broker reports it. */
  lag: ChildLag[];
}

/** Grant allows one action on topics given by exact names or prefix wildcards (`invoices.*`). */
export interface Grant {
  /** The action allowed. */
  action: "produce" | "consume" | "create" | "admin";
  /** Exact names or prefix wildcards. */
  topics: string[];
}

/** UserInfo is a user as the broker shows it (never the password). */
export interface UserInfo {
  /** The name. */
  username: string;
  /** What the user may do. */
  grants: Grant[];
}

/** Member is one node of the cluster. */
export interface Member {
  /** The node id. */
  id: string;
  /** Node-to-node address. */
  address: string;
  /** HTTP address, when known. */
  httpAddress: string | undefined;
  /** alive, suspect, dead, joining or decommissioning. */
  status: string;
  /** Whether it votes in the control plane. */
  voter: boolean | undefined;
  /** How many partition replicas it holds (undefined from a broker that does not say). */
  partitionsHeld: number | undefined;
  /** How many partitions it leads (undefined from a broker that does not say). */
  partitionsLed: number | undefined;
  /** The lowest cluster version its binary can run in, as it last reported. */
  minVersion: number | undefined;
  /** The highest cluster version it offers, as it last reported. */
  maxVersion: number | undefined;
}

/** ClusterInfo describes the cluster from the answering node's point of view. */
export interface ClusterInfo {
  /** The cluster's id (undefined from a broker that does not send one). */
  clusterId: string | undefined;
  /** The node that answered. */
  nodeId: string;
  /** The node that leads the control plane. */
  controller: string;
  /** The cluster version the controller committed (undefined from a broker that does not send one). */
  version: number | undefined;
  /** Every member. */
  members: Member[];
}

/**
 * MoveStatus is where a move is, in this order: `copying` (the new replica catches up;
 * the only status {@link Client.cancelMove} can stop), `switching` (the replica set is
 * switched; it finishes from here on), `removing` (the old replica deletes its copy),
 * then `done`, `cancelled` or `failed`.
 */
export type MoveStatus = S["Move"]["status"];

/**
 * MoveCause is what started a move: `request` ({@link Client.movePartition}),
 * `decommission`, `replace` (a lost replica replaced, or a forced takeover growing the
 * replica set back), `rebalance` or `replication_factor`.
 */
export type MoveCause = S["Move"]["cause"];

/** Move is a move of one partition replica from one node to another. */
export interface Move {
  /** Names the move, for {@link Client.cancelMove}. */
  id: string;
  /** The topic. */
  topic: string;
  /** The partition. */
  partition: number;
  /** The node whose replica goes; "" when a replica is only added (a raised replication factor). */
  from: string;
  /** The node that gets a replica; "" when one is only removed (a lowered replication factor). */
  to: string;
  /** Where the move is. */
  status: MoveStatus;
  /** Why it failed or was cancelled; undefined otherwise. */
  reason: string | undefined;
  /** What started it. */
  cause: MoveCause;
  /** The share (0 to 1) of the partition's log the new replica holds. */
  progress: number;
  /** While copying, how many messages the new replica is behind; undefined otherwise. */
  lag: number | undefined;
  /** When the move started, in Unix ms. */
  createdAtMs: number;
  /** When its status last changed, in Unix ms. */
  updatedAtMs: number;
}

/** ForceLeaderResult is the outcome of {@link Client.forceLeader}. */
export interface ForceLeaderResult {
  /**
   * A lower bound of the messages lost: the highest high watermark any replica reported
   * to the control plane minus the log end of the replica that took over. More may be
   * lost; 0 proves nothing.
   */
  possiblyLostAtLeast: number;
  /** The partition's replica set right after the takeover; the broker grows it back through moves. */
  replicas: string[];
}

/** @internal */
export function topicFromWire(t: S["Topic"]): TopicInfo {
  return {
    name: t.name,
    incarnation: t.incarnation,
    partitions: t.partitions,
    retentionMs: t.retention_ms,
    visibilityTimeoutMs: t.visibility_timeout_ms,
    maxInFlightPerPartition: t.max_in_flight_per_partition,
    maxAckedAheadPerPartition: t.max_acked_ahead_per_partition,
    replicationFactor: t.replication_factor,
    // `{}` means no schema, as does its absence.
    schema: t.schema && Object.keys(t.schema).length > 0 ? t.schema : null,
    parent: t.parent ?? null,
    fanoutDelayMs: t.fanout_delay_ms,
    createdAt: new Date(t.created_at),
  };
}

/** @internal */
export function topicDetailFromWire(t: S["TopicDetail"]): TopicDetail {
  return {
    ...topicFromWire(t),
    partitionStats: t.partition_stats.map((p) => ({
      partition: p.partition,
      oldestOffset: p.oldest_offset,
      nextOffset: p.next_offset,
      highWatermark: p.high_watermark,
      ackFrontier: p.ack_frontier,
      ackedAhead: p.acked_ahead,
      inFlight: p.in_flight,
      backlog: p.backlog,
      leader: p.leader,
      replicas: p.replicas,
      available: p.available ?? true,
    })),
  };
}

/** @internal */
export function settingsToWire(s: TopicSettings & { parent?: string; fanoutDelayMs?: number }): Omit<S["CreateTopicRequest"], "name"> {
  const w: Omit<S["CreateTopicRequest"], "name"> = {};
  if (s.partitions !== undefined) w.partitions = s.partitions;
  if (s.retentionMs !== undefined) w.retention_ms = s.retentionMs;
  if (s.visibilityTimeoutMs !== undefined) w.visibility_timeout_ms = s.visibilityTimeoutMs;
  if (s.maxInFlightPerPartition !== undefined) w.max_in_flight_per_partition = s.maxInFlightPerPartition;
  if (s.maxAckedAheadPerPartition !== undefined) w.max_acked_ahead_per_partition = s.maxAckedAheadPerPartition;
  if (s.replicationFactor !== undefined) w.replication_factor = s.replicationFactor;
  if (s.schema !== undefined) w.schema = s.schema ?? {};
  if (s.parent !== undefined) w.parent = s.parent;
  if (s.fanoutDelayMs !== undefined) w.fanout_delay_ms = s.fanoutDelayMs;
  return w;
}

/** @internal */
export function memberFromWire(m: S["Member"]): Member {
  return {
    id: m.id,
    address: m.address,
    httpAddress: m.http_address,
    status: m.status,
    voter: m.voter,
    partitionsHeld: m.partitions_held,
    partitionsLed: m.partitions_led,
    minVersion: m.min_version,
    maxVersion: m.max_version,
  };
}

/** @internal */
export function moveFromWire(m: S["Move"]): Move {
  return {
    id: m.id,
    topic: m.topic,
    partition: m.partition,
    from: m.from,
    to: m.to,
    status: m.status,
    reason: m.reason,
    cause: m.cause,
    progress: m.progress,
    lag: m.lag,
    createdAtMs: m.created_at_ms,
    updatedAtMs: m.updated_at_ms,
  };
}

/** @internal */
export function childFromWire(c: S["Child"]): ChildInfo {
  return {
    child: c.child,
    fanoutDelayMs: c.fanout_delay_ms,
    ...(c.state === undefined ? {} : { state: c.state }),
    ...(c.paused_reason === undefined ? {} : { pausedReason: c.paused_reason }),
    lag: (c.lag ?? []).map((l) => ({ partition: l.partition, parentNextOffset: l.parent_next_offset, childCursor: l.child_cursor, lag: l.lag })),
  };
}
