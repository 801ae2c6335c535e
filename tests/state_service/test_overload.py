"""Past capacity the state service refuses calls at once, with gRPC's retry pushback, and
loses nothing; the Python client and the agent come back when it says (issue 26, item 4).

A real state-service process with a cap of 4 calls in flight and 4 queued, and 40 callers.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections import Counter
from typing import Any, cast

import grpc
import psycopg
import pytest

from agentstate.agent.v1 import agent_service_pb2 as apb
from agentstate.agent.v1 import agent_service_pb2_grpc as apb_grpc
from agentstate.client import AsyncStateClient
from agentstate.client.error_details import error_info
from agentstate.client.metadata import USER_ID_METADATA_KEY
from agentstate.dev.processes import ServiceProcess
from agentstate.state.v1 import state_service_pb2 as pb
from agentstate.state.v1 import state_service_pb2_grpc as pb_grpc
from tests.support.state_process import StateServices, on_postgres

CAP, QUEUED, RETRY_AFTER_MS, CALLERS = 4, 4, 40, 40


@pytest.fixture
def capped_service(database_url: str, state_services: StateServices) -> str:
    return state_services.serve(
        on_postgres(
            database_url,
            STATE_DB_POOL_MAX_SIZE=str(CAP),
            STATE_MAX_CALLS_IN_FLIGHT=str(CAP),
            STATE_MAX_QUEUED_CALLS=str(QUEUED),
            STATE_OVERLOAD_RETRY_AFTER_MS=str(RETRY_AFTER_MS),
        )
    )


def _payload(caller: int, n: int) -> bytes:
    return json.dumps({"caller": caller, "n": n, "pad": "状态" * 200}).encode()


def _check_refusal(exc: grpc.aio.AioRpcError) -> int:
    """A refusal at capacity as documented; its pushback in ms."""
    assert exc.code() == grpc.StatusCode.UNAVAILABLE, (exc.code(), exc.details())
    trailers: dict[str, Any] = dict(cast(Any, exc.trailing_metadata()) or ())
    pushback = int(trailers["grpc-retry-pushback-ms"])
    assert RETRY_AFTER_MS / 2 <= pushback <= RETRY_AFTER_MS * 3 / 2
    info = error_info(exc)
    assert info is not None and info.reason == "OVERLOADED"
    assert info.metadata["retry_after_ms"] == str(pushback)
    assert "refused before anything was done" in (exc.details() or "")
    return pushback


async def test_past_capacity_calls_are_refused_with_pushback_and_nothing_is_lost(
    capped_service: str, database_url: str, user_id: str
) -> None:
    async with grpc.aio.insecure_channel(capped_service) as channel:
        stub = pb_grpc.StateServiceStub(channel)
        cids = [
            (
                await stub.CreateConversation(pb.CreateConversationRequest(user_id=user_id))
            ).conversation.conversation_id
            for _ in range(CALLERS)
        ]
        acknowledged: dict[int, tuple[int, bytes]] = {}
        for i, cid in enumerate(cids):  # each conversation's state row, so it can be held
            saved = await stub.UpsertState(
                pb.UpsertStateRequest(user_id=user_id, conversation_id=cid, payload=_payload(i, 0))
            )
            acknowledged[i] = (saved.version, _payload(i, 0))
        statuses: Counter[str] = Counter()
        pushbacks: list[int] = []

        async def caller(i: int, until: float) -> None:
            version, n = acknowledged[i][0], 0
            while time.monotonic() < until:
                n += 1
                request = pb.UpsertStateRequest(
                    user_id=user_id, conversation_id=cids[i], payload=_payload(i, n)
                )
                request.expected_version = version  # compare-and-set: a refusal never applied
                try:
                    saved = await stub.UpsertState(request, timeout=30)
                except grpc.aio.AioRpcError as exc:
                    statuses[exc.code().name] += 1
                    pushbacks.append(_check_refusal(exc))
                    continue  # no waiting: the load stays on
                statuses["OK"] += 1
                version = saved.version
                acknowledged[i] = (version, request.payload)

        # The overload is made, not hoped for: for its first second the test holds every
        # state row, so the calls in flight stay in flight and the queue stays full (a fast
        # machine served 40 unheld callers with too few refusals to tell anything).
        async with (
            await psycopg.AsyncConnection.connect(database_url) as holder,
            holder.transaction(),
        ):
            await holder.execute(
                "SELECT 1 FROM t_agent_state WHERE user_id = %s FOR UPDATE", (user_id,)
            )
            until = time.monotonic() + 3
            callers = asyncio.gather(*(caller(i, until) for i in range(CALLERS)))
            await asyncio.sleep(1)
            held_statuses = Counter(statuses)
        await callers

        # While held: nothing served, every caller past the cap refused (they retry at once).
        assert held_statuses["OK"] == 0, held_statuses
        assert held_statuses["UNAVAILABLE"] >= CALLERS - CAP - QUEUED, held_statuses
        # Refused and served, and nothing else (a refused write that had applied would
        # have made the caller's next compare-and-set fail with ABORTED).
        assert set(statuses) == {"OK", "UNAVAILABLE"}, statuses
        assert statuses["OK"] >= CALLERS and statuses["UNAVAILABLE"] >= CALLERS, statuses
        # Every acknowledged write is there, as acknowledged.
        for i, (version, payload) in acknowledged.items():
            got = await stub.GetState(pb.GetStateRequest(user_id=user_id, conversation_id=cids[i]))
            assert (got.version, json.loads(got.payload)) == (version, json.loads(payload))
        # Recovered at once: as many concurrent calls as the cap, then more in sequence.
        burst = await asyncio.gather(
            *(
                stub.GetConversation(
                    pb.GetConversationRequest(user_id=user_id, conversation_id=cid), timeout=5
                )
                for cid in cids[: CAP + QUEUED]
            )
        )
        assert len(burst) == CAP + QUEUED
        for cid in cids:
            await stub.GetConversation(
                pb.GetConversationRequest(user_id=user_id, conversation_id=cid), timeout=5
            )


class _Attempts(grpc.aio.UnaryUnaryClientInterceptor):  # type: ignore[type-arg]
    """Counts the attempts the client itself makes, by status."""

    def __init__(self) -> None:
        self.seen: Counter[str] = Counter()

    async def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        call = await continuation(details, request)
        self.seen[(await call.code()).name] += 1
        return call


async def test_the_client_comes_back_when_the_server_says(
    capped_service: str, database_url: str, user_id: str
) -> None:
    attempts = _Attempts()
    async with AsyncStateClient.connect(
        capped_service,
        timeout_seconds=30,
        interceptors=[cast("grpc.aio.ClientInterceptor", attempts)],
    ) as client:
        cids = [(await client.create_conversation(user_id)).conversation_id for _ in range(CALLERS)]

        async def writer(i: int) -> list[int]:
            versions = []
            version = 0
            for n in range(8):
                saved = await client.upsert_state(
                    user_id, cids[i], _payload(i, n), expected_version=version
                )
                version = saved.version
                versions.append(version)
                # Reads: retried by gRPC itself, per the service config, after the pushback.
                assert (await client.get_state(user_id, cids[i])).version == version
            return versions

        # As above, the overload is made: the conversation rows are held (a save updates
        # its conversation's row first) for half a second while the writers start.
        async with (
            await psycopg.AsyncConnection.connect(database_url) as holder,
            holder.transaction(),
        ):
            await holder.execute(
                "SELECT 1 FROM t_conversation WHERE user_id = %s FOR UPDATE", (user_id,)
            )
            writers = asyncio.gather(*(writer(i) for i in range(CALLERS)))
            await asyncio.sleep(0.5)
        results = await writers
    # Every write succeeded, each exactly once (versions 1..8, no ABORTED from a repeat).
    assert results == [list(range(1, 9))] * CALLERS
    # ... after refusals the client itself sent again (writes are not retried by gRPC).
    assert attempts.seen["UNAVAILABLE"] > 0, attempts.seen
    assert set(attempts.seen) == {"OK", "UNAVAILABLE"}, attempts.seen


def test_the_agents_turns_wait_out_a_busy_state_service(
    database_url: str, orders_database_url: str, state_services: StateServices
) -> None:
    """A state service that serves one call at a time and queues none: 12 concurrent Chat
    turns all finish, because the agent's state client comes back after each refusal."""
    state_address = state_services.serve(
        on_postgres(
            database_url,
            STATE_MAX_CALLS_IN_FLIGHT="1",
            STATE_MAX_QUEUED_CALLS="0",
            STATE_OVERLOAD_RETRY_AFTER_MS="20",
        )
    )
    agent = None
    try:
        agent = ServiceProcess(
            "agentstate.agent_service",
            {
                "AGENT_LISTEN_ADDRESS": "127.0.0.1:0",
                "AGENT_AUTH_MODE": "dev-header",
                "AGENT_STATE_ADDRESS": state_address,
                "AGENT_PROFILE": "order_demo",
                "ORDERS_DATABASE_URL": orders_database_url,
                "AGENT_STATE_TIMEOUT_SECONDS": "30",
            },
        )
        address = agent.wait_ready()

        async def turns() -> list[str]:
            async with grpc.aio.insecure_channel(address) as channel:
                stub = apb_grpc.AgentServiceStub(channel)

                async def chat(i: int) -> str:
                    md = ((USER_ID_METADATA_KEY, f"busy-{i}-{uuid.uuid4()}"),)
                    request = apb.ChatRequest(question="我的订单88235现在什么状态？")
                    events = [r.event async for r in stub.Chat(request, metadata=md)]
                    return str(events[-2].WhichOneof("event"))

                return await asyncio.gather(*(chat(i) for i in range(12)))

        assert asyncio.run(turns()) == ["finish"] * 12
    finally:
        if agent is not None:
            assert agent.terminate() == 0, agent.output
