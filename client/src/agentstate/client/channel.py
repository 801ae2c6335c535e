"""The client's channels: message limits, quick reconnects, the service config, and the
caller's interceptors, on a grpc.aio channel (AsyncStateClient) or a grpc one (StateClient)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, TypeAlias

import grpc

from agentstate.client import service_config

if TYPE_CHECKING:
    from agentstate.client.tls import ChannelSecurity

    # What connect(interceptors=) takes: grpc.aio's interceptors, or grpc's four client
    # kinds (the stubs' union grpc.Interceptor).
    AsyncInterceptor: TypeAlias = grpc.aio.ClientInterceptor
    Interceptor: TypeAlias = grpc.Interceptor


def channel_options(max_message_bytes: int) -> list[tuple[str, str | int]]:
    return [
        ("grpc.max_receive_message_length", max_message_bytes),
        ("grpc.max_send_message_length", max_message_bytes),
        # A restarting sidecar is routine: reconnect quickly, not after gRPC's default
        # backoff of up to two minutes.
        ("grpc.initial_reconnect_backoff_ms", 100),
        ("grpc.min_reconnect_backoff_ms", 100),
        ("grpc.max_reconnect_backoff_ms", 2000),
        # Reads are retried on UNAVAILABLE (agentstate/client/service_config.json).
        *service_config.channel_options(),
    ]


def open_async_channel(
    address: str,
    max_message_bytes: int,
    interceptors: Sequence[AsyncInterceptor] | None,
    security: ChannelSecurity | None = None,
) -> grpc.aio.Channel:
    """Plaintext unless `security` asks for TLS (agentstate.client.tls)."""
    credentials = security.credentials() if security is not None else None
    options = [*channel_options(max_message_bytes), *(security.options() if security else [])]
    if credentials is not None:
        return grpc.aio.secure_channel(
            address, credentials, options=options, interceptors=interceptors
        )
    return grpc.aio.insecure_channel(address, options=options, interceptors=interceptors)


def open_channel(
    address: str,
    max_message_bytes: int,
    interceptors: Sequence[Interceptor] | None,
    security: ChannelSecurity | None = None,
) -> grpc.Channel:
    credentials = security.credentials() if security is not None else None
    options = [*channel_options(max_message_bytes), *(security.options() if security else [])]
    if credentials is not None:
        channel = grpc.secure_channel(address, credentials, options=options)
    else:
        channel = grpc.insecure_channel(address, options=options)
    return grpc.intercept_channel(channel, *interceptors) if interceptors else channel


async def close_async_channel(channel: grpc.aio.Channel) -> None:
    await channel.close(None)  # no grace period: calls still running are cancelled


def close_channel(channel: grpc.Channel) -> None:
    channel.close()
