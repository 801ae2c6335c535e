"""The client channel's options: message limits, quick reconnects, the service config."""

from __future__ import annotations

from agentstate.common import service_config


def channel_options(max_message_bytes: int) -> list[tuple[str, str | int]]:
    return [
        ("grpc.max_receive_message_length", max_message_bytes),
        ("grpc.max_send_message_length", max_message_bytes),
        # A restarting sidecar is routine: reconnect quickly, not after gRPC's default
        # backoff of up to two minutes.
        ("grpc.initial_reconnect_backoff_ms", 100),
        ("grpc.min_reconnect_backoff_ms", 100),
        ("grpc.max_reconnect_backoff_ms", 2000),
        # Reads are retried on UNAVAILABLE (agentstate/service_config.json).
        *service_config.channel_options(),
    ]
