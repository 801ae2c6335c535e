"""A server at capacity refuses a call and says when to come back: the client waits that
long and sends the call again.

A refusal is status UNAVAILABLE with the ErrorInfo reason OVERLOADED and gRPC's retry
pushback trailer `grpc-retry-pushback-ms` (the state service's admission control). It is
made before the server does anything, so sending the call again is safe even for a write.
The reads that the service config retries (service_config.json) are retried by gRPC itself
first, which waits the pushback between its attempts; when its attempts are spent, and for
every other call, the client goes on: it waits the pushback and sends the call again, until
the call's deadline. The pushback is the server's to choose (scattered, so the refused
callers do not come back in one wave), so waiting callers cost the server one cheap refusal
each per pushback, and the caller's deadline bounds how long it waits.
Every other failure goes to the caller as before: a write that failed any other way may or
may not have been applied, and only the caller can tell.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable
from typing import cast

import grpc

from agentstate.client.error_details import error_info

PUSHBACK_TRAILER = "grpc-retry-pushback-ms"
OVERLOADED = "OVERLOADED"


def pushback_seconds(error: grpc.RpcError) -> float | None:
    """How long the server asked us to wait, when `error` is its refusal at capacity;
    None for any other failure (or a pushback that says not to retry: negative)."""
    call = cast(grpc.Call, error)
    if call.code() is not grpc.StatusCode.UNAVAILABLE:
        return None
    pairs = cast(Iterable[tuple[str, str | bytes]], call.trailing_metadata() or ())
    delay = next((value for key, value in pairs if key == PUSHBACK_TRAILER), None)
    if delay is None:
        return None
    info = error_info(error)
    if info is None or info.reason != OVERLOADED:
        return None
    try:
        ms = int(delay)
    except ValueError:
        return None
    return ms / 1000 if ms >= 0 else None


def retry_delay(error: grpc.RpcError, deadline: float) -> float | None:
    """The wait before sending the call again, or None to give up: not a refusal at
    capacity, or the wait would pass the call's deadline (time.monotonic())."""
    delay = pushback_seconds(error)
    if delay is None or time.monotonic() + delay >= deadline:
        return None
    return delay


async def async_pause(seconds: float) -> None:
    await asyncio.sleep(seconds)


def pause(seconds: float) -> None:
    time.sleep(seconds)
