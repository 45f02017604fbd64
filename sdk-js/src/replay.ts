import type { ClientCore } from "./internal/core.js";
import { abortReason, sleep } from "./internal/util.js";
import type { Message } from "./message.js";

/** PositionJSON is the serialisable form of a {@link Position}. */
export interface PositionJSON {
  /** Next offset per partition index. */
  offsets: Record<string, number>;
  /** Where partitions without an offset start. */
  otherwise: "earliest" | "latest" | { time: number };
}

/**
 * Position says where a replay starts: per partition, the next offset to read; for
 * partitions not listed, the earliest retained message, the end of the log as of the
 * start, or the first message at or after a time. A {@link Replay} reports the position
 * after the last message it yielded, so an iteration can be resumed (also in another
 * process, through {@link Position.toJSON} and {@link Position.fromJSON}).
 */
export class Position {
  /** Next offset per partition. */
  readonly offsets: ReadonlyMap<number, number>;
  /** Where partitions without an offset start. */
  readonly otherwise: "earliest" | "latest" | { readonly time: number };

  private constructor(offsets: ReadonlyMap<number, number>, otherwise: Position["otherwise"]) {
    this.offsets = offsets;
    this.otherwise = otherwise;
  }

  /** earliest starts every partition at its oldest retained message. */
  static earliest(): Position {
    return new Position(new Map(), "earliest");
  }

  /** latest starts every partition at its end as of the replay's start (only new messages). */
  static latest(): Position {
    return new Position(new Map(), "latest");
  }

  /** at starts every partition at its first message written at or after `time` (a Date or Unix ms). */
  static at(time: Date | number): Position {
    return new Position(new Map(), { time: time instanceof Date ? time.getTime() : time });
  }

  /**
   * offsets starts the listed partitions at the given offsets (the next one to read);
   * partitions not listed start as `otherwise` says (default earliest).
   */
  static offsets(offsets: Record<number, number> | ReadonlyMap<number, number>, otherwise: Position["otherwise"] = "earliest"): Position {
    const m = offsets instanceof Map ? new Map(offsets) : new Map(Object.entries(offsets).map(([k, v]) => [Number(k), v] as [number, number]));
    return new Position(m, otherwise);
  }

  /** fromJSON reads what {@link Position.toJSON} wrote. */
  static fromJSON(j: PositionJSON): Position {
    return Position.offsets(
      new Map(Object.entries(j.offsets).map(([k, v]) => [Number(k), v] as [number, number])),
      j.otherwise,
    );
  }

  /** offset returns the next offset of `partition`, or undefined when it starts as `otherwise` says. */
  offset(partition: number): number | undefined {
    return this.offsets.get(partition);
  }

  /** toJSON gives a plain object to store and hand to {@link Position.fromJSON}. */
  toJSON(): PositionJSON {
    const offsets: Record<string, number> = {};
    for (const [p, o] of [...this.offsets].sort((a, b) => a[0] - b[0])) offsets[String(p)] = o;
    return { offsets, otherwise: typeof this.otherwise === "string" ? this.otherwise : { time: this.otherwise.time } };
  }
}

/** ReplayOptions shape a {@link Replay}. */
export interface ReplayOptions {
  /** Where to start (default {@link Position.earliest}). */
  from?: Position;
  /** Replay only this partition (default every partition of the topic). */
  partition?: number;
  /**
   * Keep following new messages after reaching the end (default false: stop at the end
   * of each partition as of the start).
   */
  follow?: boolean;
  /** How long a following replay waits when every partition is at its end, in ms (default 500). */
  pollIntervalMs?: number;
  /** Messages per read request (1 to 1000, default 100). */
  pageSize?: number;
  /** Ends the iteration: it rejects with the signal's reason. */
  signal?: AbortSignal;
}

/**
 * Replay iterates over a topic's log without leases (nothing is reserved or settled),
 * partitions taking turns a page at a time, each in log order. Use it with
 * `for await`; {@link Replay.position} tells where to resume.
 */
export class Replay implements AsyncIterable<Message> {
  private readonly cursors = new Map<number, number>();
  private start: Position;

  /** @internal Made by {@link Client.replay}. */
  constructor(
    private readonly client: ClientCore,
    /** The topic replayed. */
    readonly topic: string,
    private readonly opts: ReplayOptions,
  ) {
    this.start = opts.from ?? Position.earliest();
    for (const [p, o] of this.start.offsets) this.cursors.set(p, o);
  }

  /**
   * position is where a new replay should start to continue after the last message
   * this one yielded (for every partition it read or resolved).
   */
  get position(): Position {
    return Position.offsets(new Map(this.cursors), this.start.otherwise);
  }

  /** Iterates over the messages. */
  async *[Symbol.asyncIterator](): AsyncGenerator<Message, void, undefined> {
    const { signal } = this.opts;
    const call = signal ? { signal } : {};
    const detail = await this.client.getTopic(this.topic, call);
    const parts = this.opts.partition !== undefined ? [this.opts.partition] : detail.partitionStats.map((s) => s.partition);
    const ends = new Map(detail.partitionStats.map((s) => [s.partition, s.nextOffset] as [number, number]));
    for (const p of parts) {
      // A cursor past the end (a position from an older life of the topic, say) would be
      // echoed back by the broker as next_offset and skip everything written below it.
      const c = this.cursors.get(p);
      const end = ends.get(p);
      if (c !== undefined && end !== undefined && c > end) this.cursors.set(p, end);
    }
    if (this.start.otherwise === "latest") {
      for (const p of parts) if (!this.cursors.has(p)) this.cursors.set(p, ends.get(p) ?? 0);
      this.start = Position.offsets(new Map(this.cursors), "earliest");
    }
    const follow = this.opts.follow ?? false;
    const pageSize = Math.max(1, Math.min(1000, this.opts.pageSize ?? 100));
    const done = new Set<number>();
    for (;;) {
      let progressed = false;
      for (const p of parts) {
        if (done.has(p)) continue;
        if (signal?.aborted) throw abortReason(signal);
        const cursor = this.cursors.get(p);
        const end = ends.get(p) ?? 0;
        if (!follow && cursor !== undefined && cursor >= end) {
          done.add(p);
          continue;
        }
        const ro: { from?: number; fromTime?: number; max: number; signal?: AbortSignal } = { max: pageSize, ...call };
        if (cursor !== undefined) ro.from = cursor;
        else if (typeof this.start.otherwise === "object") ro.fromTime = this.start.otherwise.time;
        const page = await this.client.readMessages(this.topic, p, ro);
        let stop = false;
        for (const m of page.messages) {
          if (!follow && m.offset >= end) {
            stop = true;
            break;
          }
          this.cursors.set(p, m.offset + 1);
          progressed = true;
          yield m;
          if (signal?.aborted) throw abortReason(signal);
        }
        if (stop) {
          done.add(p);
          continue;
        }
        const before = this.cursors.get(p);
        if (before === undefined || page.nextOffset > before) this.cursors.set(p, page.nextOffset);
        if (page.messages.length === 0 && !follow) done.add(p); // nothing left below the end (aged out)
      }
      if (done.size === parts.length) return;
      if (!progressed) {
        if (!follow) return;
        await sleep(this.opts.pollIntervalMs ?? 500, signal);
      }
    }
  }
}
