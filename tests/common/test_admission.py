"""Admission control on a real gRPC server (agentstate.common.admission), and gRPC's
retry policy (the client's service config) honouring its pushback.

The server's GetState is a handler that holds its slot until the test lets it go, so
"at capacity" is exact: one call in flight, none queued.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any, cast

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from agentstate.client.channel import open_async_channel
from agentstate.client.error_details import error_info
from agentstate.common.admission import Admission, AdmissionLimits
from agentstate.common.grpc_server import add_health_and_reflection, create_server, set_serving
from agentstate.state.v1 import state_service_pb2 as pb
from agentstate.state.v1 import state_service_pb2_grpc as pb_grpc

SERVICE = "agentstate.state.v1.StateService"


@dataclass
class Held:
    """A server whose GetState calls wait for `release`; `started` counts them."""

    address: str
    admission: Admission
    release: asyncio.Event
    started: int = 0


async def _serve(limits: AdmissionLimits) -> tuple[grpc.aio.Server, Held]:
    admission = Admission(limits)
    server = create_server(max_message_bytes=1 << 20, admission=admission)
    held = Held("", admission, asyncio.Event())

    async def get_state(request: bytes, context: Any) -> pb.GetStateResponse:
        held.started += 1
        await held.release.wait()
        return pb.GetStateResponse(version=7)

    handler = grpc.unary_unary_rpc_method_handler(
        get_state, response_serializer=pb.GetStateResponse.SerializeToString
    )
    server.add_generic_rpc_handlers(
        [grpc.method_handlers_generic_handler(SERVICE, {"GetState": handler})]
    )
    health = add_health_and_reflection(server, [SERVICE])
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    await set_serving(health, [SERVICE])
    held.address = f"127.0.0.1:{port}"
    return server, held


@pytest.fixture
async def one_slot() -> AsyncIterator[Held]:
    """One call in flight, none queued, a pushback of 1 s (±50 %)."""
    server, held = await _serve(AdmissionLimits(max_in_flight=1, max_queued=0, retry_after_ms=1000))
    yield held
    held.release.set()
    await server.stop(None)


async def _until(condition: Callable[[], bool]) -> None:
    """Poll the server's counters (it runs on this loop) for up to 10 s."""
    for _ in range(1000):
        if condition():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("the server did not get there within 10 s")


async def _wait_started(held: Held, count: int) -> None:
    await _until(lambda: held.started >= count)


async def test_the_retry_policy_waits_the_pushback_between_its_attempts(one_slot: Held) -> None:
    """A read refused at capacity: gRPC retries it maxAttempts (4) times in all, each
    after the server's pushback (0.5-1.5 s), not its own backoff (0.1, 0.2, 0.4 s at
    most: 0.7 s in all); then the refusal reaches the caller, as the server sent it."""
    async with open_async_channel(one_slot.address, 1 << 20, None) as channel:
        stub = pb_grpc.StateServiceStub(channel)
        holder = asyncio.ensure_future(stub.GetState(pb.GetStateRequest(), timeout=30))
        await _wait_started(one_slot, 1)
        started = time.monotonic()
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await stub.GetState(pb.GetStateRequest(), timeout=30)
        waited = time.monotonic() - started
        assert one_slot.admission.refused == 4
        assert waited >= 3 * 0.5, waited
        assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
        info = error_info(refused.value)
        assert info is not None and info.reason == "OVERLOADED"
        one_slot.release.set()
        assert (await holder).version == 7


async def test_a_retried_read_is_served_once_the_slot_is_free(one_slot: Held) -> None:
    async with open_async_channel(one_slot.address, 1 << 20, None) as channel:
        stub = pb_grpc.StateServiceStub(channel)
        holder = asyncio.ensure_future(stub.GetState(pb.GetStateRequest(), timeout=30))
        await _wait_started(one_slot, 1)
        asyncio.get_running_loop().call_later(0.2, one_slot.release.set)
        got = await stub.GetState(pb.GetStateRequest(), timeout=30)
        assert got.version == 7 and (await holder).version == 7
        assert 1 <= one_slot.admission.refused < 4
        assert one_slot.admission.in_flight == 0


async def test_health_is_answered_at_capacity(one_slot: Held) -> None:
    async with grpc.aio.insecure_channel(one_slot.address) as channel:
        stub = pb_grpc.StateServiceStub(channel)
        holder = asyncio.ensure_future(stub.GetState(pb.GetStateRequest(), timeout=30))
        await _wait_started(one_slot, 1)
        checked = await health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(service=SERVICE), timeout=5
        )
        assert checked.status == health_pb2.HealthCheckResponse.SERVING
        one_slot.release.set()
        await holder


async def test_queued_calls_are_served_in_order_and_one_that_gives_up_leaves_the_queue() -> None:
    server, held = await _serve(AdmissionLimits(max_in_flight=1, max_queued=2, retry_after_ms=50))
    try:
        async with grpc.aio.insecure_channel(held.address) as channel:
            stub = pb_grpc.StateServiceStub(channel)
            first = asyncio.ensure_future(stub.GetState(pb.GetStateRequest(), timeout=30))
            await _wait_started(held, 1)
            quitter = stub.GetState(pb.GetStateRequest(), timeout=30)
            queued = asyncio.ensure_future(stub.GetState(pb.GetStateRequest(), timeout=30))
            await _until(lambda: held.admission.queued == 2)
            quitter.cancel()  # gives up while queued
            await _until(lambda: held.admission.queued == 1)
            # The queue has room again: one more waits, and a fourth is refused at once.
            third = asyncio.ensure_future(stub.GetState(pb.GetStateRequest(), timeout=30))
            await _until(lambda: held.admission.queued == 2)
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await stub.GetState(pb.GetStateRequest(), timeout=30)
            assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
            trailers: dict[str, Any] = dict(cast(Any, refused.value.trailing_metadata()))
            assert 25 <= int(trailers["grpc-retry-pushback-ms"]) <= 75
            held.release.set()
            assert [(await c).version for c in (first, queued, third)] == [7, 7, 7]
            assert held.started == 3  # the one that gave up never ran
            assert (held.admission.in_flight, held.admission.queued) == (0, 0)
    finally:
        held.release.set()
        await server.stop(None)
