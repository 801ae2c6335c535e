"""The gRPC service config callers of both services use: retries for the idempotent reads.

agentstate/client/service_config.json is the one copy, for every language (docs/callers.md
shows how Java, Go, Node and Python pass it). It retries the reads (StateService GetState,
GetConversation, ListConversations, ListMessages, GetMessage, ListCompactions,
GetCheckpoint, ListCheckpoints; AgentService ListConversations, ListMessages,
GetRagHistory) on UNAVAILABLE only: up to 4 attempts in all, jittered exponential backoff
from 0.1 s capped at 1 s, all within the call's deadline. Writes are never retried by the
channel: a write that reached the server before the connection broke must not be applied
twice, and the agent's writes are compare-and-set or leased, so the caller decides.

It also picks round_robin: a target that resolves to several addresses (a `dns:///` name
of a headless Service in front of central state-service replicas, k8s/overlays/central)
gets a connection to each and spreads the calls over them; a single address (the sidecar)
behaves as before.
"""

from __future__ import annotations

from functools import cache
from importlib import resources

SERVICE_CONFIG_FILE = "service_config.json"


@cache
def service_config_json() -> str:
    return resources.files("agentstate.client").joinpath(SERVICE_CONFIG_FILE).read_text("utf-8")


def channel_options() -> list[tuple[str, str | int]]:
    """Channel arguments that apply the service config to a grpc (or grpc.aio) channel."""
    return [("grpc.service_config", service_config_json()), ("grpc.enable_retries", 1)]
