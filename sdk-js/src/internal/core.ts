// The part of the Client that the Consumer, Publisher and Replay use, and the batch
// encoding the Publisher shares with produceBatch. It lives apart from client.ts so
// that client.ts can import those three without them importing it back (an import
// circle makes load order matter and bundlers warn).

import { encodeBody, MAX_MESSAGE_BYTES, type Body } from "../body.js";
import { TooLargeError } from "../errors.js";
import type { components } from "../generated/openapi.js";
import type { ExtendOptions, Message } from "../message.js";
import type { CallOptions, Logger, NaradEvent } from "../options.js";
import type { Outgoing, Produced, TopicDetail } from "../types.js";
import type { Transport } from "./transport.js";
import { toBase64, utf8Decode } from "./util.js";

type S = components["schemas"];

/** @internal What the Consumer, Publisher and Replay need of a Client; Client implements it. */
export interface ClientCore {
  readonly logger: Logger;
  readonly transport: Transport;
  emit(e: NaradEvent): void;
  receive(topic: string, opts: CallOptions & { max?: number; waitMs?: number }): Promise<Message[]>;
  handBack(msgs: Message[]): Promise<void>;
  getTopic(name: string, opts?: CallOptions): Promise<TopicDetail>;
  extend(topic: string, handle: string, opts?: ExtendOptions): Promise<void>;
  produce(topic: string, body: Body, opts?: CallOptions & { key?: string; contentType?: string }): Promise<Produced>;
  sendBatch(topic: string, wire: S["OutgoingMessage"][], opts: CallOptions & { allowDuplicates?: boolean }): Promise<Produced[]>;
  readMessages(
    topic: string,
    partition: number,
    opts?: CallOptions & { from?: number; fromTime?: Date | number; max?: number; incarnation?: string },
  ): Promise<{ messages: Message[]; nextOffset: number; incarnation: string | undefined; damaged: number[] }>;
}

/** The body budget of one produce-batch request: under the broker's 8 MiB with room for framing. */
export const BATCH_BODY_BUDGET = 7 * 1024 * 1024;

/** @internal outgoingToWire encodes one batch message and estimates its wire size. */
export function outgoingToWire(m: Outgoing): { wire: S["OutgoingMessage"]; size: number } {
  const enc = encodeBody(m.body);
  if (enc.bytes.byteLength > MAX_MESSAGE_BYTES) {
    throw new TooLargeError(`a message is at most 1 MiB (1048576 bytes); this one is ${enc.bytes.byteLength}`, { code: "payload_too_large" });
  }
  let wire: S["OutgoingMessage"];
  let size: number;
  if (enc.kind === "json") {
    const text = utf8Decode(enc.bytes);
    wire = { payload: JSON.parse(text) as unknown };
    size = enc.bytes.byteLength;
  } else {
    const b64 = toBase64(enc.bytes);
    wire = { payload: b64, payload_encoding: "base64" };
    size = b64.length + 30;
  }
  if (m.key !== undefined) wire.key = m.key;
  if (m.partition !== undefined) wire.partition = m.partition;
  return { wire, size: size + (m.key?.length ?? 0) + 40 };
}
