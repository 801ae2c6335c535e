"""Error statuses carry a google.rpc.Status with a google.rpc.ErrorInfo, beside the trailers.

Read the way a caller reads them: grpcio-status's rpc_status.from_call on the failed call,
which also checks that the detail's code and message are the call's.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable
from typing import Any, TypeAlias

import grpc
from google.rpc import error_details_pb2
from grpc_status import rpc_status

from agentstate.agent.v1 import agent_service_pb2 as apb
from agentstate.common.error_details import DOMAIN
from agentstate.state.v1 import state_service_pb2 as pb
from agentstate.state.v1 import state_service_pb2_grpc as pb_grpc
from tests.support.agent_harness import Stack, metadata
from tests.support.helpers import expect_rpc_error, new_conversation, put_state, trailer, user_text
from tests.support.source_example import QUESTION

Stub: TypeAlias = "pb_grpc.StateServiceAsyncStub"


def error_info(error: grpc.aio.AioRpcError) -> tuple[str, dict[str, str]]:
    """The call's ErrorInfo as (reason, metadata); fails when there is none."""
    status = rpc_status.from_call(error)  # type: ignore[arg-type]
    assert status is not None, f"no grpc-status-details-bin on {error.code()}"
    assert status.code == error.code().value[0] and status.message == error.details()
    (packed,) = status.details
    info = error_details_pb2.ErrorInfo()
    assert packed.Unpack(info), packed.type_url
    assert info.domain == DOMAIN
    return info.reason, dict(info.metadata)


async def failure(call: Awaitable[Any], code: grpc.StatusCode, contains: str = "") -> Any:
    return await expect_rpc_error(call, code, contains)


async def test_version_conflict_carries_the_current_version(state_stub: Stub, user_id: str) -> None:
    cid = await new_conversation(state_stub, user_id)
    assert await put_state(state_stub, user_id, cid, {"turn": 1}, expected_version=0) == 1
    assert await put_state(state_stub, user_id, cid, {"turn": 2}, expected_version=1) == 2
    stale = pb.UpsertStateRequest(
        user_id=user_id, conversation_id=cid, payload=b'{"turn": 3}', expected_version=1
    )
    error = await failure(state_stub.UpsertState(stale), grpc.StatusCode.ABORTED)
    assert error_info(error) == (
        "VERSION_CONFLICT",
        {"current_version": "2", "expected_version": "1"},
    )
    assert trailer(error, "agentstate-current-version") == "2"  # kept for existing clients

    create_only = pb.UpsertStateRequest(
        user_id=user_id, conversation_id=cid, payload=b"{}", expected_version=0
    )
    error = await failure(state_stub.UpsertState(create_only), grpc.StatusCode.ABORTED)
    assert error_info(error)[1]["current_version"] == "2"


async def test_not_found_says_what_is_missing(
    state_stub: Stub, user_id: str, other_user_id: str
) -> None:
    cid = await new_conversation(state_stub, user_id)
    no_state = await failure(
        state_stub.GetState(pb.GetStateRequest(user_id=user_id, conversation_id=cid)),
        grpc.StatusCode.NOT_FOUND,
    )
    assert error_info(no_state) == ("NOT_FOUND", {"missing": "state"})
    assert trailer(no_state, "agentstate-missing") == "state"
    stranger = await failure(
        state_stub.GetState(pb.GetStateRequest(user_id=other_user_id, conversation_id=cid)),
        grpc.StatusCode.NOT_FOUND,
    )
    assert error_info(stranger) == ("NOT_FOUND", {"missing": "conversation"})
    await state_stub.DeleteConversation(
        pb.DeleteConversationRequest(user_id=user_id, conversation_id=cid)
    )
    late = await failure(
        state_stub.AppendMessage(
            pb.AppendMessageRequest(user_id=user_id, conversation_id=cid, message=user_text("x"))
        ),
        grpc.StatusCode.NOT_FOUND,
    )
    assert error_info(late) == ("NOT_FOUND", {"missing": "conversation"})


async def test_invalid_argument_and_payload_too_large(state_stub: Stub, user_id: str) -> None:
    bad_id = await failure(
        state_stub.GetState(pb.GetStateRequest(user_id=user_id, conversation_id="0x12")),
        grpc.StatusCode.INVALID_ARGUMENT,
    )
    assert error_info(bad_id) == ("INVALID_ARGUMENT", {})
    cid = await new_conversation(state_stub, user_id)
    huge = json.dumps({"blob": "x" * (2 * 1024 * 1024)}).encode()  # over the test limit
    too_large = await failure(
        state_stub.UpsertState(
            pb.UpsertStateRequest(user_id=user_id, conversation_id=cid, payload=huge)
        ),
        grpc.StatusCode.RESOURCE_EXHAUSTED,
    )
    assert error_info(too_large) == ("PAYLOAD_TOO_LARGE", {})


async def test_failed_preconditions_say_which(state_stub: Stub, user_id: str) -> None:
    cid = await new_conversation(state_stub, user_id)

    def acquire(conversation_id: str, limit: int = 0) -> pb.AcquireLeaseRequest:
        return pb.AcquireLeaseRequest(
            user_id=user_id,
            conversation_id=conversation_id,
            holder="replica-a",
            ttl_ms=30_000,
            max_user_leases=limit,
        )

    lease = (await state_stub.AcquireLease(acquire(cid))).lease
    held = await failure(state_stub.AcquireLease(acquire(cid)), grpc.StatusCode.FAILED_PRECONDITION)
    assert error_info(held) == ("LEASE_HELD", {"holder": "replica-a"})  # for operators
    other = await new_conversation(state_stub, user_id)
    limited = await failure(
        state_stub.AcquireLease(acquire(other, limit=1)), grpc.StatusCode.RESOURCE_EXHAUSTED
    )
    assert error_info(limited) == ("LIMIT_REACHED", {})
    await state_stub.ReleaseLease(pb.ReleaseLeaseRequest(user_id=user_id, task_id=lease.task_id))
    lost = await failure(
        state_stub.RenewLease(
            pb.RenewLeaseRequest(user_id=user_id, task_id=lease.task_id, ttl_ms=30_000)
        ),
        grpc.StatusCode.FAILED_PRECONDITION,
    )
    assert error_info(lost) == ("LEASE_LOST", {})

    appended = await state_stub.AppendMessage(
        pb.AppendMessageRequest(user_id=user_id, conversation_id=cid, message=user_text("hi"))
    )
    mismatch = await failure(
        state_stub.UpdateMessage(
            pb.UpdateMessageRequest(
                user_id=user_id,
                conversation_id=cid,
                update=pb.MessageUpdate(
                    message_id=appended.message.message_id,
                    status=pb.MESSAGE_STATUS_ERROR,
                    expected_status=pb.MESSAGE_STATUS_STREAMING,
                ),
            )
        ),
        grpc.StatusCode.FAILED_PRECONDITION,
    )
    assert error_info(mismatch) == ("MESSAGE_STATUS_MISMATCH", {})


async def test_agent_statuses_carry_details(stack: Stack, user_id: str) -> None:
    client = stack.agents[0][1]
    stub: Any = client.stub
    anonymous = await failure(
        stub.ListConversations(apb.ListConversationsRequest()), grpc.StatusCode.UNAUTHENTICATED
    )
    assert error_info(anonymous) == ("UNAUTHENTICATED", {})

    first = await client.chat(user_id, QUESTION)
    conversation_id = first.meta.conversation_id
    # A new question while the card is open names the card to answer.
    pending = await client.chat(user_id, "还在吗？", conversation_id)
    assert pending.code == grpc.StatusCode.FAILED_PRECONDITION, pending.details
    pending_call = stub.Chat(
        apb.ChatRequest(conversation_id=conversation_id, question="还在吗？"),
        metadata=metadata(user_id),
    )
    open_card = await failure(_drain(pending_call), grpc.StatusCode.FAILED_PRECONDITION)
    assert error_info(open_card) == (
        "CARD_PENDING",
        {"awaiting_message_id": first.card.message_id},
    )
    denied = await client.confirm(user_id, conversation_id, first.card.message_id, False)
    assert denied.code == grpc.StatusCode.OK, denied.details
    again_call = stub.Confirm(
        apb.ConfirmRequest(conversation_id=conversation_id, message_id=first.card.message_id),
        metadata=metadata(user_id),
    )
    again = await failure(_drain(again_call), grpc.StatusCode.FAILED_PRECONDITION, "already")
    assert error_info(again) == ("CARD_ALREADY_HANDLED", {})

    # A state-service status passed through keeps the state service's reason and metadata.
    missing = await failure(
        stub.DeleteConversation(
            apb.DeleteConversationRequest(conversation_id=str(int(conversation_id) + 1)),
            metadata=metadata(user_id),
        ),
        grpc.StatusCode.NOT_FOUND,
    )
    assert error_info(missing) == ("NOT_FOUND", {"missing": "conversation"})

    await stack.stop_state()
    down = await failure(
        stub.ListConversations(apb.ListConversationsRequest(), metadata=metadata(user_id)),
        grpc.StatusCode.UNAVAILABLE,
    )
    reason, details = error_info(down)
    assert reason == "UNAVAILABLE" and list(details) == ["detail"]  # gRPC's words, for operators
    assert "unavailable" in down.details() and stack.state_address not in down.details()


async def _drain(call: Any) -> None:
    async for _ in call:
        pass


async def test_turn_rpcs_say_which_precondition(state_stub: Stub, user_id: str) -> None:
    """BeginTurn/EndTurn: a held lease, an open card (named), a card answered already, a lost
    lease; each with its reason, whatever the store."""

    def begin(cid: str, **guard: Any) -> pb.BeginTurnRequest:
        return pb.BeginTurnRequest(
            user_id=user_id, conversation_id=cid, holder="replica-1", ttl_ms=60_000, **guard
        )

    card = pb.NewMessage(role=pb.MESSAGE_ROLE_ASSISTANT, status=pb.MESSAGE_STATUS_AWAITING_CONFIRM)
    first = await state_stub.BeginTurn(
        pb.BeginTurnRequest(user_id=user_id, holder="replica-1", ttl_ms=60_000, new_messages=[card])
    )
    cid, card_id = first.conversation.conversation_id, first.messages[0].message_id
    held = await failure(state_stub.BeginTurn(begin(cid)), grpc.StatusCode.FAILED_PRECONDITION)
    assert error_info(held) == ("LEASE_HELD", {"holder": "replica-1"})  # for operators
    await state_stub.ReleaseLease(
        pb.ReleaseLeaseRequest(user_id=user_id, task_id=first.lease.task_id)
    )

    open_card = await failure(
        state_stub.BeginTurn(begin(cid, require_none_awaiting=True)),
        grpc.StatusCode.FAILED_PRECONDITION,
    )
    assert error_info(open_card) == ("CARD_PENDING", {"awaiting_message_id": card_id})
    assert trailer(open_card, "agentstate-awaiting-message") == card_id

    await state_stub.UpdateMessage(
        pb.UpdateMessageRequest(
            user_id=user_id,
            conversation_id=cid,
            update=pb.MessageUpdate(message_id=card_id, status=pb.MESSAGE_STATUS_NORMAL),
        )
    )
    answered = await failure(
        state_stub.BeginTurn(begin(cid, require_awaiting_message_id=card_id)),
        grpc.StatusCode.FAILED_PRECONDITION,
    )
    assert error_info(answered) == ("CARD_ALREADY_HANDLED", {})

    # A lease that lapsed and was taken over: the late turn's save is refused.
    late = await state_stub.BeginTurn(
        pb.BeginTurnRequest(user_id=user_id, conversation_id=cid, holder="slow", ttl_ms=100)
    )
    await asyncio.sleep(0.25)
    await state_stub.BeginTurn(begin(cid))
    lost = await failure(
        state_stub.EndTurn(
            pb.EndTurnRequest(
                user_id=user_id, conversation_id=cid, task_id=late.lease.task_id, payload=b"{}"
            )
        ),
        grpc.StatusCode.FAILED_PRECONDITION,
    )
    assert error_info(lost) == ("LEASE_LOST", {})
