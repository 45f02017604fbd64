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
from collections.abc import Mapping

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
    ) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.code = code
        self.retryable = self.default_retryable if retryable is None else retryable
        self.uncertain = uncertain
        self.retry_after = retry_after

    def __str__(self) -> str:
        parts = [self.message]
        if self.code:
            parts.append(f"code={self.code}")
        if self.status is not None:
            parts.append(f"status={self.status}")
        if self.uncertain:
            parts.append("uncertain")
        return " ".join([parts[0], f"({', '.join(parts[1:])})"]) if len(parts) > 1 else parts[0]

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}({self.message!r}, status={self.status!r}, "
            f"code={self.code!r}, retryable={self.retryable}, uncertain={self.uncertain})"
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
    """Timeout: no answer within the call's deadline; retryable, and its outcome unknown."""

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
    message. A 503 whose code is ``timeout`` is marked ``uncertain``: the broker could
    not tell whether the operation took effect.
    """
    code = ""
    message = ""
    try:
        doc = json.loads(body) if body else None
        if isinstance(doc, dict) and isinstance(doc.get("error"), dict):
            err = doc["error"]
            code = str(err.get("code", ""))
            message = str(err.get("message", ""))
    except (ValueError, UnicodeDecodeError):
        pass
    if not message:
        text = body[:200].decode("utf-8", "replace").strip()
        message = text or f"HTTP {status}"
    retry_after = parse_retry_after(headers.get("retry-after"))
    cls = _BY_STATUS.get(status)
    if cls is None:
        cls = Unavailable if status == 502 else NaradError
    if code == "timeout" or status == 504:
        return Timeout(message, status=status, code=code, uncertain=True, retry_after=retry_after)
    return cls(message, status=status, code=code, retry_after=retry_after)
