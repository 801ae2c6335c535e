"""A state service whose first attempts fail with UNAVAILABLE, as a restarting sidecar's do.

Real StateService and store behind a server interceptor that answers the first `failures`
attempts of each method with UNAVAILABLE and counts every attempt: what a client's retry
policy does is then visible in `attempts`.
"""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING, Any

import grpc

from agentstate.common.grpc_server import bind, create_server
from agentstate.state.v1 import state_service_pb2_grpc as pb_grpc
from agentstate.state_service.servicer import StateServicer
from agentstate.state_service.storage.base import StateStore

if TYPE_CHECKING:
    Interceptor = grpc.aio.ServerInterceptor[Any, Any]
else:  # not subscriptable at run time
    Interceptor = grpc.aio.ServerInterceptor


class Blips(Interceptor):
    """Fails the first `failures` attempts of each method with UNAVAILABLE; counts attempts."""

    def __init__(self) -> None:
        self.failures = 0
        self.attempts: Counter[str] = Counter()

    async def intercept_service(
        self,
        continuation: Callable[
            [grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler[Any, Any]]
        ],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[Any, Any]:
        method = handler_call_details.method.rsplit("/", 1)[-1]
        self.attempts[method] += 1
        if self.attempts[method] <= self.failures:
            return grpc.unary_unary_rpc_method_handler(self._unavailable)
        return await continuation(handler_call_details)

    @staticmethod
    async def _unavailable(request: bytes, context: grpc.aio.ServicerContext[Any, Any]) -> None:
        await context.abort(grpc.StatusCode.UNAVAILABLE, "injected: the sidecar is restarting")


@contextlib.asynccontextmanager
async def state_service_with_blips(store: StateStore) -> AsyncIterator[tuple[Blips, str]]:
    """A StateService on 127.0.0.1 over `store`, behind Blips (no failures until set)."""
    blips = Blips()
    server = create_server(max_message_bytes=1 << 20, interceptors=[blips])
    pb_grpc.add_StateServiceServicer_to_server(
        StateServicer(store, max_payload_bytes=1 << 20), server
    )
    address = bind(server, "127.0.0.1:0")
    await server.start()
    try:
        yield blips, address
    finally:
        await server.stop(None)
