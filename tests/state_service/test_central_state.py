"""The central topology: the agent's state channel on a dns:/// name with round_robin.

Two real state-service processes on 127.0.0.1 and 127.0.0.2 (the same port), one name
resolving to both (a DNS stub, tests/support/dns_stub.py, as a headless Service resolves to its
ready pods), and the channel the agent service builds (agent_service/server.py
state_channel). Each process keeps its own memory store, so where a conversation landed
shows which process served the call.
"""

from __future__ import annotations

import asyncio

import grpc
import pytest

from agentstate.agent_service.server import state_channel
from agentstate.dev.pgbouncer import free_port
from agentstate.dev.processes import ServiceProcess
from agentstate.state.v1 import state_service_pb2 as pb
from agentstate.state.v1 import state_service_pb2_grpc as pb_grpc
from tests.support.dns_stub import DnsStub
from tests.support.state_process import StateServices, in_memory

HOSTS = ["127.0.0.1", "127.0.0.2"]
NAME = "state.agentstate.test"


@pytest.fixture
def replicas(state_services: StateServices) -> tuple[list[ServiceProcess], list[str], int]:
    port = free_port()
    processes = [
        state_services.start(
            in_memory(
                STATE_LISTEN_ADDRESS=f"{host}:{port}", STATE_GRPC_MAX_CONNECTION_AGE_SECONDS="1"
            ),
            "serve",
        )
        for host in HOSTS
    ]
    return processes, [p.wait_ready() for p in processes], port


async def conversations_on(address: str, user_id: str) -> int:
    async with grpc.aio.insecure_channel(address) as channel:
        page = await pb_grpc.StateServiceStub(channel).ListConversations(
            pb.ListConversationsRequest(user_id=user_id, page_size=100)
        )
        return len(page.conversations)


async def test_the_agents_state_channel_balances_over_a_name(
    replicas: tuple[list[ServiceProcess], list[str], int], user_id: str
) -> None:
    processes, addresses, port = replicas
    dns = DnsStub(NAME, HOSTS)
    try:
        channel = state_channel(f"dns://127.0.0.1:{dns.port}/{NAME}:{port}", 1 << 20)
        async with channel:
            stub = pb_grpc.StateServiceStub(channel)
            for _ in range(20):
                await stub.CreateConversation(
                    pb.CreateConversationRequest(user_id=user_id), timeout=10
                )
            counts = [await conversations_on(a, user_id) for a in addresses]
            assert sum(counts) == 20
            assert min(counts) >= 5, counts  # round_robin: about half each

            # One replica goes away (a rolling update, a node drain): calls go to the other.
            assert processes[1].terminate() == 0
            await asyncio.sleep(0.5)
            for _ in range(10):
                await stub.CreateConversation(
                    pb.CreateConversationRequest(user_id=user_id), timeout=10
                )
            assert await conversations_on(addresses[0], user_id) == counts[0] + 10
        assert (NAME, 1) in dns.queries  # it was the name that was resolved
    finally:
        dns.close()


async def test_a_replica_added_later_gets_calls(
    replicas: tuple[list[ServiceProcess], list[str], int], user_id: str
) -> None:
    """The autoscaler adds a replica: the name's answer grows, and as the servers recycle
    connections (STATE_GRPC_MAX_CONNECTION_AGE_SECONDS) the channel re-resolves it."""
    _, addresses, port = replicas
    dns = DnsStub(NAME, HOSTS[:1])
    try:
        channel = state_channel(f"dns://127.0.0.1:{dns.port}/{NAME}:{port}", 1 << 20)
        async with channel:
            stub = pb_grpc.StateServiceStub(channel)
            for _ in range(5):
                await stub.CreateConversation(
                    pb.CreateConversationRequest(user_id=user_id), timeout=10
                )
            assert await conversations_on(addresses[1], user_id) == 0
            dns.addresses = HOSTS  # the second replica is ready
            deadline = asyncio.get_running_loop().time() + 20
            while await conversations_on(addresses[1], user_id) == 0:
                assert asyncio.get_running_loop().time() < deadline, "never re-resolved"
                await stub.CreateConversation(
                    pb.CreateConversationRequest(user_id=user_id), timeout=10
                )
                await asyncio.sleep(0.2)
    finally:
        dns.close()
