"""A server interceptor that puts one guard around every unary-unary method handler.

The guarded handler is built once per method and reused: a call pays one dictionary
lookup, not a new handler. So whatever the guard decides per call, it decides inside the
handler it returns, and the interceptors inside this one must decide by method alone.
Health and reflection are left as they are.

Because it decides by method alone, such a guard can also be put around each handler
when the handler is registered (`wrap`), with no interceptor at all:
agentstate.common.grpc_server does that, since grpc.aio runs its interceptor chain (a
coroutine per interceptor) on every call, cached handler or not."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import grpc

EXEMPT_PREFIXES = ("/grpc.health.v1.Health/", "/grpc.reflection.")

UnaryBehaviour = Callable[[Any, grpc.aio.ServicerContext[Any, Any]], Awaitable[Any]]


class UnaryGuardInterceptor(grpc.aio.ServerInterceptor):  # type: ignore[type-arg]
    """Subclasses say what the guard is (`guard`); this caches it per method."""

    def __init__(self) -> None:
        self._guarded: dict[str, Any] = {}

    def guard(self, behaviour: UnaryBehaviour, method: str) -> UnaryBehaviour:
        """`behaviour` (the method's handler) wrapped; `method` is "/pkg.Service/Rpc"."""
        raise NotImplementedError

    def wrap(self, handler: Any, method: str) -> Any:
        """`handler` (a method handler being registered for `method`) guarded, or as it
        is (health, reflection, anything but unary-unary)."""
        if handler is None or handler.unary_unary is None or method.startswith(EXEMPT_PREFIXES):
            return handler
        return grpc.unary_unary_rpc_method_handler(
            self.guard(handler.unary_unary, method),
            request_deserializer=handler.request_deserializer,
            response_serializer=handler.response_serializer,
        )

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[Any]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> Any:
        method = str(handler_call_details.method)
        guarded = self._guarded.get(method)
        if guarded is not None:
            return guarded
        handler: Any = await continuation(handler_call_details)
        guarded = self.wrap(handler, method)
        if guarded is handler:
            return handler  # not cached: the continuation stays authoritative
        self._guarded[method] = guarded
        return guarded
