"""The guards that decide by method alone are put around each handler when it is
registered (agentstate.common.grpc_server), not run as interceptors on every call: the
same order, the same refusals, health included (docs/benchmarks.md, issue 26)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from agentstate.client.error_details import error_info
from agentstate.common.grpc_server import add_health_and_reflection, create_server, set_serving
from agentstate.common.unary_guard import UnaryBehaviour, UnaryGuardInterceptor
from agentstate.state.v1 import state_service_pb2 as pb
from agentstate.state.v1 import state_service_pb2_grpc as pb_grpc

GET_STATE = "/agentstate.state.v1.StateService/GetState"


class Recorded(UnaryGuardInterceptor):
    def __init__(self, name: str, seen: list[str]) -> None:
        super().__init__()
        self.name, self.seen, self.built = name, seen, 0

    def guard(self, behaviour: UnaryBehaviour, method: str) -> UnaryBehaviour:
        self.built += 1

        async def guarded(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
            self.seen.append(f"{self.name}:{type(request).__name__}")
            return await behaviour(request, context)

        return guarded


class Plain(grpc.aio.ServerInterceptor):  # type: ignore[type-arg]
    """An interceptor with no `wrap`: it stays an interceptor."""

    def __init__(self, seen: list[str]) -> None:
        self.seen = seen

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[Any]],
        details: grpc.HandlerCallDetails,
    ) -> Any:
        handler: Any = await continuation(details)
        behaviour = handler.unary_unary

        async def unary(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
            self.seen.append(f"plain:{type(request).__name__}")
            return await behaviour(request, context)

        return grpc.unary_unary_rpc_method_handler(
            unary,
            request_deserializer=handler.request_deserializer,
            response_serializer=handler.response_serializer,
        )


class State(pb_grpc.StateServiceServicer):
    def __init__(self, seen: list[str]) -> None:
        self.seen = seen

    async def GetState(self, request: Any, context: Any) -> pb.GetStateResponse:
        self.seen.append("handler")
        return pb.GetStateResponse(version=7)


@pytest.fixture
async def served() -> AsyncIterator[Callable[[list[Any], list[str]], Awaitable[str]]]:
    servers: list[grpc.aio.Server] = []

    async def serve(interceptors: list[Any], seen: list[str]) -> str:
        server = create_server(max_message_bytes=1 << 20, interceptors=interceptors)
        pb_grpc.add_StateServiceServicer_to_server(State(seen), server)  # type: ignore[abstract]
        health = add_health_and_reflection(server, ["agentstate.state.v1.StateService"])
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        await set_serving(health, ["agentstate.state.v1.StateService"])
        servers.append(server)
        return f"127.0.0.1:{port}"

    yield serve
    for server in servers:
        await server.stop(None)


async def test_guards_run_in_the_order_given_and_are_built_once(served: Any) -> None:
    seen: list[str] = []
    outer, inner = Recorded("outer", seen), Recorded("inner", seen)
    address = await served([outer, inner], seen)
    registered = outer.built
    assert registered == inner.built == len(pb.DESCRIPTOR.services_by_name["StateService"].methods)
    async with grpc.aio.insecure_channel(address) as channel:
        stub = pb_grpc.StateServiceStub(channel)
        for _ in range(3):
            assert (await stub.GetState(pb.GetStateRequest(user_id="u"))).version == 7
    call = ["outer:GetStateRequest", "inner:GetStateRequest", "handler"]
    assert seen == call * 3
    # Built when registered; a method found through the generic handler is wrapped once.
    assert outer.built <= registered + 1 and inner.built <= registered + 1


async def test_an_interceptor_before_a_guard_stays_outside_it(served: Any) -> None:
    seen: list[str] = []
    address = await served([Recorded("first", seen), Plain(seen), Recorded("last", seen)], seen)
    async with grpc.aio.insecure_channel(address) as channel:
        await pb_grpc.StateServiceStub(channel).GetState(pb.GetStateRequest(user_id="u"))
    # "first" comes before the plain interceptor: both stay interceptors, in order; only
    # "last" (and the decoding guard) are put around the handler.
    assert seen == [
        "first:GetStateRequest",
        "plain:GetStateRequest",
        "last:GetStateRequest",
        "handler",
    ]


async def test_an_undecodable_request_is_refused_before_any_guard_sees_a_request(
    served: Any,
) -> None:
    seen: list[str] = []
    address = await served([Recorded("guard", seen)], seen)
    async with grpc.aio.insecure_channel(address) as channel:
        raw = channel.unary_unary(GET_STATE, request_serializer=None, response_deserializer=None)
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await raw(b"\x0a\x02\xff\xfe")  # user_id: not UTF-8
    assert caught.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert "the GetState request could not be decoded" in str(caught.value.details())
    info = error_info(caught.value)
    assert info is not None and info.reason == "MALFORMED_REQUEST"
    assert seen == ["guard:_Undecodable"]  # the guard ran (outside), the handler did not


async def test_health_is_decoded_by_the_same_guard_and_left_to_itself_otherwise(
    served: Any,
) -> None:
    seen: list[str] = []
    address = await served([Recorded("guard", seen)], seen)
    async with grpc.aio.insecure_channel(address) as channel:
        health = health_pb2_grpc.HealthStub(channel)
        answer = await health.Check(health_pb2.HealthCheckRequest(service=""))
        assert answer.status == health_pb2.HealthCheckResponse.SERVING
        raw = channel.unary_unary(
            "/grpc.health.v1.Health/Check", request_serializer=None, response_deserializer=None
        )
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await raw(b"\x0a\x02\xff\xfe")
    assert caught.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert seen == []  # health is exempt from the guards
