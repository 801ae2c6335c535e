"""The cost of a turn: two state calls per turn, one SQL statement (round trip) per call.

Statements are counted by PostgreSQL itself (its statement log), state calls by the
agent's gRPC client spans.
"""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any, TypeAlias

import grpc
import psycopg
import pytest
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from agentstate.common.embedded_postgres import EmbeddedPostgres
from agentstate.state.v1 import state_service_pb2 as pb
from agentstate.state.v1 import state_service_pb2_grpc as pb_grpc
from agentstate.state_service.storage.postgres import PostgresStore
from tests.conftest import create_database, start_state_server
from tests.support.agent_harness import Stack, Turn
from tests.support.helpers import new_conversation, user_text
from tests.support.source_example import QUESTION, source_state_bytes

Stub: TypeAlias = "pb_grpc.StateServiceAsyncStub"
DATABASE = "agentstate_round_trips"


class StatementCounter:
    """Statements PostgreSQL runs in one database, as its log shows them.

    The database logs every statement it receives (`log_statement = all`, set on that
    database only), before running it: statements that fail count too, and so do
    BEGIN and COMMIT. The log is the server's own file (EmbeddedPostgres writes it).
    """

    # Simple protocol ("statement: ...") and extended protocol ("execute <name>: ...").
    _STATEMENT = re.compile(rb"LOG:  (?:statement|execute [^:]+): ")

    def __init__(self, log_file: Path) -> None:
        self._log = log_file

    async def of(self, call: Callable[[], Awaitable[Any]]) -> int:
        start = self._log.stat().st_size
        with contextlib.suppress(grpc.aio.AioRpcError):  # a refusal must cost no more
            await call()
        with self._log.open("rb") as log:
            log.seek(start)
            return len(self._STATEMENT.findall(log.read()))


@pytest.fixture
async def counted(postgres: EmbeddedPostgres) -> AsyncIterator[tuple[Stub, StatementCounter]]:
    url = create_database(postgres, DATABASE)
    async with await psycopg.AsyncConnection.connect(postgres.dsn, autocommit=True) as conn:
        await conn.execute(f"ALTER DATABASE {DATABASE} SET log_statement = 'all'")
    store = PostgresStore(url, min_size=1, max_size=4)
    await store.open()
    server, address = await start_state_server(store)
    async with grpc.aio.insecure_channel(address) as channel:
        yield pb_grpc.StateServiceStub(channel), StatementCounter(postgres.data_dir / "server.log")
    await server.stop(None)
    await store.close()


async def test_every_state_rpc_is_one_statement(
    counted: tuple[Stub, StatementCounter], user_id: str, postgres: EmbeddedPostgres
) -> None:
    stub, statements = counted
    url = postgres.dsn.replace("dbname=postgres", f"dbname={DATABASE}")
    cid = await new_conversation(stub, user_id)
    ids: dict[str, Any] = {"user_id": user_id, "conversation_id": cid}
    begun: list[pb.BeginTurnResponse] = []

    async def begin() -> None:
        begun.append(
            await stub.BeginTurn(
                pb.BeginTurnRequest(
                    **ids,
                    holder="replica",
                    ttl_ms=60_000,
                    max_user_leases=5,
                    new_messages=[
                        user_text("q"),
                        pb.NewMessage(
                            role=pb.MESSAGE_ROLE_ASSISTANT, status=pb.MESSAGE_STATUS_STREAMING
                        ),
                    ],
                    require_none_awaiting=True,
                )
            )
        )

    def end(expected_version: int) -> Awaitable[Any]:
        return stub.EndTurn(
            pb.EndTurnRequest(
                **ids,
                task_id=begun[-1].lease.task_id,
                payload=source_state_bytes(),
                expected_version=expected_version,
                message_writes=[
                    pb.MessageWrite(
                        update=pb.MessageUpdate(
                            message_id=begun[-1].messages[1].message_id,
                            status=pb.MESSAGE_STATUS_NORMAL,
                            blocks_json=b'[{"type":"text","text":"a"}]',
                        )
                    )
                ],
                compaction_records=[pb.CompactionRecord(messages_before=9, reason="test")],
            )
        )

    calls: list[tuple[str, Callable[[], Awaitable[Any]]]] = [
        ("BeginTurn", begin),
        ("BeginTurn (lease held)", begin),
        ("EndTurn", lambda: end(0)),
        ("EndTurn (version conflict)", lambda: end(7)),
        ("GetState", lambda: stub.GetState(pb.GetStateRequest(**ids))),
        (
            "UpsertState",
            lambda: stub.UpsertState(
                pb.UpsertStateRequest(
                    **ids,
                    payload=b'{"a": 1}',
                    expected_version=1,
                    message_writes=[pb.MessageWrite(insert=user_text("x"))],
                )
            ),
        ),
        (
            "UpsertState (version conflict)",
            lambda: stub.UpsertState(
                pb.UpsertStateRequest(**ids, payload=b"{}", expected_version=1)
            ),
        ),
        (
            "CreateConversation",
            lambda: stub.CreateConversation(pb.CreateConversationRequest(user_id=user_id)),
        ),
        ("GetConversation", lambda: stub.GetConversation(pb.GetConversationRequest(**ids))),
        (
            "ListConversations",
            lambda: stub.ListConversations(pb.ListConversationsRequest(user_id=user_id)),
        ),
        (
            "RenameConversation",
            lambda: stub.RenameConversation(pb.RenameConversationRequest(**ids, title="t")),
        ),
        (
            "AppendMessage",
            lambda: stub.AppendMessage(pb.AppendMessageRequest(**ids, message=user_text("m"))),
        ),
        ("ListMessages", lambda: stub.ListMessages(pb.ListMessagesRequest(**ids))),
        ("ListCompactions", lambda: stub.ListCompactions(pb.ListCompactionsRequest(**ids))),
        ("GetLease", lambda: stub.GetLease(pb.GetLeaseRequest(**ids))),
        (
            "AcquireLease (held)",
            lambda: stub.AcquireLease(pb.AcquireLeaseRequest(**ids, holder="other", ttl_ms=1000)),
        ),
        (
            "RenewLease",
            lambda: stub.RenewLease(
                pb.RenewLeaseRequest(user_id=user_id, task_id=begun[-1].lease.task_id, ttl_ms=1000)
            ),
        ),
        (
            "RequestStop",
            lambda: stub.RequestStop(
                pb.RequestStopRequest(user_id=user_id, task_id=begun[-1].lease.task_id)
            ),
        ),
        (
            "ReleaseLease",
            lambda: stub.ReleaseLease(
                pb.ReleaseLeaseRequest(user_id=user_id, task_id=begun[-1].lease.task_id)
            ),
        ),
        (
            "AcquireLease",
            lambda: stub.AcquireLease(pb.AcquireLeaseRequest(**ids, holder="r", ttl_ms=1000)),
        ),
        (
            "DeleteConversation",
            lambda: stub.DeleteConversation(pb.DeleteConversationRequest(**ids)),
        ),
        (
            "DeleteConversation (not found)",
            lambda: stub.DeleteConversation(pb.DeleteConversationRequest(**ids)),
        ),
    ]
    counts = {name: await statements.of(call) for name, call in calls}
    assert counts == {name: 1 for name, _ in calls}

    async def explicit_transaction() -> None:  # the counter sees BEGIN and COMMIT
        async with await psycopg.AsyncConnection.connect(url) as conn:
            await conn.execute("SELECT 1")
            await conn.commit()

    assert await statements.of(explicit_transaction) == 3
    assert begun and begun[0].lease.task_id  # the calls really ran


async def test_get_message_and_update_message_are_one_statement(
    counted: tuple[Stub, StatementCounter], user_id: str
) -> None:
    stub, statements = counted
    cid = await new_conversation(stub, user_id)
    ids: dict[str, Any] = {"user_id": user_id, "conversation_id": cid}
    record = (
        await stub.AppendMessage(pb.AppendMessageRequest(**ids, message=user_text("m")))
    ).message
    get = await statements.of(
        lambda: stub.GetMessage(pb.GetMessageRequest(**ids, message_id=record.message_id))
    )
    update = await statements.of(
        lambda: stub.UpdateMessage(
            pb.UpdateMessageRequest(
                **ids,
                update=pb.MessageUpdate(
                    message_id=record.message_id,
                    status=pb.MESSAGE_STATUS_ERROR,
                    metadata_json=json.dumps({"why": "test"}).encode(),
                ),
            )
        )
    )
    batch = await statements.of(
        lambda: stub.BatchDeleteConversations(
            pb.BatchDeleteConversationsRequest(user_id=user_id, conversation_ids=[cid])
        )
    )
    assert (get, update, batch) == (1, 1, 1)


async def _state_calls_of_turn(exporter: InMemorySpanExporter, turn_span: str) -> list[str]:
    """The state RPCs the agent made within the (only) trace of one turn."""
    spans = list(exporter.get_finished_spans())
    (turn,) = [s for s in spans if s.name == turn_span]
    assert turn.context is not None
    return [
        s.name.rsplit("/", 1)[1]
        for s in sorted(spans, key=lambda s: s.start_time or 0)
        if s.kind == SpanKind.CLIENT
        and s.name.startswith("/agentstate.state.v1.StateService/")
        and s.context is not None
        and s.context.trace_id == turn.context.trace_id
    ]


async def test_chat_and_confirm_make_two_state_calls_each(
    traced_stack: Stack,
    telemetry: tuple[InMemorySpanExporter, InMemoryMetricReader],
    user_id: str,
) -> None:
    exporter, _ = telemetry
    client = traced_stack.agents[0][1]
    seen: dict[str, list[str]] = {}

    async def turn(name: str, kind: str, call: Awaitable[Turn]) -> Turn:
        exporter.clear()
        done = await call
        assert done.code == grpc.StatusCode.OK, done.details
        seen[name] = await _state_calls_of_turn(exporter, f"agent.turn {kind}")
        return done

    first = await turn("Chat, new conversation, card", "Chat", client.chat(user_id, QUESTION))
    cid = first.meta.conversation_id
    await turn(
        "Confirm, deny", "Confirm", client.confirm(user_id, cid, first.card.message_id, False)
    )

    status = await turn(
        "Chat, new conversation, no card",
        "Chat",
        client.chat(user_id, "我的订单88235现在什么状态？"),
    )
    cid = status.meta.conversation_id
    card = await turn(
        "Chat, existing conversation, card", "Chat", client.chat(user_id, QUESTION, cid)
    )
    approved = await turn(
        "Confirm, approve (the tool runs)",
        "Confirm",
        client.confirm(user_id, cid, card.card.message_id, True),
    )
    assert "已经帮你取消了" in approved.reply
    assert seen == {name: ["BeginTurn", "EndTurn"] for name in seen}


async def test_every_checkpoint_rpc_is_one_statement(
    counted: tuple[Stub, StatementCounter], user_id: str
) -> None:
    stub, statements = counted
    cid = await new_conversation(stub, user_id)
    target = await new_conversation(stub, user_id)
    ids: dict[str, Any] = {"user_id": user_id, "conversation_id": cid}
    value = pb.ChannelValue(channel="messages", version="1", value_type="msgpack", value=b"\x90")

    def put(checkpoint_id: str, head: str) -> Awaitable[Any]:
        return stub.PutCheckpoint(
            pb.PutCheckpointRequest(
                **ids,
                checkpoint_id=checkpoint_id,
                parent_checkpoint_id=head,
                checkpoint=b"cp",
                metadata_json=b'{"run_id": "r1", "step": 0}',
                channel_versions={"messages": "1"},
                new_channel_values=[value],
                expected_head_checkpoint_id=head,
            )
        )

    write = pb.CheckpointWrite(task_id="t", idx=0, channel="messages", value=b"\x90")
    calls: list[tuple[str, Callable[[], Awaitable[Any]]]] = [
        ("PutCheckpoint", lambda: put("c1", "")),
        ("PutCheckpoint (head moved)", lambda: put("c2", "")),
        (
            "PutCheckpointWrites",
            lambda: stub.PutCheckpointWrites(
                pb.PutCheckpointWritesRequest(**ids, checkpoint_id="c1", writes=[write, write])
            ),
        ),
        ("GetCheckpoint", lambda: stub.GetCheckpoint(pb.GetCheckpointRequest(**ids))),
        (
            "ListCheckpoints",
            lambda: stub.ListCheckpoints(
                pb.ListCheckpointsRequest(**ids, metadata_filter_json=b'{"step": 0}')
            ),
        ),
        (
            "CopyCheckpoints",
            lambda: stub.CopyCheckpoints(
                pb.CopyCheckpointsRequest(
                    user_id=user_id, source_conversation_id=cid, target_conversation_id=target
                )
            ),
        ),
        (
            "PruneCheckpoints",
            lambda: stub.PruneCheckpoints(
                pb.PruneCheckpointsRequest(
                    user_id=user_id,
                    conversation_ids=[cid, target],
                    strategy=pb.PRUNE_STRATEGY_KEEP_LATEST,
                )
            ),
        ),
        (
            "DeleteCheckpointsForRuns",
            lambda: stub.DeleteCheckpointsForRuns(
                pb.DeleteCheckpointsForRunsRequest(user_id=user_id, run_ids=["r1"])
            ),
        ),
    ]
    counts = {name: await statements.of(call) for name, call in calls}
    assert counts == {name: 1 for name, _ in calls}
    assert (await stub.ListCheckpoints(pb.ListCheckpointsRequest(**ids))).checkpoints == []
