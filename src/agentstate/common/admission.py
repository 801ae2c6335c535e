"""Admission control: past its capacity a server refuses calls at once instead of
queueing them without bound.

A server process serves at most `max_in_flight` calls at a time; up to `max_queued`
more wait, first come first served, for one of those slots. A call beyond both is
refused before any work is done, with

- status UNAVAILABLE (not RESOURCE_EXHAUSTED, which this product uses for limits the
  caller must change, a payload too large or too many leases, and which callers do not
  retry): the condition is transient, and the service config's retryPolicy retries
  UNAVAILABLE, so gRPC itself retries the reads, possibly on another replica;
- a google.rpc.ErrorInfo, reason OVERLOADED, metadata {"retry_after_ms": ...}: it
  tells this refusal (nothing was done, so even a write may be sent again) from an
  UNAVAILABLE after which a write may or may not have been applied;
- gRPC's retry pushback trailer `grpc-retry-pushback-ms`: gRPC core (every language)
  waits that long before its next attempt instead of its own backoff, and
  agentstate.client does the same for the calls the channel does not retry.

The pushback is `retry_after_ms`, scattered over ±50 % so the refused callers do not
come back in one wave. Calls whose client gave up (deadline, cancellation) while
queued leave the queue. grpc.health and server reflection are never refused: a
replica that is busy is not a dead one (its probes must keep answering).

Memory stays bounded: at most max_in_flight + max_queued requests are held in Python
at once; a refused request is dropped as soon as its status is sent.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import random
from dataclasses import dataclass
from typing import Any

import grpc

from agentstate.common.error_details import ErrorDetail, abort
from agentstate.common.telemetry import meter
from agentstate.common.unary_guard import UnaryBehaviour, UnaryGuardInterceptor

REASON = "OVERLOADED"
RETRY_AFTER_MS = "retry_after_ms"  # ErrorInfo.metadata key
PUSHBACK_TRAILER = "grpc-retry-pushback-ms"
# Never refused: probes and tooling.

REFUSED = meter("agentstate.admission").create_counter(
    "agentstate.admission.refused",
    description="Calls refused at capacity (UNAVAILABLE, reason OVERLOADED), by rpc.method",
)


@dataclass(frozen=True)
class AdmissionLimits:
    max_in_flight: int  # calls served at once; 0 = no admission control
    max_queued: int  # calls waiting for a slot
    retry_after_ms: int  # the pushback sent with a refusal (±50 %)


class Admission:
    """The slots of one server process (one event loop)."""

    def __init__(self, limits: AdmissionLimits) -> None:
        self.limits = limits
        self.in_flight = 0
        self._waiting: collections.deque[asyncio.Future[None]] = collections.deque()
        self.refused = 0  # since start, for tests and metrics
        self._scatter = random.Random()

    @property
    def queued(self) -> int:
        return len(self._waiting)

    def try_enter(self) -> asyncio.Future[None] | bool:
        """True: a slot is taken. A future: queued, the slot is ours once it is done.
        False: refused (nothing taken)."""
        if self.in_flight < self.limits.max_in_flight:
            self.in_flight += 1
            return True
        if len(self._waiting) < self.limits.max_queued:
            waiter = asyncio.get_running_loop().create_future()
            self._waiting.append(waiter)
            return waiter
        self.refused += 1
        return False

    def leave(self) -> None:
        """Give the slot to the longest waiter still waiting, else free it."""
        while self._waiting:
            waiter = self._waiting.popleft()
            if not waiter.done():
                waiter.set_result(None)  # the slot passes on: in_flight unchanged
                return
        self.in_flight -= 1

    def abandon(self, waiter: asyncio.Future[None]) -> None:
        """A queued call went away (cancelled). If the slot had already been handed to
        it, pass it on."""
        if waiter.done() and not waiter.cancelled():
            self.leave()
            return
        waiter.cancel()
        with contextlib.suppress(ValueError):
            self._waiting.remove(waiter)

    def pushback_ms(self) -> int:
        base = self.limits.retry_after_ms
        return max(1, round(base * self._scatter.uniform(0.5, 1.5)))


def _refusal_message(limits: AdmissionLimits, pushback_ms: int) -> str:
    return (
        f"this server is at capacity ({limits.max_in_flight} calls in flight and "
        f"{limits.max_queued} queued): the call was refused before anything was done; "
        f"retry after {pushback_ms} ms, or on another replica"
    )


async def refuse(
    context: grpc.aio.ServicerContext[Any, Any], admission: Admission, method: str
) -> None:
    REFUSED.add(1, {"rpc.method": method})
    pushback = admission.pushback_ms()
    await abort(
        context,
        grpc.StatusCode.UNAVAILABLE,
        _refusal_message(admission.limits, pushback),
        ErrorDetail(REASON, {RETRY_AFTER_MS: str(pushback)}),
        ((PUSHBACK_TRAILER, str(pushback)),),
    )


def admitted(behaviour: UnaryBehaviour, admission: Admission, method: str) -> UnaryBehaviour:
    """`behaviour` (the handler of `method`) run inside a slot, or refused."""
    name = method.rsplit("/", 1)[-1]

    async def guarded(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        entry = admission.try_enter()
        if entry is False:
            await refuse(context, admission, name)
        if entry is not True:
            assert isinstance(entry, asyncio.Future)
            try:
                await entry
            except asyncio.CancelledError:
                admission.abandon(entry)
                raise
        try:
            return await behaviour(request, context)
        finally:
            admission.leave()

    return guarded


class AdmissionInterceptor(UnaryGuardInterceptor):
    """Puts every unary-unary method (all of the services' RPCs) behind `admission`.

    Built once per method (UnaryGuardInterceptor): anything that looks at a call's
    metadata (authentication, tracing) goes outside this one."""

    def __init__(self, admission: Admission) -> None:
        super().__init__()
        self.admission = admission

    def guard(self, behaviour: UnaryBehaviour, method: str) -> UnaryBehaviour:
        return admitted(behaviour, self.admission, method)
