"""The client's channels: message limits, quick reconnects, the service config, and the
caller's interceptors, on a grpc.aio channel (AsyncStateClient) or a grpc one (StateClient)."""

from __future__ import annotations

import asyncio
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


class AsyncChannels:
    """grpc.aio channels to one address, one per event loop.

    A grpc.aio channel belongs to the loop it was made on: used from a later
    `asyncio.run` it fails with "Event loop is closed", and made outside any loop it
    fails with "attached to a different loop". So the channel is opened on the first call
    in each running loop, and the channel of a loop that has closed is dropped."""

    def __init__(
        self,
        address: str,
        max_message_bytes: int,
        interceptors: Sequence[AsyncInterceptor] | None = None,
        *,
        security: ChannelSecurity | None = None,
        borrowed: grpc.aio.Channel | None = None,
    ) -> None:
        self._address = address
        self._max_message_bytes = max_message_bytes
        self._interceptors = interceptors
        self._security = security
        # A channel the caller made and closes: used as it is, on whatever loop it has.
        self._borrowed = borrowed
        self._by_loop: dict[asyncio.AbstractEventLoop, grpc.aio.Channel] = {}
        self._closed = False

    @classmethod
    def of(cls, channel: grpc.aio.Channel) -> AsyncChannels:
        return cls("", 0, borrowed=channel)

    def current(self) -> grpc.aio.Channel:
        """The channel of the running loop (opened now when it has none)."""
        if self._borrowed is not None:
            return self._borrowed
        if self._closed:  # as a closed grpc.aio channel says it
            raise grpc.aio.UsageError("Channel is closed.")
        loop = asyncio.get_running_loop()
        channel = self._by_loop.get(loop)
        if channel is None:
            for old in [old for old in self._by_loop if old.is_closed()]:
                del self._by_loop[old]  # its loop is gone, and its channel with it
            channel = open_async_channel(
                self._address, self._max_message_bytes, self._interceptors, self._security
            )
            self._by_loop[loop] = channel
        return channel

    async def close(self) -> None:
        """Close the channels: the running loop's here, another live loop's on that loop;
        the channel of a closed loop is only dropped (it went with its loop)."""
        self._closed = True
        if self._borrowed is not None:
            await close_async_channel(self._borrowed)
        running = asyncio.get_running_loop()
        opened, self._by_loop = self._by_loop, {}
        for loop, channel in opened.items():
            if loop is running:
                await close_async_channel(channel)
            elif loop.is_running():
                asyncio.run_coroutine_threadsafe(close_async_channel(channel), loop)


class Channels:
    """The sync twin of AsyncChannels: a grpc channel has no loop, so one channel."""

    def __init__(
        self,
        address: str,
        max_message_bytes: int,
        interceptors: Sequence[Interceptor] | None = None,
        *,
        security: ChannelSecurity | None = None,
        borrowed: grpc.Channel | None = None,
    ) -> None:
        self._channel = (
            borrowed
            if borrowed is not None
            else open_channel(address, max_message_bytes, interceptors, security)
        )

    @classmethod
    def of(cls, channel: grpc.Channel) -> Channels:
        return cls("", 0, borrowed=channel)

    def current(self) -> grpc.Channel:
        return self._channel

    def close(self) -> None:
        close_channel(self._channel)
