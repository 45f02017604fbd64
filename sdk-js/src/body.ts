import { utf8Encode } from "./internal/util.js";

/**
 * Body is what can be produced. Bytes (`Uint8Array`, any typed array or `ArrayBuffer`)
 * are sent as they are (`application/octet-stream`); a `string` is UTF-8 text
 * (`text/plain`); anything else is a JSON value, encoded with `JSON.stringify`
 * (`application/json`). An {@link Envelope} is sent as its JSON form. Consumers always
 * get the exact bytes back; JSON decoding is a convenience on top, never a guess.
 */
export type Body = Uint8Array | ArrayBuffer | ArrayBufferView | string | number | boolean | null | object;

/** EncodedBody is a body as it goes on the wire. */
export interface EncodedBody {
  /** The bytes stored. */
  bytes: Uint8Array;
  /** The Content-Type that says how the broker shows them to plain HTTP consumers. */
  contentType: string;
  /** Which of the three kinds the body was taken as. */
  kind: "bytes" | "text" | "json";
}

/** isEncodable lets other modules (the envelope) plug their own encoding in. */
export interface SelfEncoding {
  /** Returns the wire form of this value. */
  toBody(): EncodedBody;
}

function isSelfEncoding(v: unknown): v is SelfEncoding {
  return typeof v === "object" && v !== null && typeof (v as { toBody?: unknown }).toBody === "function";
}

/**
 * encodeBody turns a {@link Body} into bytes and a content type. `contentType`
 * overrides the type chosen from the body's JavaScript type (the bytes stay the same).
 */
export function encodeBody(body: Body, contentType?: string): EncodedBody {
  let out: EncodedBody;
  if (body instanceof Uint8Array) out = { bytes: body, contentType: "application/octet-stream", kind: "bytes" };
  else if (body instanceof ArrayBuffer) out = { bytes: new Uint8Array(body), contentType: "application/octet-stream", kind: "bytes" };
  else if (ArrayBuffer.isView(body)) out = { bytes: new Uint8Array(body.buffer, body.byteOffset, body.byteLength), contentType: "application/octet-stream", kind: "bytes" };
  else if (typeof body === "string") out = { bytes: utf8Encode(body), contentType: "text/plain; charset=utf-8", kind: "text" };
  else if (isSelfEncoding(body)) out = body.toBody();
  else {
    const json = JSON.stringify(body);
    if (json === undefined) throw new TypeError("produce: the body is not JSON-encodable (undefined, a function or a symbol)");
    out = { bytes: utf8Encode(json), contentType: "application/json", kind: "json" };
  }
  return contentType === undefined ? out : { ...out, contentType };
}

/** MAX_MESSAGE_BYTES is the broker's limit on one message (1 MiB). */
export const MAX_MESSAGE_BYTES = 1 << 20;
