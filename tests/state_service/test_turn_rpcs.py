"""BeginTurn and EndTurn: a whole turn in two calls, each all or nothing (both stores)."""

from __future__ import annotations

import asyncio
import json
from typing import Any, TypeAlias

import grpc
import pytest
from google.rpc import error_details_pb2
from grpc_status import rpc_status

from agentstate.state.v1 import state_service_pb2 as pb
from agentstate.state.v1 import state_service_pb2_grpc as pb_grpc
from tests.support.helpers import (
    all_messages,
    expect_rpc_error,
    get_state,
    new_conversation,
    trailer,
    user_text,
)

Stub: TypeAlias = "pb_grpc.StateServiceAsyncStub"
FAILED = grpc.StatusCode.FAILED_PRECONDITION

STREAMING_REPLY = pb.NewMessage(role=pb.MESSAGE_ROLE_ASSISTANT, status=pb.MESSAGE_STATUS_STREAMING)


def begin(user_id: str, conversation_id: str = "", **fields: Any) -> pb.BeginTurnRequest:
    request = pb.BeginTurnRequest(
        user_id=user_id, conversation_id=conversation_id, holder="replica-1", ttl_ms=60_000
    )
    for name, value in fields.items():
        if name == "new_messages":
            request.new_messages.extend(value)
        else:
            setattr(request, name, value)
    return request


def end(
    begun: pb.BeginTurnResponse, state: dict[str, Any], *writes: pb.MessageWrite, **fields: Any
) -> pb.EndTurnRequest:
    request = pb.EndTurnRequest(
        user_id=begun.conversation.user_id,
        conversation_id=begun.conversation.conversation_id,
        task_id=begun.lease.task_id,
        payload=json.dumps(state).encode(),
        expected_version=begun.version,
        message_writes=list(writes),
    )
    for name, value in fields.items():
        if name == "compaction_records":
            request.compaction_records.extend(value)
        else:
            setattr(request, name, value)
    return request


def settle(message_id: str, status: pb.MessageStatus.ValueType) -> pb.MessageWrite:
    return pb.MessageWrite(update=pb.MessageUpdate(message_id=message_id, status=status))


async def test_begin_turn_creates_the_conversation_and_appends_records(
    state_stub: Stub, user_id: str
) -> None:
    begun = await state_stub.BeginTurn(
        begin(user_id, title="  cancel my   watch ", new_messages=[user_text("q"), STREAMING_REPLY])
    )
    cid = begun.conversation.conversation_id
    assert begun.conversation_created and begun.conversation.title == "cancel my watch"
    assert begun.lease.task_id and begun.lease.holder == "replica-1"
    assert begun.version == 0 and begun.payload == b"" and not begun.HasField("state_update_time")
    assert begun.lapsed_task_id == "" and begun.interrupted_records == 0
    stored = await all_messages(state_stub, user_id, cid)
    assert [m.message_id for m in stored] == [m.message_id for m in begun.messages]
    assert [m.status for m in stored] == [pb.MESSAGE_STATUS_NORMAL, pb.MESSAGE_STATUS_STREAMING]
    assert json.loads(stored[0].blocks_json) == [{"type": "text", "text": "q"}]
    # The lease is really held.
    await expect_rpc_error(
        state_stub.AcquireLease(
            pb.AcquireLeaseRequest(user_id=user_id, conversation_id=cid, holder="x", ttl_ms=1000)
        ),
        FAILED,
        "running turn",
    )


async def test_end_turn_saves_everything_and_releases_the_lease(
    state_stub: Stub, user_id: str
) -> None:
    begun = await state_stub.BeginTurn(begin(user_id, new_messages=[STREAMING_REPLY]))
    cid = begun.conversation.conversation_id
    reply = begun.messages[0].message_id
    ended = await state_stub.EndTurn(
        end(
            begun,
            {"turn": 1},
            pb.MessageWrite(
                update=pb.MessageUpdate(
                    message_id=reply,
                    status=pb.MESSAGE_STATUS_AWAITING_CONFIRM,
                    blocks_json=b'[{"type":"text","text":"ok?"}]',
                )
            ),
            compaction_records=[pb.CompactionRecord(messages_before=9, messages_after=2)],
        )
    )
    assert ended.version == 1 and ended.lease_released
    assert [m.status for m in ended.messages] == [pb.MESSAGE_STATUS_AWAITING_CONFIRM]
    assert await get_state(state_stub, user_id, cid) == ({"turn": 1}, 1)
    compactions = await state_stub.ListCompactions(
        pb.ListCompactionsRequest(user_id=user_id, conversation_id=cid)
    )
    assert [c.messages_before for c in compactions.compactions] == [9]
    # The next turn starts at once and gets the state back.
    nxt = await state_stub.BeginTurn(begin(user_id, cid, require_awaiting_message_id=reply))
    assert not nxt.conversation_created
    assert json.loads(nxt.payload) == {"turn": 1} and nxt.version == 1
    assert nxt.HasField("state_update_time")


async def test_a_refused_begin_turn_changes_nothing(state_stub: Stub, user_id: str) -> None:
    first = await state_stub.BeginTurn(begin(user_id, max_user_leases=1))
    # The per-user limit: a new conversation is not even created.
    await expect_rpc_error(
        state_stub.BeginTurn(begin(user_id, max_user_leases=1, new_messages=[user_text("q")])),
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        "limit 1",
    )
    listed = await state_stub.ListConversations(pb.ListConversationsRequest(user_id=user_id))
    assert [c.conversation_id for c in listed.conversations] == [first.conversation.conversation_id]
    # The lease is held: no records are appended.
    cid = first.conversation.conversation_id
    await expect_rpc_error(
        state_stub.BeginTurn(begin(user_id, cid, new_messages=[user_text("q")])),
        FAILED,
        "running turn",
    )
    # A bad record: nothing of the turn happens, the lease stays free for others.
    await state_stub.ReleaseLease(
        pb.ReleaseLeaseRequest(user_id=user_id, task_id=first.lease.task_id)
    )
    await expect_rpc_error(
        state_stub.BeginTurn(
            begin(
                user_id,
                cid,
                new_messages=[
                    user_text("q"),
                    pb.NewMessage(role=pb.MESSAGE_ROLE_USER, blocks_json=b"[1,"),
                ],
            )
        ),
        grpc.StatusCode.INVALID_ARGUMENT,
        "new_messages[1]",
    )
    assert await all_messages(state_stub, user_id, cid) == []
    await state_stub.AcquireLease(
        pb.AcquireLeaseRequest(user_id=user_id, conversation_id=cid, holder="x", ttl_ms=1000)
    )


async def test_card_guards(state_stub: Stub, user_id: str) -> None:
    begun = await state_stub.BeginTurn(begin(user_id, new_messages=[STREAMING_REPLY]))
    cid = begun.conversation.conversation_id
    card = begun.messages[0].message_id
    await state_stub.EndTurn(end(begun, {"n": 1}, settle(card, pb.MESSAGE_STATUS_AWAITING_CONFIRM)))

    # A new question may not overtake the open card; the trailer names it.
    refused = await expect_rpc_error(
        state_stub.BeginTurn(
            begin(user_id, cid, require_none_awaiting=True, new_messages=[user_text("q")])
        ),
        FAILED,
        f"confirmation card {card} is still pending",
    )
    assert trailer(refused, "agentstate-awaiting-message") == card
    assert len(await all_messages(state_stub, user_id, cid)) == 1
    # Unknown card: NOT_FOUND (a message is missing).
    missing = await expect_rpc_error(
        state_stub.BeginTurn(begin(user_id, cid, require_awaiting_message_id="12345")),
        grpc.StatusCode.NOT_FOUND,
        "message 12345 not found",
    )
    assert trailer(missing, "agentstate-missing") == "message"
    # Answering the card: exactly once.
    answer = await state_stub.BeginTurn(
        begin(user_id, cid, require_awaiting_message_id=card, new_messages=[STREAMING_REPLY])
    )
    await state_stub.EndTurn(
        end(
            answer,
            {"n": 2},
            settle(card, pb.MESSAGE_STATUS_NORMAL),
            settle(answer.messages[0].message_id, pb.MESSAGE_STATUS_NORMAL),
        )
    )
    await expect_rpc_error(
        state_stub.BeginTurn(begin(user_id, cid, require_awaiting_message_id=card)),
        FAILED,
        f"confirmation card {card} was already handled",
    )
    await expect_rpc_error(
        state_stub.BeginTurn(begin(user_id, cid, require_awaiting_message_id="x1")),
        grpc.StatusCode.INVALID_ARGUMENT,
        "require_awaiting_message_id",
    )
    assert await get_state(state_stub, user_id, cid) == ({"n": 2}, 2)


async def test_records_a_dead_turn_left_streaming_are_interrupted(
    state_stub: Stub, user_id: str
) -> None:
    dead = await state_stub.BeginTurn(
        begin(user_id, ttl_ms=100, new_messages=[user_text("q"), STREAMING_REPLY])
    )
    cid = dead.conversation.conversation_id
    await asyncio.sleep(0.25)  # it never saves nor releases; its lease lapses
    nxt = await state_stub.BeginTurn(begin(user_id, cid, new_messages=[STREAMING_REPLY]))
    assert nxt.lapsed_task_id == dead.lease.task_id
    assert nxt.interrupted_records == 1
    statuses = [m.status for m in await all_messages(state_stub, user_id, cid)]
    assert statuses == [
        pb.MESSAGE_STATUS_NORMAL,
        pb.MESSAGE_STATUS_INTERRUPTED,
        pb.MESSAGE_STATUS_STREAMING,  # the new turn's own reply is left alone
    ]
    # The dead turn wakes up: its save is refused (the lease was taken over), nothing lands.
    await expect_rpc_error(state_stub.EndTurn(end(dead, {"late": True})), FAILED, "took it over")
    await expect_rpc_error(
        state_stub.GetState(pb.GetStateRequest(user_id=user_id, conversation_id=cid)),
        grpc.StatusCode.NOT_FOUND,
    )
    # The live turn is unaffected.
    ended = await state_stub.EndTurn(end(nxt, {"live": True}))
    assert ended.version == 1 and ended.lease_released


def unversioned(request: pb.EndTurnRequest) -> pb.EndTurnRequest:
    """Without expected_version, as a framework adapter may send it."""
    request.ClearField("expected_version")
    return request


def lease_lost_reason(error: grpc.aio.AioRpcError) -> str:
    status = rpc_status.from_call(error)  # type: ignore[arg-type]
    assert status is not None
    (packed,) = status.details
    info = error_details_pb2.ErrorInfo()
    assert packed.Unpack(info)
    return info.reason


async def test_end_turn_is_fenced_by_task_not_by_the_lease_row(
    state_stub: Stub, user_id: str
) -> None:
    """Taken over: refused even once the lease is free. Merely lapsed: it saves."""
    # 1. Taken over. The late turn sends no expected_version (as an adapter may).
    late = await state_stub.BeginTurn(begin(user_id, ttl_ms=100, new_messages=[STREAMING_REPLY]))
    cid = late.conversation.conversation_id
    await asyncio.sleep(0.25)  # its lease lapses
    newer = await state_stub.BeginTurn(begin(user_id, cid, new_messages=[STREAMING_REPLY]))
    assert newer.lapsed_task_id == late.lease.task_id
    done = await state_stub.EndTurn(
        end(newer, {"by": "newer"}, settle(newer.messages[0].message_id, pb.MESSAGE_STATUS_NORMAL))
    )
    assert done.version == 1 and done.lease_released  # the lease is free again
    before = [
        (m.message_id, m.status, m.blocks_json)
        for m in await all_messages(state_stub, user_id, cid)
    ]
    for writes in [(), (settle(late.messages[0].message_id, pb.MESSAGE_STATUS_NORMAL),)]:
        refused = await expect_rpc_error(
            state_stub.EndTurn(unversioned(end(late, {"by": "late"}, *writes))),
            FAILED,
            "took it over",
        )
        assert lease_lost_reason(refused) == "LEASE_LOST"
    assert await get_state(state_stub, user_id, cid) == ({"by": "newer"}, 1)
    after = [
        (m.message_id, m.status, m.blocks_json)
        for m in await all_messages(state_stub, user_id, cid)
    ]
    assert after == before
    # Nothing of the late turn's came back either: the conversation's lease stays free.
    taken = await state_stub.AcquireLease(
        pb.AcquireLeaseRequest(user_id=user_id, conversation_id=cid, holder="x", ttl_ms=1000)
    )
    assert taken.lapsed_task_id == ""
    await state_stub.ReleaseLease(
        pb.ReleaseLeaseRequest(user_id=user_id, task_id=taken.lease.task_id)
    )
    # ...and the AcquireLease above is a turn in between too: the late turn stays fenced.
    await expect_rpc_error(state_stub.EndTurn(unversioned(end(late, {"by": "late"}))), FAILED)

    # 2. Merely lapsed: no other turn took the lease, so the late save lands and releases it.
    lapsed = await state_stub.BeginTurn(begin(user_id, ttl_ms=100, new_messages=[STREAMING_REPLY]))
    cid = lapsed.conversation.conversation_id
    await asyncio.sleep(0.25)
    ended = await state_stub.EndTurn(
        unversioned(
            end(
                lapsed,
                {"by": "lapsed"},
                settle(lapsed.messages[0].message_id, pb.MESSAGE_STATUS_NORMAL),
            )
        )
    )
    assert ended.version == 1 and ended.lease_released
    assert await get_state(state_stub, user_id, cid) == ({"by": "lapsed"}, 1)
    assert (
        await state_stub.AcquireLease(
            pb.AcquireLeaseRequest(user_id=user_id, conversation_id=cid, holder="x", ttl_ms=1000)
        )
    ).lapsed_task_id == ""


async def test_a_refused_end_turn_saves_nothing_and_keeps_the_lease(
    state_stub: Stub, user_id: str
) -> None:
    begun = await state_stub.BeginTurn(begin(user_id, new_messages=[STREAMING_REPLY]))
    cid = begun.conversation.conversation_id
    await expect_rpc_error(
        state_stub.EndTurn(
            end(
                begun,
                {"n": 1},
                settle(begun.messages[0].message_id, pb.MESSAGE_STATUS_NORMAL),
                expected_version=3,
            )
        ),
        grpc.StatusCode.ABORTED,
        "expected version 3",
    )
    await expect_rpc_error(
        state_stub.EndTurn(end(begun, {"n": 1}, settle("99", pb.MESSAGE_STATUS_NORMAL))),
        grpc.StatusCode.NOT_FOUND,
        "message_writes[0]",
    )
    await expect_rpc_error(
        state_stub.EndTurn(end(begun, {"n": 1}, task_id="")),
        grpc.StatusCode.INVALID_ARGUMENT,
        "task_id",
    )
    await expect_rpc_error(
        state_stub.GetState(pb.GetStateRequest(user_id=user_id, conversation_id=cid)),
        grpc.StatusCode.NOT_FOUND,
    )
    assert [m.status for m in await all_messages(state_stub, user_id, cid)] == [
        pb.MESSAGE_STATUS_STREAMING
    ]
    await expect_rpc_error(
        state_stub.AcquireLease(
            pb.AcquireLeaseRequest(user_id=user_id, conversation_id=cid, holder="x", ttl_ms=1000)
        ),
        FAILED,
        "running turn",
    )
    # Once the lease is gone (released by hand), the save still lands; nothing to release.
    await state_stub.ReleaseLease(
        pb.ReleaseLeaseRequest(user_id=user_id, task_id=begun.lease.task_id)
    )
    ended = await state_stub.EndTurn(end(begun, {"n": 1}))
    assert ended.version == 1 and not ended.lease_released


async def test_begin_turn_is_scoped_by_user_and_checks_input(
    state_stub: Stub, user_id: str, other_user_id: str
) -> None:
    cid = await new_conversation(state_stub, user_id)
    await expect_rpc_error(
        state_stub.BeginTurn(begin(other_user_id, cid, new_messages=[user_text("q")])),
        grpc.StatusCode.NOT_FOUND,
        f"conversation {cid} not found",
    )
    for request, error in [
        (begin(user_id, cid, holder=""), "holder"),
        (begin(user_id, cid, ttl_ms=5), "ttl_ms"),
        (begin(user_id, "abc"), "conversation_id"),
        (begin(user_id, cid, max_user_leases=-1), "max_user_leases"),
        (begin(user_id, title="x" * 201), "title"),
        (begin(user_id, cid, new_messages=[pb.NewMessage()]), "new_messages[0].role"),
    ]:
        await expect_rpc_error(
            state_stub.BeginTurn(request), grpc.StatusCode.INVALID_ARGUMENT, error
        )
    assert await all_messages(state_stub, user_id, cid) == []
    listed = await state_stub.ListConversations(pb.ListConversationsRequest(user_id=user_id))
    assert len(listed.conversations) == 1


@pytest.mark.parametrize("rounds", [20])
async def test_one_of_many_simultaneous_turns_starts(
    state_stub: Stub, user_id: str, rounds: int
) -> None:
    """Replicas racing for one conversation: exactly one BeginTurn wins each round."""
    cid = await new_conversation(state_stub, user_id)
    for _ in range(rounds):
        results = await asyncio.gather(
            *(
                state_stub.BeginTurn(begin(user_id, cid, new_messages=[STREAMING_REPLY]))
                for _ in range(5)
            ),
            return_exceptions=True,
        )
        won = [r for r in results if isinstance(r, pb.BeginTurnResponse)]
        lost = [r for r in results if isinstance(r, grpc.aio.AioRpcError)]
        assert len(won) == 1 and len(lost) == 4
        assert all(e.code() == FAILED for e in lost)
        await state_stub.EndTurn(
            end(
                won[0],
                {"ok": True},
                settle(won[0].messages[0].message_id, pb.MESSAGE_STATUS_NORMAL),
            )
        )
    records = await all_messages(state_stub, user_id, cid)
    assert len(records) == rounds  # only the winners appended anything
