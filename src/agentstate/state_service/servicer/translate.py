"""From the domain to gRPC: the status of each error class, its trailers and ErrorInfo,
latency metrics and timestamps."""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any, TypeVar

import grpc
from google.protobuf.timestamp_pb2 import Timestamp
from opentelemetry.metrics import Histogram

from agentstate.common import error_details
from agentstate.common.state_metrics import (
    VERSION_CONFLICTS,
)
from agentstate.state_service import domain as d
from agentstate.state_service.error_reasons import state_error_detail

log = logging.getLogger(__name__)


CURRENT_VERSION_TRAILER = "agentstate-current-version"


MISSING_TRAILER = "agentstate-missing"


AWAITING_MESSAGE_TRAILER = "agentstate-awaiting-message"


STATUS_CODES: dict[type, grpc.StatusCode] = {
    d.InvalidArgument: grpc.StatusCode.INVALID_ARGUMENT,
    d.NotFound: grpc.StatusCode.NOT_FOUND,
    d.VersionConflict: grpc.StatusCode.ABORTED,
    d.CheckpointConflict: grpc.StatusCode.ABORTED,
    d.PayloadTooLarge: grpc.StatusCode.RESOURCE_EXHAUSTED,
    d.ResourceExhausted: grpc.StatusCode.RESOURCE_EXHAUSTED,
    d.FailedPrecondition: grpc.StatusCode.FAILED_PRECONDITION,
    d.AlreadyExists: grpc.StatusCode.ALREADY_EXISTS,
    d.StoreUnavailable: grpc.StatusCode.UNAVAILABLE,
    d.PermissionDenied: grpc.StatusCode.PERMISSION_DENIED,
    d.CallerUnauthenticated: grpc.StatusCode.UNAUTHENTICATED,
    d.NotSupported: grpc.StatusCode.UNIMPLEMENTED,
    d.CiphertextRejected: grpc.StatusCode.DATA_LOSS,
    d.StoreError: grpc.StatusCode.INTERNAL,
}


Request = TypeVar("Request")


Response = TypeVar("Response")


Handler = Callable[[Any, Request, grpc.aio.ServicerContext[Any, Any]], Awaitable[Response]]


class _Throttle:
    """At most one log line per `interval` seconds, counting the ones left out."""

    def __init__(self, interval: float) -> None:
        self._interval = interval
        self._next = 0.0
        self._skipped = 0

    def due(self) -> bool:
        now = time.monotonic()
        if now < self._next:
            self._skipped += 1
            return False
        self._next = now + self._interval
        return True

    def take_skipped(self) -> int:
        skipped, self._skipped = self._skipped, 0
        return skipped


# During an outage calls fail fast, possibly thousands a second; the outage itself is
# logged once by the pool's watcher (agentstate/common/pg_pool.py).
_UNAVAILABLE_LOG = _Throttle(5.0)


def grpc_errors(handler: Handler[Request, Response]) -> Handler[Request, Response]:
    """Turn domain errors into gRPC statuses with the domain's message, their trailers
    and a google.rpc.ErrorInfo detail (agentstate.common.error_details)."""

    @functools.wraps(handler)
    async def wrapper(
        self: Any, request: Request, context: grpc.aio.ServicerContext[Any, Any]
    ) -> Response:
        try:
            return await handler(self, request, context)
        except d.StateServiceError as exc:
            trailers: tuple[tuple[str, str], ...] = ()
            if isinstance(exc, d.VersionConflict):
                trailers = ((CURRENT_VERSION_TRAILER, str(exc.current_version)),)
            elif isinstance(exc, d.NotFound):
                trailers = ((MISSING_TRAILER, exc.missing),)
            elif isinstance(exc, d.CardPending):
                trailers = ((AWAITING_MESSAGE_TRAILER, str(exc.message_id)),)
            code = status_code(exc)
            if code is grpc.StatusCode.UNAVAILABLE and _UNAVAILABLE_LOG.due():
                log.warning(
                    "%s: %s (%d more UNAVAILABLE since the last one logged)",
                    handler.__name__,
                    exc,
                    _UNAVAILABLE_LOG.take_skipped(),
                )
            # The trailers stay for existing clients; the ErrorInfo detail says the same.
            detail = state_error_detail(exc)
            await error_details.abort(context, code, str(exc), detail, trailers)

    return wrapper


def status_code(exc: d.StateServiceError) -> grpc.StatusCode:
    """The status of an error: that of its nearest class in the table (a subclass
    such as LeaseHeld answers as FailedPrecondition does)."""
    for kind in type(exc).__mro__:
        code = STATUS_CODES.get(kind)
        if code is not None:
            return code
    return grpc.StatusCode.INTERNAL


# Metric attributes are fixed sets: built once, not per call (the SDK only reads them).
_SERVER = {"side": "server"}
_OUTCOMES = {
    outcome: {"side": "server", "outcome": outcome}
    for outcome in ("ok", "error", "not_found", "version_conflict")
}


class timed:  # a context manager: `with timed(HISTOGRAM):`
    """Record a store call's latency by outcome; count version conflicts."""

    __slots__ = ("_histogram", "_started")

    def __init__(self, histogram: Histogram) -> None:
        self._histogram = histogram
        self._started = 0.0

    def __enter__(self) -> None:
        self._started = time.perf_counter()

    def __exit__(self, kind: type[BaseException] | None, exc: object, tb: object) -> None:
        elapsed = time.perf_counter() - self._started
        if kind is None:
            outcome = "ok"
        elif issubclass(kind, d.NotFound):
            outcome = "not_found"
        elif issubclass(kind, d.VersionConflict):
            outcome = "version_conflict"
            VERSION_CONFLICTS.add(1, _SERVER)
        else:
            outcome = "error"
        self._histogram.record(elapsed, _OUTCOMES[outcome])


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_NAIVE_EPOCH = datetime(1970, 1, 1)


def timestamp(value: datetime) -> Timestamp:
    """`value` as a Timestamp, as Timestamp.FromDatetime makes it (a naive datetime is
    UTC) in a third of its time: a response carries up to ten of them."""
    since = value - (_NAIVE_EPOCH if value.tzinfo is None else _EPOCH)
    return Timestamp(seconds=since.days * 86400 + since.seconds, nanos=since.microseconds * 1000)


def datetime_of(ts: Timestamp) -> datetime:
    return ts.ToDatetime(tzinfo=UTC)
