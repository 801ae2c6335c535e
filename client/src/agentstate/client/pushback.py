"""A server at capacity refuses a call and says when to come back: the client waits that
long and sends the call again.

A refusal is status UNAVAILABLE with the ErrorInfo reason OVERLOADED and gRPC's retry
pushback trailer `grpc-retry-pushback-ms` (the state service's admission control). It is
made before the server does anything, so sending the call again is safe even for a write.
The reads that the service config retries (service_config.json) are retried by gRPC itself,
which honours the pushback; the client retries the others, with the same bound on
attempts (MAX_ATTEMPTS, the service config's maxAttempts) and within the call's deadline.
Every other failure goes to the caller as before: a write that failed any other way may or
may not have been applied, and only the caller can tell.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterable
from functools import cache
from typing import cast

import grpc

from agentstate.client.error_details import error_info
from agentstate.client.service_config import service_config_json

PUSHBACK_TRAILER = "grpc-retry-pushback-ms"
OVERLOADED = "OVERLOADED"
STATE_SERVICE = "agentstate.state.v1.StateService"


@cache
def _config_retries() -> tuple[frozenset[str], int]:
    """The StateService methods the service config retries, and its maxAttempts."""
    config = json.loads(service_config_json())
    methods: set[str] = set()
    attempts = 1
    for entry in config.get("methodConfig", []):
        policy = entry.get("retryPolicy")
        if not policy:
            continue
        attempts = max(attempts, int(policy.get("maxAttempts", 1)))
        for name in entry.get("name", []):
            if name.get("service") == STATE_SERVICE and name.get("method"):
                methods.add(name["method"])
    return frozenset(methods), attempts


def retried_by_channel(method: str) -> bool:
    return method in _config_retries()[0]


MAX_ATTEMPTS = _config_retries()[1]


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


def retry_delay(
    error: grpc.RpcError, method: str, attempts: int, deadline: float
) -> float | None:
    """The wait before attempt `attempts + 1` of `method`, or None to give up: not a
    refusal at capacity, the channel already retried it, no attempts left, or the wait
    would pass the call's deadline (time.monotonic())."""
    if retried_by_channel(method) or attempts >= MAX_ATTEMPTS:
        return None
    delay = pushback_seconds(error)
    if delay is None or time.monotonic() + delay >= deadline:
        return None
    return delay


async def async_pause(seconds: float) -> None:
    await asyncio.sleep(seconds)


def pause(seconds: float) -> None:
    time.sleep(seconds)
