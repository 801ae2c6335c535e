"""The agent's readiness follows its state service's health; its liveness does not (issue 27).

A real state service (on the test PostgreSQL) is stopped and started again on the same
address under a running agent; the agent's grpc.health answers are read as a probe reads
them.
"""

from __future__ import annotations

import asyncio
import time

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from agentstate.agent_service.server import SERVICE_NAME
from agentstate.agent_service.state_health import LIVENESS_SERVICE, STATE_SERVICE_NAME
from tests.support.agent_harness import Stack

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
READINESS = ("", SERVICE_NAME)  # overall, and the service's own


async def statuses(address: str) -> dict[str, int]:
    async with grpc.aio.insecure_channel(address) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        answers = {}
        for name in (*READINESS, LIVENESS_SERVICE):
            reply = await stub.Check(health_pb2.HealthCheckRequest(service=name), timeout=2)
            answers[name] = reply.status
        return answers


async def wait_for(address: str, readiness: int, within: float = 5.0) -> float:
    """Seconds until both readiness names report `readiness`; liveness SERVING throughout."""
    started = time.monotonic()
    while True:
        now = await statuses(address)
        assert now[LIVENESS_SERVICE] == SERVING, now
        if all(now[name] == readiness for name in READINESS):
            return time.monotonic() - started
        assert time.monotonic() - started < within, now
        await asyncio.sleep(0.05)


async def test_readiness_follows_the_state_service_and_liveness_stays_up(
    database_url: str, orders_database_url: str
) -> None:
    await readiness_follows(Stack(database_url, orders_database_url))


async def test_readiness_follows_the_state_service_with_tracing_on(
    telemetry: tuple[InMemorySpanExporter, InMemoryMetricReader],
    database_url: str,
    orders_database_url: str,
) -> None:
    """Both services' tracing interceptors are in place (the manifests turn tracing on)."""
    exporter, _ = telemetry
    await readiness_follows(Stack(database_url, orders_database_url))
    health = [s.name for s in exporter.get_finished_spans() if "grpc.health" in s.name]
    assert health == []  # no trace per health check


async def readiness_follows(stack: Stack) -> None:
    await stack.start_state()
    try:
        agent = await stack.start_agent()
        assert await statuses(agent.address) == {
            "": SERVING,
            SERVICE_NAME: SERVING,
            LIVENESS_SERVICE: SERVING,
        }

        await stack.stop_state()
        await wait_for(agent.address, NOT_SERVING)
        await stack.start_state()  # the same address
        await wait_for(agent.address, SERVING)

        # Reachable but not serving (what it says while its database is away).
        assert stack.state_app is not None
        state_health = stack.state_app._health  # the state service's own health servicer
        await state_health.set(STATE_SERVICE_NAME, NOT_SERVING)
        await wait_for(agent.address, NOT_SERVING)
        await state_health.set(STATE_SERVICE_NAME, SERVING)
        await wait_for(agent.address, SERVING)
    finally:
        await stack.close()


async def test_an_agent_started_without_its_state_service_is_not_ready_until_it_comes(
    database_url: str, orders_database_url: str
) -> None:
    stack = Stack(database_url, orders_database_url)
    try:
        agent = await stack.start_agent()  # no state service yet
        await wait_for(agent.address, NOT_SERVING, within=0)
        await stack.start_state()
        await wait_for(agent.address, SERVING)
    finally:
        await stack.close()
