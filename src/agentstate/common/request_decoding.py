"""Requests that cannot be decoded are INVALID_ARGUMENT, not UNKNOWN.

grpcio turns an exception in a request deserializer (corrupt protobuf, a string field
that is not UTF-8) into UNKNOWN, which tells a caller nothing it can act on. This
server interceptor gives every unary-request method a deserializer that never raises
and answers an undecodable request with INVALID_ARGUMENT and an ErrorInfo, before the
servicer sees anything.
"""

from __future__ import annotations

import inspect
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc

from agentstate.common.error_details import ErrorDetail, abort

REASON = "MALFORMED_REQUEST"


class _Undecodable:
    """Stands in for a request whose bytes did not decode."""

    __slots__ = ("reason",)

    def __init__(self, reason: str) -> None:
        self.reason = reason


def _safe(deserialize: Callable[[bytes], Any]) -> Callable[[bytes], Any]:
    def decode(data: bytes) -> Any:
        try:
            return deserialize(data)
        except Exception as exc:  # any decoding failure is the caller's malformed bytes
            return _Undecodable(" ".join(str(exc).split()) or type(exc).__name__)

    return decode


async def _refuse(context: grpc.aio.ServicerContext[Any, Any], method: str, why: str) -> None:
    await abort(
        context,
        grpc.StatusCode.INVALID_ARGUMENT,
        f"the {method} request could not be decoded ({why}); check that it is a valid "
        "protobuf message of the request type and that string fields are UTF-8",
        ErrorDetail(REASON),
    )


def decoding(handler: Any, method: str) -> Any:
    """`handler` (a method handler of `method`, "/pkg.Service/Rpc") with a deserializer
    that never raises and a refusal of what it could not decode; as it is for a handler
    with a streamed request (or none)."""
    if handler is None or handler.request_deserializer is None or handler.request_streaming:
        return handler
    name = method.rsplit("/", 1)[-1]
    decode = _safe(handler.request_deserializer)
    if handler.unary_unary is not None:
        unary: Any = handler.unary_unary

        async def unary_unary(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
            if isinstance(request, _Undecodable):
                await _refuse(context, name, request.reason)
            return await unary(request, context)

        return grpc.unary_unary_rpc_method_handler(
            unary_unary,
            request_deserializer=decode,
            response_serializer=handler.response_serializer,
        )
    if handler.unary_stream is not None:
        streaming: Any = handler.unary_stream

        async def unary_stream(
            request: Any, context: grpc.aio.ServicerContext[Any, Any]
        ) -> AsyncIterator[Any]:
            if isinstance(request, _Undecodable):
                await _refuse(context, name, request.reason)
            async for response in streaming(request, context):
                yield response

        async def unary_stream_by_writes(
            request: Any, context: grpc.aio.ServicerContext[Any, Any]
        ) -> None:
            if isinstance(request, _Undecodable):
                await _refuse(context, name, request.reason)
            await streaming(request, context)

        # A handler may stream by yielding or, like grpc.health's Watch, by
        # context.write(): each needs a wrapper of its own kind.
        by_writes = inspect.iscoroutinefunction(streaming)
        return grpc.unary_stream_rpc_method_handler(
            unary_stream_by_writes if by_writes else unary_stream,
            request_deserializer=decode,
            response_serializer=handler.response_serializer,
        )
    return handler


class DecodeErrorsAsInvalidArgument(grpc.aio.ServerInterceptor):  # type: ignore[type-arg]
    """`decoding` as an interceptor; agentstate.common.grpc_server applies `wrap` to
    each handler as it is registered instead (no interceptor runs per call)."""

    def wrap(self, handler: Any, method: str) -> Any:
        return decoding(handler, method)

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[Any]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> Any:
        # Typed as Any: grpc-stubs describe the synchronous handlers only.
        handler: Any = await continuation(handler_call_details)
        return decoding(handler, str(handler_call_details.method))
