import { ConflictError, NaradError, UnavailableError } from "./errors.js";
import type { ClientCore } from "./internal/core.js";
import { abortReason, sleep } from "./internal/util.js";
import type { Message } from "./message.js";
import type { ReplayEvent } from "./options.js";
import type { TopicDetail } from "./types.js";

/**
 * PositionJSON is the JSON form of a {@link Position}: the one form every Narad SDK
 * writes and reads (docs/sdk/contract.md, Replay), so a position saved here resumes in
 * Go or Python too, and the other way round.
 */
export interface PositionJSON {
  /** Next offset per partition number (a decimal string); may be empty. */
  offsets: Record<string, number>;
  /** Partitions not named start at the first message at or after this Unix ms time. */
  time_ms?: number;
  /** Partitions not named start at their end as the replay starts ({@link Position.latest}). */
  start?: "latest";
  /**
   * The topic incarnation the offsets belong to. Absent in positions saved by versions
   * that did not record it, and in one no replay has used yet: a replay from such a
   * position takes the topic's current incarnation.
   */
  incarnation?: string;
}

/**
 * Position says where a replay starts: per partition, the next offset to read; for
 * partitions not listed, the earliest retained message, the end of the log as of the
 * start, or the first message at or after a time. A {@link Replay} reports the position
 * after the last message it yielded, so an iteration can be resumed (also in another
 * process, through {@link Position.toJSON} and {@link Position.fromJSON}).
 *
 * A replay's position also names the topic's incarnation: offsets mean nothing in a
 * topic deleted and created again under the same name, so a replay from it then fails
 * with a Conflict error, code `incarnation_mismatch`, rather than reading the new
 * topic's messages at those offsets.
 */
export class Position {
  /** Next offset per partition. */
  readonly offsets: ReadonlyMap<number, number>;
  /** Where partitions without an offset start. */
  readonly otherwise: "earliest" | "latest" | { readonly time: number };
  /** The topic incarnation the offsets belong to, when known. */
  readonly incarnation: string | undefined;

  private constructor(offsets: ReadonlyMap<number, number>, otherwise: Position["otherwise"], incarnation: string | undefined) {
    this.offsets = offsets;
    this.otherwise = otherwise;
    this.incarnation = incarnation;
  }

  /** earliest starts every partition at its oldest retained message. */
  static earliest(): Position {
    return new Position(new Map(), "earliest", undefined);
  }

  /** latest starts every partition at its end as of the replay's start (only new messages). */
  static latest(): Position {
    return new Position(new Map(), "latest", undefined);
  }

  /** at starts every partition at its first message written at or after `time` (a Date or Unix ms). */
  static at(time: Date | number): Position {
    return new Position(new Map(), { time: time instanceof Date ? time.getTime() : time }, undefined);
  }

  /**
   * offsets starts the listed partitions at the given offsets (the next one to read);
   * partitions not listed start as `otherwise` says (default earliest). With
   * `incarnation`, a replay from it fails when the topic is another incarnation.
   */
  static offsets(
    offsets: Record<number, number> | ReadonlyMap<number, number>,
    otherwise: Position["otherwise"] = "earliest",
    incarnation?: string,
  ): Position {
    const m = offsets instanceof Map ? new Map(offsets) : new Map(Object.entries(offsets).map(([k, v]) => [Number(k), v] as [number, number]));
    return new Position(m, otherwise, incarnation);
  }

  /**
   * fromJSON reads a position any Narad SDK saved (the parsed JSON): the one form
   * {@link Position.toJSON} writes, and the forms the SDKs wrote before it — this one's
   * `otherwise` ("earliest", "latest" or `{ time }`), Go's `time` (RFC 3339), Python's
   * (the one form already). A key given as null counts as absent; other keys are
   * ignored. Malformed input (a partition or offset that is not an integer from 0, a
   * `time_ms` that is not an integer, a `start` other than "latest", two keys saying
   * where unnamed partitions start) throws a TypeError saying what is wrong.
   */
  static fromJSON(j: unknown): Position {
    const bad = (what: string): TypeError => new TypeError(`Position.fromJSON: ${what}`);
    if (typeof j !== "object" || j === null || Array.isArray(j)) throw bad('a saved position must be a JSON object, like {"offsets":{"0":12}}');
    const doc = Object.fromEntries(Object.entries(j).filter(([, v]) => v !== null && v !== undefined)) as Record<string, unknown>;
    const offsets = new Map<number, number>();
    const raw = doc["offsets"] ?? {};
    if (typeof raw !== "object" || Array.isArray(raw)) throw bad(`a saved position's offsets must be an object of partition to offset, not ${JSON.stringify(raw)}`);
    for (const [k, v] of Object.entries(raw as Record<string, unknown>)) {
      if (!/^(0|[1-9][0-9]*)$/.test(k) || Number(k) >= 2 ** 31) throw bad(`a saved position names partition ${JSON.stringify(k)}: a partition is a decimal number from 0`);
      if (!Number.isSafeInteger(v) || (v as number) < 0) throw bad(`a saved position gives partition ${k} the offset ${JSON.stringify(v)}: an offset is an integer from 0`);
      offsets.set(Number(k), v as number);
    }
    const starts = ["time_ms", "start", "time", "otherwise"].filter((k) => k in doc);
    if (starts.length > 1) throw bad(`a saved position has both ${starts.map((k) => JSON.stringify(k)).join(" and ")}: partitions not named start at one place`);
    let otherwise: Position["otherwise"] = "earliest";
    if ("time_ms" in doc) {
      const t = doc["time_ms"];
      if (!Number.isSafeInteger(t)) throw bad(`a saved position's time_ms is ${JSON.stringify(t)}: it is an integer, Unix milliseconds`);
      otherwise = { time: t as number };
    }
    if ("start" in doc) {
      if (doc["start"] !== "latest") throw bad(`a saved position's start is ${JSON.stringify(doc["start"])}: the only start is "latest" (absent: at time_ms, else the oldest message)`);
      otherwise = "latest";
    }
    if ("time" in doc) {
      const t = rfc3339Ms(doc["time"]);
      if (t === undefined) throw bad(`a saved position's time is ${JSON.stringify(doc["time"])}: it is an RFC 3339 time`);
      otherwise = { time: t };
    }
    if ("otherwise" in doc) {
      const o = doc["otherwise"];
      if (o === "earliest" || o === "latest") otherwise = o;
      else if (typeof o === "object" && !Array.isArray(o) && o !== null && "time" in o) {
        const t = (o as { time: unknown }).time;
        if (!Number.isSafeInteger(t)) throw bad(`a saved position's otherwise.time is ${JSON.stringify(t)}: it is an integer, Unix milliseconds`);
        otherwise = { time: t as number };
      } else throw bad(`a saved position's otherwise is ${JSON.stringify(o)}: it is "earliest", "latest" or {"time": Unix ms}`);
    }
    const inc = doc["incarnation"];
    if (inc !== undefined && typeof inc !== "string") throw bad(`a saved position's incarnation is ${JSON.stringify(inc)}: it is a string`);
    return Position.offsets(offsets, otherwise, inc);
  }

  /** offset returns the next offset of `partition`, or undefined when it starts as `otherwise` says. */
  offset(partition: number): number | undefined {
    return this.offsets.get(partition);
  }

  /**
   * toJSON gives the one JSON form of every Narad SDK (`JSON.stringify` uses it):
   * `offsets` always, in partition order; `time_ms` only for a time; `start: "latest"`
   * only for {@link Position.latest}; `incarnation` only when known.
   */
  toJSON(): PositionJSON {
    const offsets: Record<string, number> = {};
    for (const [p, o] of [...this.offsets].sort((a, b) => a[0] - b[0])) offsets[String(p)] = o;
    const j: PositionJSON = { offsets };
    if (typeof this.otherwise === "object") j.time_ms = this.otherwise.time;
    else if (this.otherwise === "latest") j.start = "latest";
    if (this.incarnation !== undefined) j.incarnation = this.incarnation;
    return j;
  }
}

const RFC3339 = /^(\d{4})-(\d{2})-(\d{2})[Tt](\d{2}):(\d{2}):(\d{2})(?:\.(\d+))?(?:[Zz]|([+-])(\d{2}):(\d{2}))$/;

/** rfc3339Ms reads an RFC 3339 time (Go's position form before the one form) as Unix ms, or undefined. */
function rfc3339Ms(v: unknown): number | undefined {
  const m = typeof v === "string" ? RFC3339.exec(v) : null;
  if (m === null) return undefined;
  const [y, mo, d, h, mi, s] = m.slice(1, 7).map(Number) as [number, number, number, number, number, number];
  // Not Date.UTC, which reads years 0 to 99 as 1900 to 1999.
  const t = new Date(0);
  t.setUTCFullYear(y, mo - 1, d);
  t.setUTCHours(h, mi, s, Number((m[7] ?? "").padEnd(3, "0").slice(0, 3)));
  if (mo < 1 || mo > 12 || t.getUTCDate() !== d || h > 23 || mi > 59 || s > 59) return undefined;
  const shift = m[8] === undefined ? 0 : (m[8] === "+" ? 1 : -1) * (Number(m[9]) * 60 + Number(m[10])) * 60_000;
  return t.getTime() - shift;
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
 *
 * A partition's position moves only by what the broker's reads answer: past each
 * message yielded, and to the `next_offset` of a read it took whole (past damaged
 * messages, which the broker never serves; back, when the broker says the log ends
 * below it). Damaged messages are reported through the client's `onEvent` hook as
 * {@link ReplayEvent}s. A bounded replay needs each partition's end as of its start:
 * while the node holding a partition cannot be reached that end is unknown, and the
 * replay asks again with the client's retry policy, then fails with an Unavailable
 * error rather than end without the partition.
 */
export class Replay implements AsyncIterable<Message> {
  private readonly cursors = new Map<number, number>();
  private start: Position;
  private incarnation: string | undefined;

  /** @internal Made by {@link Client.replay}. */
  constructor(
    private readonly client: ClientCore,
    /** The topic replayed. */
    readonly topic: string,
    private readonly opts: ReplayOptions,
  ) {
    this.start = opts.from ?? Position.earliest();
    this.incarnation = this.start.incarnation;
    for (const [p, o] of this.start.offsets) this.cursors.set(p, o);
  }

  /**
   * position is where a new replay should start to continue after the last message
   * this one yielded (for every partition it read or resolved), with the topic's
   * incarnation once the replay has learnt it.
   */
  get position(): Position {
    return Position.offsets(new Map(this.cursors), this.start.otherwise, this.incarnation);
  }

  /** Iterates over the messages. */
  async *[Symbol.asyncIterator](): AsyncGenerator<Message, void, undefined> {
    const { signal } = this.opts;
    const call = signal ? { signal } : {};
    const follow = this.opts.follow ?? false;
    let detail = await this.client.getTopic(this.topic, call);
    this.adopt(detail.incarnation);
    const parts = this.opts.partition !== undefined ? [this.opts.partition] : detail.partitionStats.map((s) => s.partition);
    // The partitions whose end this replay needs: every one when it is bounded; the
    // ones a latest position starts at their end otherwise.
    const latest = this.start.otherwise === "latest";
    const needEnd = parts.filter((p) => !follow || (latest && !this.cursors.has(p)));
    detail = await this.untilAvailable(detail, needEnd);
    const ends = new Map(detail.partitionStats.map((s) => [s.partition, s.nextOffset] as [number, number]));
    if (latest) {
      for (const p of parts) if (!this.cursors.has(p)) this.cursors.set(p, ends.get(p) ?? 0);
      this.start = Position.offsets(new Map(this.cursors), "earliest", this.incarnation);
    }
    const pageSize = Math.max(1, Math.min(1000, this.opts.pageSize ?? 100));
    const done = new Set<number>();
    for (;;) {
      let progressed = false;
      for (const p of parts) {
        if (done.has(p)) continue;
        if (signal?.aborted) throw abortReason(signal);
        const cursor = this.cursors.get(p);
        const end = ends.get(p) ?? 0;
        // A cursor past the end is read once all the same: the broker answers with the
        // end as next_offset, which the cursor follows (else a resumed replay would skip
        // the messages written from the end up to that cursor).
        if (!follow && cursor !== undefined && cursor === end) {
          done.add(p);
          continue;
        }
        const ro: { from?: number; fromTime?: number; max: number; incarnation?: string; signal?: AbortSignal } = { max: pageSize, ...call };
        if (cursor !== undefined) ro.from = cursor;
        else if (typeof this.start.otherwise === "object") ro.fromTime = this.start.otherwise.time;
        if (this.incarnation !== undefined) ro.incarnation = this.incarnation;
        let page: Awaited<ReturnType<ClientCore["readMessages"]>>;
        try {
          page = await this.client.readMessages(this.topic, p, ro);
        } catch (e) {
          if (e instanceof NaradError && e.code === "incarnation_mismatch") throw this.mismatch(undefined, e);
          throw e;
        }
        if (page.incarnation !== undefined) this.adopt(page.incarnation);
        let cut = false;
        for (const m of page.messages) {
          if (!follow && m.offset >= end) {
            cut = true;
            break;
          }
          this.cursors.set(p, m.offset + 1);
          progressed = true;
          yield m;
          if (signal?.aborted) throw abortReason(signal);
        }
        // Cut at the end: the position stays after the last message yielded, so the
        // messages not yielded are read by a replay resumed from it.
        if (!cut) this.cursors.set(p, page.nextOffset);
        const now = this.cursors.get(p);
        for (const offset of page.damaged) {
          if (now === undefined || offset >= now) continue; // not gone past yet: read (and reported) again
          progressed = true;
          this.client.emit({ type: "replay", topic: this.topic, event: "damaged", partition: p, offset });
        }
        if (follow) continue;
        // Bounded: done at the end, or when a read finds nothing left (aged out).
        if (cut || (now !== undefined && now >= end) || (page.messages.length === 0 && page.damaged.length === 0)) done.add(p);
      }
      if (done.size === parts.length) return;
      if (!progressed) {
        if (!follow) return;
        await sleep(this.opts.pollIntervalMs ?? 500, signal);
      }
    }
  }

  /**
   * untilAvailable returns topic info in which every partition of `need` is available,
   * asking again with the client's backoff while one is not (its stats are then 0 and
   * mean nothing). When the client's attempts run out it fails with an Unavailable
   * error naming the partition; the replay's signal ends the wait.
   */
  private async untilAvailable(detail: TopicDetail, need: readonly number[]): Promise<TopicDetail> {
    const { signal } = this.opts;
    const transport = this.client.transport;
    for (let attempt = 1; ; attempt++) {
      const down = need.filter((p) => detail.partitionStats.find((s) => s.partition === p)?.available === false);
      if (down.length === 0) return detail;
      if (attempt >= transport.attempts) {
        throw new UnavailableError(
          `replay of topic "${this.topic}": ${down.length === 1 ? "partition" : "partitions"} ${down.join(", ")} ${down.length === 1 ? "is" : "are"} unavailable (the node holding it cannot be reached), so where it ends is unknown; asked ${attempt} times`,
          { code: "unavailable" },
        );
      }
      this.client.logger.debug?.("narad: a replay waits for a partition to be available", { topic: this.topic, partitions: down, attempt });
      await sleep(transport.backoff(attempt), signal);
      detail = await this.client.getTopic(this.topic, signal ? { signal } : {});
      this.adopt(detail.incarnation);
    }
  }

  /** adopt takes the topic's incarnation when the replay has none yet, and fails when it differs from the one it has. */
  private adopt(incarnation: string): void {
    if (this.incarnation === undefined) this.incarnation = incarnation;
    else if (this.incarnation !== incarnation) throw this.mismatch(incarnation, undefined);
  }

  private mismatch(now: string | undefined, cause: unknown): ConflictError {
    const which = now === undefined ? `incarnation ${this.incarnation}` : `incarnation ${this.incarnation}, now ${now}`;
    return new ConflictError(
      `replay of topic "${this.topic}": the topic was deleted and created again since the position was taken (${which}), so its offsets name other messages; start again from a new position`,
      { code: "incarnation_mismatch", status: 409, retryable: false, cause },
    );
  }
}
