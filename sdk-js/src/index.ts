/**
 * `@narad/client` — the TypeScript SDK of Narad, a durable message broker spoken over
 * plain HTTP. Zero runtime dependencies; native fetch; Node ≥ 20, Deno, Bun and edge
 * runtimes. Start with {@link Client}.
 *
 * @packageDocumentation
 */
export { Client, ProduceBatchError } from "./client.js";
export type {
  ProduceOptions,
  ProduceBatchOptions,
  ProduceResult,
  ReceiveOptions,
  MessagesOptions,
  ReadRangeOptions,
  MessageRange,
  DeleteTopicOptions,
  CreateUserOptions,
} from "./client.js";
export { Consumer, poisonBackoffMs } from "./consumer.js";
export type { ConsumeOptions, ConsumerStats, Handler, HandlerContext } from "./consumer.js";
export { Publisher } from "./publisher.js";
export type { PublisherOptions, PublishOptions } from "./publisher.js";
export { Replay, Position } from "./replay.js";
export type { ReplayOptions, PositionJSON } from "./replay.js";
export { Message } from "./message.js";
export type { MessageState, NackOptions, ExtendOptions, SettleOptions } from "./message.js";
export { Envelope, ENVELOPE_FORMAT } from "./envelope.js";
export type { EnvelopeOptions } from "./envelope.js";
export { RetryTiers, dueTopic } from "./tiers.js";
export type { RetryTier, RetryTiersOptions, TieredHandler, TieredMessage } from "./tiers.js";
export { encodeBody, MAX_MESSAGE_BYTES } from "./body.js";
export type { Body, EncodedBody, SelfEncoding } from "./body.js";
export {
  NaradError,
  BadRequestError,
  UnauthenticatedError,
  ForbiddenError,
  NotFoundError,
  ConflictError,
  TooLargeError,
  LeaseLostError,
  UnavailableError,
  ThrottledError,
  TimeoutError,
  ClosedError,
  NotImplementedError,
  InternalError,
  BufferFullError,
  isNaradError,
  isRetryable,
  isUncertain,
} from "./errors.js";
export type { ErrorCode, ErrorKind, SdkErrorCode, NaradErrorOptions, PartlyStored } from "./errors.js";
export type {
  ClientOptions,
  CallOptions,
  BasicAuth,
  RetryOptions,
  BreakerOptions,
  Logger,
  NaradEvent,
  OperationStartEvent,
  OperationEndEvent,
  AttemptEvent,
  RetryEvent,
  BreakerEvent,
  ConsumerEvent,
  ReplayEvent,
} from "./options.js";
export type {
  Produced,
  Outgoing,
  TopicSettings,
  TopicSpec,
  TopicChanges,
  TopicInfo,
  TopicDetail,
  PartitionStats,
  AckEntry,
  AckResult,
  ChildInfo,
  ChildLag,
  Grant,
  UserInfo,
  Member,
  ClusterInfo,
  Move,
  MoveStatus,
  MoveCause,
  ForceLeaderResult,
} from "./types.js";
