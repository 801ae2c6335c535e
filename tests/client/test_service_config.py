"""The service config (agentstate/client/service_config.json) retries reads on UNAVAILABLE,
not writes.

A real state service on PostgreSQL whose server interceptor fails the first attempts of
every method with UNAVAILABLE, as a restarting sidecar does; the agent service's own state
channel must ride it out for reads and must not replay writes.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest

from agentstate.agent.v1 import agent_service_pb2 as apb
from agentstate.agent.v1 import agent_service_pb2_grpc as apb_grpc
from agentstate.agent_service.config import AgentServiceSettings
from agentstate.agent_service.profile import Profile
from agentstate.agent_service.server import AgentServiceApp
from agentstate.client.service_config import channel_options, service_config_json
from agentstate.state.v1 import state_service_pb2 as pb
from agentstate.state.v1 import state_service_pb2_grpc as pb_grpc
from agentstate.state_service.storage.postgres import PostgresStore
from tests.support.agent_harness import metadata
from tests.support.fault_injection import Blips, state_service_with_blips

READS = {
    "agentstate.state.v1.StateService": {
        "GetState",
        "GetConversation",
        "ListConversations",
        "ListMessages",
        "GetMessage",
        "ListCompactions",
        "GetCheckpoint",
        "ListCheckpoints",
        "GetLease",
        "ListItems",
        "GetScopedState",
    },
    "agentstate.agent.v1.AgentService": {"ListConversations", "ListMessages", "GetRagHistory"},
}


@pytest.fixture
async def blips_and_state(pg_store: PostgresStore) -> AsyncIterator[tuple[Blips, str]]:
    async with state_service_with_blips(pg_store) as running:
        yield running


def test_the_config_names_exactly_the_reads() -> None:
    config = json.loads(service_config_json())
    (method_config,) = config["methodConfig"]
    named: dict[str, set[str]] = {}
    for name in method_config["name"]:
        named.setdefault(name["service"], set()).add(name["method"])
    assert named == READS
    policy = method_config["retryPolicy"]
    assert policy["retryableStatusCodes"] == ["UNAVAILABLE"]
    assert 2 <= policy["maxAttempts"] <= 5  # gRPC caps attempts at 5


async def test_reads_are_retried_and_writes_are_not(
    blips_and_state: tuple[Blips, str], user_id: str
) -> None:
    blips, address = blips_and_state
    async with grpc.aio.insecure_channel(address, options=channel_options()) as channel:
        stub: Any = pb_grpc.StateServiceStub(channel)
        created = await stub.CreateConversation(pb.CreateConversationRequest(user_id=user_id))
        cid = created.conversation.conversation_id

        blips.failures, blips.attempts = 2, Counter()
        got = await stub.GetConversation(
            pb.GetConversationRequest(user_id=user_id, conversation_id=cid), timeout=10
        )
        assert got.conversation.conversation_id == cid
        assert blips.attempts["GetConversation"] == 3  # two blips, then the answer

        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await stub.RenameConversation(
                pb.RenameConversationRequest(user_id=user_id, conversation_id=cid, title="t"),
                timeout=10,
            )
        assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
        assert blips.attempts["RenameConversation"] == 1  # a write is never replayed

    # Without the config the same read fails on the first blip: the config is what retries.
    blips.failures, blips.attempts = 2, Counter()
    async with grpc.aio.insecure_channel(address) as bare:
        with pytest.raises(grpc.aio.AioRpcError) as failed:
            await pb_grpc.StateServiceStub(bare).GetConversation(
                pb.GetConversationRequest(user_id=user_id, conversation_id=cid), timeout=10
            )
        assert failed.value.code() == grpc.StatusCode.UNAVAILABLE
        assert blips.attempts["GetConversation"] == 1


async def test_the_agents_state_channel_uses_it(
    blips_and_state: tuple[Blips, str], user_id: str
) -> None:
    blips, address = blips_and_state
    app = AgentServiceApp(
        AgentServiceSettings(
            listen_address="127.0.0.1:0",
            state_address=address,
            state_timeout_seconds=10,
            auth_mode="dev-header",
        ),
        Profile(),  # state calls only: no profile needed
    )
    agent_address = await app.start()
    try:
        async with grpc.aio.insecure_channel(agent_address) as channel:
            agent: Any = apb_grpc.AgentServiceStub(channel)
            blips.failures, blips.attempts = 3, Counter()
            listed = await agent.ListConversations(
                apb.ListConversationsRequest(), metadata=metadata(user_id), timeout=15
            )
            assert list(listed.conversations) == []
            assert blips.attempts["ListConversations"] == 4  # all the policy allows
    finally:
        await app.stop()
