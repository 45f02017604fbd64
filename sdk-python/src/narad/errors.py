"""The error taxonomy shared by every Narad SDK.

Every failure the SDK raises is a :class:`NaradError`. The subclass says what happened
(the same names as the Go and TypeScript SDKs), and two attributes say what to do:

* ``retryable`` — retrying the same call is safe and may succeed;
* ``uncertain`` — the call may have taken effect even though it failed (a produce whose
  reply was lost: retrying may store a second copy).

Errors are mapped from the broker's ``{"error": {"code", "message"}}`` body and the HTTP
status in one place, :func:`error_from_response`, so every call agrees.
"""

from __future__ import annotations

import datetime
import email.utils
import json
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = [
    "BadRequest",
    "BufferFull",
    "Closed",
    "ClusterWarning",
    "Conflict",
    "Forbidden",
    "Internal",
    "LeaseLost",
    "NaradError",
    "NotFound",
    "Throttled",
    "Timeout",
    "TooLarge",
    "Unauthenticated",
    "Unavailable",
    "error_from_response",
]


class NaradError(Exception):
    """NaradError is the base of every error the SDK raises.

    Attributes:
        message: What happened and what to do, for people.
        status: The HTTP status the broker answered, or ``None`` when no answer arrived.
        code: The broker's stable machine name (an ``ErrorCode`` of openapi.yaml), or an
            SDK name such as ``connection_failed`` when no answer arrived.
        retryable: Whether retrying the same call is safe and may succeed.
        uncertain: Whether the call may have taken effect although it failed.
        retry_after: Seconds the broker asked to wait before retrying, if it said.
        partly_stored: Whether part of a ``produce_batch`` was stored although it failed
            (the broker's ``partly_stored``): the messages of the partitions that are not
            in ``failed_partitions`` are stored and will be delivered, so resending the
            whole batch stores them twice. Such an error is never resent by the SDK; it
            is ``uncertain`` and not ``retryable``.
        stored: With ``partly_stored``, how many messages of the batch were stored.
        failed_partitions: With ``partly_stored``, the partitions whose messages were not
            stored (with code ``timeout``: may or may not be stored).
        results: On a failed ``produce_batch``, one entry per message in order: its
            :class:`~narad.Produced` when its request stored it, else the error of its
            request (a batch over 1000 messages or about 7 MiB goes in several
            requests, which can fail separately).
    """

    default_retryable: bool = False

    def __init__(
        self,
        message: str,
        *,
        status: int | None = None,
        code: str = "",
        retryable: bool | None = None,
        uncertain: bool = False,
        retry_after: float | None = None,
        stored: int | None = None,
        failed_partitions: Sequence[int] | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.code = code
        self.retryable = self.default_retryable if retryable is None else retryable
        self.uncertain = uncertain
        self.retry_after = retry_after
        self.partly_stored = stored is not None
        self.stored = stored
        self.failed_partitions: tuple[int, ...] | None = (
            None if failed_partitions is None else tuple(failed_partitions))
        self.results: list[Any] | None = None
        if self.partly_stored:
            # Part of it is stored: resending the whole batch would store that part twice.
            self.retryable = False
            self.uncertain = True

    def __str__(self) -> str:
        parts = [self.message]
        if self.code:
            parts.append(f"code={self.code}")
        if self.status is not None:
            parts.append(f"status={self.status}")
        if self.uncertain:
            parts.append("uncertain")
        if self.partly_stored:
            parts.append(f"partly stored: {self.stored} stored, failed partitions "
                         f"{list(self.failed_partitions or ())}")
        return " ".join([parts[0], f"({', '.join(parts[1:])})"]) if len(parts) > 1 else parts[0]

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}({self.message!r}, status={self.status!r}, "
            f"code={self.code!r}, retryable={self.retryable}, uncertain={self.uncertain}"
            + (f", stored={self.stored!r}, failed_partitions={self.failed_partitions!r}"
               if self.partly_stored else "") + ")"
        )


class BadRequest(NaradError):
    """BadRequest (400): the request is malformed; fix it before retrying."""


class Unauthenticated(NaradError):
    """Unauthenticated (401): no or wrong credentials. Terminal for a consumer."""


class Forbidden(NaradError):
    """Forbidden (403): authenticated, but not allowed. Terminal for a consumer."""


class NotFound(NaradError):
    """NotFound (404): the topic, partition, user or route does not exist."""


class Conflict(NaradError):
    """Conflict (409): the request conflicts with the current state (it exists already)."""


class LeaseLost(NaradError):
    """LeaseLost (410): the lease behind a receipt handle is no longer held.

    The message lapsed, was handed back or was settled already; it is (or was)
    delivered again, so its result must not be acked.
    """


class TooLarge(NaradError):
    """TooLarge (413): a body or message is over its limit."""


class Throttled(NaradError):
    """Throttled (429, usually from a proxy): slow down; retryable after ``retry_after``."""

    default_retryable = True


class Unavailable(NaradError):
    """Unavailable (503 or no connection): the node cannot serve now; retryable.

    ``retry_after`` carries the broker's Retry-After when it sent one.
    """

    default_retryable = True


class Timeout(NaradError):
    """Timeout: no answer in time; retryable, and its outcome unknown.

    Raised when an attempt got no answer within its bound, and for the answers that say
    the same: 503 with code ``timeout``, 504, and 408 (as the Go SDK does).
    """

    default_retryable = True


class NotImplemented(NaradError):
    """NotImplemented (501): this broker version does not offer the operation yet.

    Not retryable: asking again gets the same answer until the broker is upgraded. It is
    left out of ``__all__`` so that ``from narad import *`` never hides Python's own
    ``NotImplemented``; use it as ``narad.NotImplemented``.
    """


class Internal(NaradError):
    """Internal (500): the broker hit a bug; the message says what to report.

    Not retried: the same request would most likely hit the same bug.
    """


class Closed(NaradError):
    """Closed: the client, publisher or consumer was closed before or during the call."""


class BufferFull(NaradError):
    """BufferFull: a Publisher's bounded buffer is full and the caller chose not to wait."""

    default_retryable = True


class ClusterWarning(UserWarning):
    """ClusterWarning: a client's endpoints are not one cluster (warned once per client).

    Calls still work, sticking to one node and settling each lease on the node that
    issued it, but messages produced to one node are not seen by the others.
    """


_BY_STATUS: dict[int, type[NaradError]] = {
    400: BadRequest,
    401: Unauthenticated,
    403: Forbidden,
    404: NotFound,
    409: Conflict,
    410: LeaseLost,
    413: TooLarge,
    429: Throttled,
    500: Internal,
    501: NotImplemented,
    503: Unavailable,
}

# Codes that say the broker refused before storing anything, so even a non-idempotent
# call (produce) can go to another node without risking a duplicate.
NOT_STORED_CODES = frozenset(
    {"unavailable", "storage_failed", "in_flight_full", "acked_ahead_full"}
)


def parse_retry_after(value: str | None) -> float | None:
    """parse_retry_after reads a Retry-After header as seconds from now.

    It takes delay-seconds or an HTTP date (RFC 9110 §10.2.3); None when absent or
    unreadable.
    """
    if not value:
        return None
    try:
        seconds = float(value.strip())
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(value.strip())
        except (TypeError, ValueError, IndexError):
            return None
        if when.tzinfo is None:
            when = when.replace(tzinfo=datetime.timezone.utc)
        seconds = (when - datetime.datetime.now(datetime.timezone.utc)).total_seconds()
    return max(0.0, seconds)


def error_from_response(
    status: int, headers: Mapping[str, str], body: bytes
) -> NaradError:
    """error_from_response maps an HTTP error answer to the matching NaradError.

    The body is expected to be ``{"error": {"code", "message"}}``; anything else (a
    proxy's HTML page, say) still yields the class for the status, with the raw text as
    message. A 503 whose code is ``timeout``, a 504 and a 408 are a :class:`Timeout`
    marked ``uncertain``: nobody can tell whether the operation took effect; so is a 503
    ``maybe_stored`` (an :class:`Unavailable`: a failed disk write the broker could not
    take back, whose data may be found stored after the node restarts). An error
    with ``partly_stored`` (a produce-batch of which part was stored) carries its
    ``stored`` and ``failed_partitions`` and is uncertain and not retryable, whatever
    its status.
    """
    code = ""
    message = ""
    stored: int | None = None
    failed: list[int] | None = None
    try:
        doc = json.loads(body) if body else None
        if isinstance(doc, dict) and isinstance(doc.get("error"), dict):
            err = doc["error"]
            code = str(err.get("code", ""))
            message = str(err.get("message", ""))
            stored, failed = _partly_stored(err.get("partly_stored"))
    except (ValueError, UnicodeDecodeError):
        pass
    if not message:
        text = body[:200].decode("utf-8", "replace").strip()
        message = text or f"HTTP {status}"
    if 300 <= status < 400:
        # The broker never redirects: something in front of it does (an http to https
        # redirect), and the request never reached the broker.
        message = (f"HTTP {status}: redirected to {headers.get('location') or '?'}; the "
                   f"broker never redirects: give the client the URL it names")
    retry_after = parse_retry_after(headers.get("retry-after"))
    cls = _BY_STATUS.get(status)
    if cls is None:
        cls = Unavailable if status == 502 else NaradError
    if code == "timeout" or status in (408, 504):
        return Timeout(message, status=status, code=code, uncertain=True, retry_after=retry_after,
                       stored=stored, failed_partitions=failed)
    # maybe_stored: a disk write failed and the broker could not take it back, so what
    # the request wrote may be found stored after the node restarts.
    return cls(message, status=status, code=code, retry_after=retry_after, stored=stored,
               failed_partitions=failed, uncertain=code == "maybe_stored")


def _partly_stored(doc: Any) -> tuple[int | None, list[int] | None]:
    """_partly_stored reads an error's ``partly_stored`` object: (stored, failed_partitions).

    (None, None) when it is absent or malformed: the error then says nothing was stored
    beyond what its code says.
    """
    if not isinstance(doc, dict):
        return None, None
    stored = doc.get("stored")
    failed = doc.get("failed_partitions")
    if not isinstance(stored, int) or isinstance(stored, bool):
        return None, None
    parts = [p for p in failed if isinstance(p, int)] if isinstance(failed, list) else []
    return stored, parts
