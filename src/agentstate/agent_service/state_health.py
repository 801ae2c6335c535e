"""The agent's readiness follows its state service's health.

A turn cannot start, or save, without the state service, so the agent reports
grpc.health NOT_SERVING (overall and for AgentService) while the state service is
unreachable or itself NOT_SERVING (its database is away), and SERVING again once
it serves, as the state service's readiness follows its database. It watches
(grpc.health.v1 Watch on the state channel) rather than polls: a change shows at
once. Liveness is a health name of its own, LIVENESS_SERVICE, SERVING from start
to shutdown whatever the state service does: restarting the agent would not bring
the state service back.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from agentstate.state.v1 import state_service_pb2

log = logging.getLogger(__name__)

LIVENESS_SERVICE = "liveness"
STATE_SERVICE_NAME = state_service_pb2.DESCRIPTOR.services_by_name["StateService"].full_name
# Between two attempts to reach a state service that did not answer.
RETRY_SECONDS = 0.5

OnChange = Callable[[bool], Awaitable[None]]


class StateHealthWatch:
    """Calls `on_change(serving)` whenever the state service's health changes."""

    def __init__(self, channel: grpc.aio.Channel, address: str, on_change: OnChange) -> None:
        self._stub = health_pb2_grpc.HealthStub(channel)
        self._address = address
        self._on_change = on_change
        self.serving: bool | None = None  # None until the first answer (or failure)

    async def first(self, deadline_seconds: float) -> bool:
        """One Check, to start with the truth; False when it does not answer in time."""
        try:
            reply = await self._stub.Check(
                health_pb2.HealthCheckRequest(service=STATE_SERVICE_NAME),
                timeout=deadline_seconds,
            )
        except grpc.RpcError as exc:
            await self._changed(False, f"unreachable ({exc.code().name})")
        else:
            await self._changed(_is_serving(reply), _status_name(reply))
        return bool(self.serving)

    async def run(self) -> None:
        """Watch until cancelled; after a broken watch, try again every RETRY_SECONDS."""
        request = health_pb2.HealthCheckRequest(service=STATE_SERVICE_NAME)
        while True:
            try:
                async for reply in self._stub.Watch(request):
                    await self._changed(_is_serving(reply), _status_name(reply))
                reason = "the watch ended"
            except grpc.RpcError as exc:
                reason = f"unreachable ({exc.code().name})"
            await self._changed(False, reason)
            await asyncio.sleep(RETRY_SECONDS)

    async def _changed(self, serving: bool, reason: str) -> None:
        if serving == self.serving:
            return
        self.serving = serving
        if serving:
            log.info("the state service at %s is serving: this agent is ready", self._address)
        else:
            log.warning(
                "the state service at %s is not serving: %s; this agent reports NOT_SERVING "
                "until it is back",
                self._address,
                reason,
            )
        await self._on_change(serving)


def _is_serving(reply: health_pb2.HealthCheckResponse) -> bool:
    return bool(reply.status == health_pb2.HealthCheckResponse.SERVING)


def _status_name(reply: health_pb2.HealthCheckResponse) -> str:
    return f"its health is {health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)}"
