"""The state service's behaviour through real gRPC, against both stores.

Every test runs twice (see the `store` fixture): on PostgreSQL and in memory.
"""

from __future__ import annotations

import asyncio
import json
import re
from typing import TypeAlias

import grpc
import pytest

from agentstate.state.v1 import state_service_pb2 as pb
from agentstate.state.v1 import state_service_pb2_grpc as pb_grpc
from agentstate.state_service.servicer import CURRENT_VERSION_TRAILER, MISSING_TRAILER
from agentstate.state_service.storage.postgres import PostgresStore
from tests.conftest import TEST_MAX_PAYLOAD_BYTES
from tests.support.helpers import (
    all_messages,
    expect_rpc_error,
    get_state,
    new_conversation,
    put_state,
    trailer,
    user_text,
)
from tests.support.source_example import source_agent_state, source_state_bytes

Stub: TypeAlias = "pb_grpc.StateServiceAsyncStub"
INVALID = grpc.StatusCode.INVALID_ARGUMENT
NOT_FOUND = grpc.StatusCode.NOT_FOUND

# ------------------------------------------------------------------ conversations


async def test_conversation_lifecycle(state_stub: Stub, user_id: str) -> None:
    created = (
        await state_stub.CreateConversation(
            pb.CreateConversationRequest(user_id=user_id, title="  Apple   Watch ")
        )
    ).conversation
    assert created.user_id == user_id
    assert created.title == "Apple Watch"
    assert created.conversation_id.isdigit() and int(created.conversation_id) > 2**40
    fetched = (
        await state_stub.GetConversation(
            pb.GetConversationRequest(user_id=user_id, conversation_id=created.conversation_id)
        )
    ).conversation
    assert fetched == created
    renamed = (
        await state_stub.RenameConversation(
            pb.RenameConversationRequest(
                user_id=user_id, conversation_id=created.conversation_id, title="Order 88235"
            )
        )
    ).conversation
    assert renamed.title == "Order 88235"
    assert renamed.update_time.ToDatetime() >= created.update_time.ToDatetime()


async def test_untitled_conversation_gets_default_title(state_stub: Stub, user_id: str) -> None:
    response = await state_stub.CreateConversation(pb.CreateConversationRequest(user_id=user_id))
    assert response.conversation.title == "New conversation"


async def test_ids_are_server_generated_and_unique(state_stub: Stub, user_id: str) -> None:
    ids = await asyncio.gather(*(new_conversation(state_stub, user_id) for _ in range(50)))
    assert len(set(ids)) == 50


async def test_list_conversations_newest_first_in_pages(state_stub: Stub, user_id: str) -> None:
    ids = [await new_conversation(state_stub, user_id, f"c{i}") for i in range(7)]
    seen: list[str] = []
    token = ""
    pages = 0
    while True:
        page = await state_stub.ListConversations(
            pb.ListConversationsRequest(user_id=user_id, page_size=3, page_token=token)
        )
        seen.extend(c.conversation_id for c in page.conversations)
        pages += 1
        token = page.next_page_token
        if not token:
            break
    assert seen == list(reversed(ids))
    assert pages == 3


@pytest.mark.parametrize(
    ("request_", "message"),
    [
        (pb.CreateConversationRequest(user_id=""), "user_id is required"),
        (pb.CreateConversationRequest(user_id="x" * 129), "longer than 128"),
        (pb.CreateConversationRequest(user_id="a\nb"), "printable"),
        (pb.CreateConversationRequest(user_id="u", title="t" * 201), "longer than 200"),
    ],
)
async def test_create_conversation_rejects_bad_input(
    state_stub: Stub, request_: pb.CreateConversationRequest, message: str
) -> None:
    await expect_rpc_error(state_stub.CreateConversation(request_), INVALID, message)


@pytest.mark.parametrize("bad_id", ["", "abc", "0", "-5", "01", "99999999999999999999"])
async def test_malformed_conversation_id_is_invalid_argument(
    state_stub: Stub, user_id: str, bad_id: str
) -> None:
    await expect_rpc_error(
        state_stub.GetConversation(
            pb.GetConversationRequest(user_id=user_id, conversation_id=bad_id)
        ),
        INVALID,
        "conversation_id",
    )


async def test_unknown_conversation_is_not_found(state_stub: Stub, user_id: str) -> None:
    await expect_rpc_error(
        state_stub.GetConversation(
            pb.GetConversationRequest(user_id=user_id, conversation_id="42")
        ),
        NOT_FOUND,
        "conversation 42 not found",
    )


async def test_rename_rejects_empty_title_and_keeps_old(state_stub: Stub, user_id: str) -> None:
    cid = await new_conversation(state_stub, user_id, "kept")
    await expect_rpc_error(
        state_stub.RenameConversation(
            pb.RenameConversationRequest(user_id=user_id, conversation_id=cid, title="   ")
        ),
        INVALID,
        "title must not be empty",
    )
    got = await state_stub.GetConversation(
        pb.GetConversationRequest(user_id=user_id, conversation_id=cid)
    )
    assert got.conversation.title == "kept"


async def test_bad_page_token_and_size(state_stub: Stub, user_id: str) -> None:
    await expect_rpc_error(
        state_stub.ListConversations(pb.ListConversationsRequest(user_id=user_id, page_token="x")),
        INVALID,
        "page_token is malformed",
    )
    await expect_rpc_error(
        state_stub.ListConversations(pb.ListConversationsRequest(user_id=user_id, page_size=-1)),
        INVALID,
        "page_size",
    )


# ------------------------------------------------------------------------ state


async def test_source_state_round_trips(state_stub: Stub, user_id: str) -> None:
    cid = await new_conversation(state_stub, user_id)
    payload = source_state_bytes()
    upserted = await state_stub.UpsertState(
        pb.UpsertStateRequest(user_id=user_id, conversation_id=cid, payload=payload)
    )
    assert upserted.version == 1
    got = await state_stub.GetState(pb.GetStateRequest(user_id=user_id, conversation_id=cid))
    assert got.version == 1
    assert got.update_time == upserted.update_time
    assert json.loads(got.payload) == source_agent_state()
    stored = json.loads(got.payload)
    assert len(stored) == 11
    roles = [m["role"] for m in stored["context"]]
    assert roles == [
        "USER",
        "ASSISTANT",
        "TOOL",
        "ASSISTANT",
        "TOOL",
        "ASSISTANT",
        "TOOL",
        "ASSISTANT",
    ]


async def test_state_keys_are_separate(state_stub: Stub, user_id: str) -> None:
    cid = await new_conversation(state_stub, user_id)
    await put_state(state_stub, user_id, cid, {"which": "default"})
    await state_stub.UpsertState(
        pb.UpsertStateRequest(
            user_id=user_id,
            conversation_id=cid,
            state_key="planner",
            payload=b'{"which":"planner"}',
        )
    )
    state, _ = await get_state(state_stub, user_id, cid)
    assert state == {"which": "default"}
    explicit = await state_stub.GetState(
        pb.GetStateRequest(user_id=user_id, conversation_id=cid, state_key="agent_state")
    )
    assert json.loads(explicit.payload) == {"which": "default"}
    await expect_rpc_error(
        state_stub.GetState(
            pb.GetStateRequest(user_id=user_id, conversation_id=cid, state_key="bad key!")
        ),
        INVALID,
        "state_key",
    )


async def test_get_state_not_found(state_stub: Stub, user_id: str) -> None:
    cid = await new_conversation(state_stub, user_id)
    await expect_rpc_error(
        state_stub.GetState(pb.GetStateRequest(user_id=user_id, conversation_id=cid)),
        NOT_FOUND,
        "has no state",
    )
    await expect_rpc_error(
        state_stub.GetState(pb.GetStateRequest(user_id=user_id, conversation_id="77")),
        NOT_FOUND,
        "conversation 77 not found",
    )


async def test_upsert_replaces_whole_payload_and_counts_versions(
    state_stub: Stub, user_id: str
) -> None:
    cid = await new_conversation(state_stub, user_id)
    assert await put_state(state_stub, user_id, cid, {"a": 1, "b": 2}) == 1
    assert await put_state(state_stub, user_id, cid, {"c": 3}) == 2
    assert await get_state(state_stub, user_id, cid) == ({"c": 3}, 2)


async def test_compare_and_set(state_stub: Stub, user_id: str) -> None:
    cid = await new_conversation(state_stub, user_id)
    assert await put_state(state_stub, user_id, cid, {"n": 1}, expected_version=0) == 1
    error = await expect_rpc_error(
        put_state(state_stub, user_id, cid, {"n": "lost"}, expected_version=0),
        grpc.StatusCode.ABORTED,
        "current version is 1",
    )
    assert trailer(error, CURRENT_VERSION_TRAILER) == "1"
    assert await put_state(state_stub, user_id, cid, {"n": 2}, expected_version=1) == 2
    await expect_rpc_error(
        put_state(state_stub, user_id, cid, {"n": "stale"}, expected_version=1),
        grpc.StatusCode.ABORTED,
        "expected version 1, current version is 2",
    )
    assert await get_state(state_stub, user_id, cid) == ({"n": 2}, 2)


async def test_compare_and_set_on_absent_state(state_stub: Stub, user_id: str) -> None:
    cid = await new_conversation(state_stub, user_id)
    error = await expect_rpc_error(
        put_state(state_stub, user_id, cid, {"n": 1}, expected_version=3),
        grpc.StatusCode.ABORTED,
        "no state exists",
    )
    assert trailer(error, CURRENT_VERSION_TRAILER) == "0"
    await expect_rpc_error(
        state_stub.GetState(pb.GetStateRequest(user_id=user_id, conversation_id=cid)), NOT_FOUND
    )


@pytest.mark.parametrize(
    ("payload", "code", "message"),
    [
        (b"[1, 2]", INVALID, "must be a JSON object"),
        (b'"text"', INVALID, "must be a JSON object"),
        (b"", INVALID, "must be a JSON object"),
        (b'{"a": ', INVALID, "payload is not JSON"),
        (b'{"a": 1} {}', INVALID, "extra data"),
        (b'{"a": "\xff\xfe"}', INVALID, "payload is not UTF-8"),
        (
            b'{"a": "' + b"x" * TEST_MAX_PAYLOAD_BYTES + b'"}',
            grpc.StatusCode.RESOURCE_EXHAUSTED,
            f"over the limit of {TEST_MAX_PAYLOAD_BYTES} bytes",
        ),
    ],
    ids=["array", "string", "empty", "truncated", "two-values", "bad-utf8", "too-large"],
)
async def test_bad_payload_is_rejected_and_nothing_changes(
    state_stub: Stub, user_id: str, payload: bytes, code: grpc.StatusCode, message: str
) -> None:
    cid = await new_conversation(state_stub, user_id)
    await put_state(state_stub, user_id, cid, {"kept": True})
    await expect_rpc_error(
        state_stub.UpsertState(
            pb.UpsertStateRequest(
                user_id=user_id,
                conversation_id=cid,
                payload=payload,
                message_writes=[pb.MessageWrite(insert=user_text("must not be stored"))],
            )
        ),
        code,
        message,
    )
    assert await get_state(state_stub, user_id, cid) == ({"kept": True}, 1)
    assert await all_messages(state_stub, user_id, cid) == []


async def test_negative_expected_version_is_invalid(state_stub: Stub, user_id: str) -> None:
    cid = await new_conversation(state_stub, user_id)
    await expect_rpc_error(
        put_state(state_stub, user_id, cid, {}, expected_version=-1), INVALID, "expected_version"
    )


async def test_concurrent_writers_compare_and_set(state_stub: Stub, user_id: str) -> None:
    """20 writers, each writing with the version it read: no write is lost silently."""
    cid = await new_conversation(state_stub, user_id)
    await put_state(state_stub, user_id, cid, {"writers": []})
    versions: list[int] = []
    conflicts = 0

    async def writer(name: str) -> None:
        nonlocal conflicts
        for _ in range(200):
            state, version = await get_state(state_stub, user_id, cid)
            state["writers"].append(name)
            try:
                versions.append(
                    await put_state(state_stub, user_id, cid, state, expected_version=version)
                )
                return
            except grpc.aio.AioRpcError as exc:
                assert exc.code() == grpc.StatusCode.ABORTED, exc.details()
                conflicts += 1
        raise AssertionError(f"{name} never got its write in")

    await asyncio.gather(*(writer(f"w{i}") for i in range(20)))
    final, final_version = await get_state(state_stub, user_id, cid)
    assert sorted(final["writers"]) == sorted(f"w{i}" for i in range(20))  # nothing lost
    assert sorted(versions) == list(range(2, 22))  # every success got a unique version
    assert final_version == 1 + len(versions)
    assert conflicts > 0  # they really did race


async def test_one_shot_concurrent_writers(state_stub: Stub, user_id: str) -> None:
    """All 20 start from the same version: exactly one succeeds, 19 are ABORTED."""
    cid = await new_conversation(state_stub, user_id)
    await put_state(state_stub, user_id, cid, {"winner": None})
    results = await asyncio.gather(
        *(
            put_state(state_stub, user_id, cid, {"winner": i}, expected_version=1)
            for i in range(20)
        ),
        return_exceptions=True,
    )
    wins = [r for r in results if isinstance(r, int)]
    aborted = [r for r in results if isinstance(r, grpc.aio.AioRpcError)]
    assert wins == [2]
    assert len(aborted) == 19
    assert all(e.code() == grpc.StatusCode.ABORTED for e in aborted)
    _, version = await get_state(state_stub, user_id, cid)
    assert version == 2


# --------------------------------------------------------------------- messages


async def test_messages_append_update_and_replay_in_order(state_stub: Stub, user_id: str) -> None:
    cid = await new_conversation(state_stub, user_id)
    appended = []
    for i in range(5):
        response = await state_stub.AppendMessage(
            pb.AppendMessageRequest(
                user_id=user_id, conversation_id=cid, message=user_text(f"q{i}")
            )
        )
        appended.append(response.message)
    assert all(m.status == pb.MESSAGE_STATUS_NORMAL for m in appended)
    assert all(json.loads(m.metadata_json) == {} for m in appended)
    updated = (
        await state_stub.UpdateMessage(
            pb.UpdateMessageRequest(
                user_id=user_id,
                conversation_id=cid,
                update=pb.MessageUpdate(
                    message_id=appended[2].message_id, status=pb.MESSAGE_STATUS_INTERRUPTED
                ),
            )
        )
    ).message
    assert updated.status == pb.MESSAGE_STATUS_INTERRUPTED
    assert json.loads(updated.blocks_json) == [{"type": "text", "text": "q2"}]
    page = await state_stub.ListMessages(
        pb.ListMessagesRequest(user_id=user_id, conversation_id=cid, page_size=2)
    )
    assert [m.message_id for m in page.messages] == [m.message_id for m in appended[:2]]
    records = await all_messages(state_stub, user_id, cid)
    assert [json.loads(m.blocks_json)[0]["text"] for m in records] == [f"q{i}" for i in range(5)]
    assert records[2].status == pb.MESSAGE_STATUS_INTERRUPTED


async def test_message_status_compare_and_set(state_stub: Stub, user_id: str) -> None:
    cid = await new_conversation(state_stub, user_id)
    card = (
        await state_stub.AppendMessage(
            pb.AppendMessageRequest(
                user_id=user_id,
                conversation_id=cid,
                message=pb.NewMessage(
                    role=pb.MESSAGE_ROLE_ASSISTANT,
                    status=pb.MESSAGE_STATUS_AWAITING_CONFIRM,
                    metadata_json=b'{"card": "pending"}',
                ),
            )
        )
    ).message
    settle = pb.UpdateMessageRequest(
        user_id=user_id,
        conversation_id=cid,
        update=pb.MessageUpdate(
            message_id=card.message_id,
            status=pb.MESSAGE_STATUS_NORMAL,
            metadata_json=b'{"card": "denied"}',
            expected_status=pb.MESSAGE_STATUS_AWAITING_CONFIRM,
        ),
    )
    settled = (await state_stub.UpdateMessage(settle)).message
    assert json.loads(settled.metadata_json) == {"card": "denied"}
    await expect_rpc_error(
        state_stub.UpdateMessage(settle),
        grpc.StatusCode.FAILED_PRECONDITION,
        "has status NORMAL, expected AWAITING_CONFIRM",
    )


@pytest.mark.parametrize(
    ("message", "error"),
    [
        (pb.NewMessage(), "role"),
        (pb.NewMessage(role=pb.MESSAGE_ROLE_USER, blocks_json=b'{"not": "array"}'), "array"),
        (pb.NewMessage(role=pb.MESSAGE_ROLE_USER, metadata_json=b"[]"), "object"),
        (pb.NewMessage(role=pb.MESSAGE_ROLE_USER, blocks_json=b"[1,"), "JSON"),
        (pb.NewMessage(role=pb.MESSAGE_ROLE_USER, status=99), "MessageStatus"),  # type: ignore[arg-type]
    ],
    ids=["no-role", "blocks-object", "metadata-array", "blocks-truncated", "unknown-status"],
)
async def test_append_rejects_bad_message(
    state_stub: Stub, user_id: str, message: pb.NewMessage, error: str
) -> None:
    cid = await new_conversation(state_stub, user_id)
    await expect_rpc_error(
        state_stub.AppendMessage(
            pb.AppendMessageRequest(user_id=user_id, conversation_id=cid, message=message)
        ),
        INVALID,
        error,
    )
    assert await all_messages(state_stub, user_id, cid) == []


async def test_update_unknown_message_is_not_found(state_stub: Stub, user_id: str) -> None:
    cid = await new_conversation(state_stub, user_id)
    await expect_rpc_error(
        state_stub.UpdateMessage(
            pb.UpdateMessageRequest(
                user_id=user_id,
                conversation_id=cid,
                update=pb.MessageUpdate(message_id="123", status=pb.MESSAGE_STATUS_NORMAL),
            )
        ),
        NOT_FOUND,
        "message 123 not found",
    )


async def test_upsert_with_message_writes_is_atomic(state_stub: Stub, user_id: str) -> None:
    cid = await new_conversation(state_stub, user_id)
    first = await state_stub.UpsertState(
        pb.UpsertStateRequest(
            user_id=user_id,
            conversation_id=cid,
            payload=b'{"turn": 1}',
            expected_version=0,
            message_writes=[
                pb.MessageWrite(insert=user_text("cancel it")),
                pb.MessageWrite(
                    insert=pb.NewMessage(
                        role=pb.MESSAGE_ROLE_ASSISTANT, status=pb.MESSAGE_STATUS_AWAITING_CONFIRM
                    )
                ),
            ],
        )
    )
    assert [m.status for m in first.messages] == [
        pb.MESSAGE_STATUS_NORMAL,
        pb.MESSAGE_STATUS_AWAITING_CONFIRM,
    ]
    card_id = first.messages[1].message_id
    # The second write fails (unknown message): the state and the first write stay unapplied.
    await expect_rpc_error(
        state_stub.UpsertState(
            pb.UpsertStateRequest(
                user_id=user_id,
                conversation_id=cid,
                payload=b'{"turn": 2}',
                expected_version=1,
                message_writes=[
                    pb.MessageWrite(
                        update=pb.MessageUpdate(message_id=card_id, status=pb.MESSAGE_STATUS_NORMAL)
                    ),
                    pb.MessageWrite(
                        update=pb.MessageUpdate(message_id="5", status=pb.MESSAGE_STATUS_NORMAL)
                    ),
                ],
            )
        ),
        NOT_FOUND,
        "message_writes[1]",
    )
    # A stale expected_status fails the same way.
    await expect_rpc_error(
        state_stub.UpsertState(
            pb.UpsertStateRequest(
                user_id=user_id,
                conversation_id=cid,
                payload=b'{"turn": 2}',
                message_writes=[
                    pb.MessageWrite(insert=user_text("not stored")),
                    pb.MessageWrite(
                        update=pb.MessageUpdate(
                            message_id=card_id,
                            status=pb.MESSAGE_STATUS_NORMAL,
                            expected_status=pb.MESSAGE_STATUS_STREAMING,
                        )
                    ),
                ],
            )
        ),
        grpc.StatusCode.FAILED_PRECONDITION,
        "expected STREAMING",
    )
    # A version conflict rolls the message writes back too.
    await expect_rpc_error(
        state_stub.UpsertState(
            pb.UpsertStateRequest(
                user_id=user_id,
                conversation_id=cid,
                payload=b'{"turn": 2}',
                expected_version=7,
                message_writes=[pb.MessageWrite(insert=user_text("not stored either"))],
            )
        ),
        grpc.StatusCode.ABORTED,
    )
    # An empty write is a client error.
    await expect_rpc_error(
        state_stub.UpsertState(
            pb.UpsertStateRequest(
                user_id=user_id,
                conversation_id=cid,
                payload=b'{"turn": 2}',
                message_writes=[pb.MessageWrite()],
            )
        ),
        INVALID,
        "must set insert or update",
    )
    assert await get_state(state_stub, user_id, cid) == ({"turn": 1}, 1)
    records = await all_messages(state_stub, user_id, cid)
    assert [m.status for m in records] == [
        pb.MESSAGE_STATUS_NORMAL,
        pb.MESSAGE_STATUS_AWAITING_CONFIRM,
    ]
    # And the settling write commits with the state.
    settled = await state_stub.UpsertState(
        pb.UpsertStateRequest(
            user_id=user_id,
            conversation_id=cid,
            payload=b'{"turn": 2}',
            expected_version=1,
            message_writes=[
                pb.MessageWrite(
                    update=pb.MessageUpdate(
                        message_id=card_id,
                        status=pb.MESSAGE_STATUS_NORMAL,
                        expected_status=pb.MESSAGE_STATUS_AWAITING_CONFIRM,
                    )
                )
            ],
        )
    )
    assert settled.version == 2
    assert settled.messages[0].status == pb.MESSAGE_STATUS_NORMAL


# ----------------------------------------------------------------------- delete


async def _populated(stub: Stub, user_id: str, messages: int = 3) -> str:
    cid = await new_conversation(stub, user_id)
    await stub.UpsertState(
        pb.UpsertStateRequest(
            user_id=user_id,
            conversation_id=cid,
            payload=source_state_bytes(),
            message_writes=[pb.MessageWrite(insert=user_text(f"m{i}")) for i in range(messages)],
        )
    )
    await stub.UpsertState(
        pb.UpsertStateRequest(
            user_id=user_id, conversation_id=cid, state_key="scratch", payload=b"{}"
        )
    )
    return cid


async def _assert_gone(stub: Stub, user_id: str, cid: str) -> None:
    await expect_rpc_error(
        stub.GetConversation(pb.GetConversationRequest(user_id=user_id, conversation_id=cid)),
        NOT_FOUND,
    )
    await expect_rpc_error(
        stub.GetState(pb.GetStateRequest(user_id=user_id, conversation_id=cid)), NOT_FOUND
    )
    await expect_rpc_error(
        stub.ListMessages(pb.ListMessagesRequest(user_id=user_id, conversation_id=cid)), NOT_FOUND
    )


async def test_delete_conversation_removes_everything(state_stub: Stub, user_id: str) -> None:
    cid = await _populated(state_stub, user_id)
    keep = await _populated(state_stub, user_id)
    deleted = await state_stub.DeleteConversation(
        pb.DeleteConversationRequest(user_id=user_id, conversation_id=cid)
    )
    assert (deleted.conversations_deleted, deleted.messages_deleted, deleted.states_deleted) == (
        1,
        3,
        2,
    )
    await _assert_gone(state_stub, user_id, cid)
    await expect_rpc_error(
        state_stub.DeleteConversation(
            pb.DeleteConversationRequest(user_id=user_id, conversation_id=cid)
        ),
        NOT_FOUND,
    )
    assert len(await all_messages(state_stub, user_id, keep)) == 3
    state, _ = await get_state(state_stub, user_id, keep)
    assert state == source_agent_state()


async def test_batch_delete_is_all_or_nothing(
    state_stub: Stub, user_id: str, other_user_id: str
) -> None:
    mine = [await _populated(state_stub, user_id) for _ in range(3)]
    foreign = await _populated(state_stub, other_user_id)
    await expect_rpc_error(
        state_stub.BatchDeleteConversations(
            pb.BatchDeleteConversationsRequest(user_id=user_id, conversation_ids=[*mine, foreign])
        ),
        NOT_FOUND,
        f"conversation {foreign} not found; nothing was deleted",
    )
    for cid in mine:
        assert len(await all_messages(state_stub, user_id, cid)) == 3
        assert (await get_state(state_stub, user_id, cid))[1] == 1
    assert len(await all_messages(state_stub, other_user_id, foreign)) == 3
    deleted = await state_stub.BatchDeleteConversations(
        pb.BatchDeleteConversationsRequest(user_id=user_id, conversation_ids=[*mine, mine[0]])
    )
    assert (deleted.conversations_deleted, deleted.messages_deleted, deleted.states_deleted) == (
        3,
        9,
        6,
    )
    for cid in mine:
        await _assert_gone(state_stub, user_id, cid)


async def test_batch_delete_rejects_bad_input(state_stub: Stub, user_id: str) -> None:
    await expect_rpc_error(
        state_stub.BatchDeleteConversations(pb.BatchDeleteConversationsRequest(user_id=user_id)),
        INVALID,
        "must not be empty",
    )
    await expect_rpc_error(
        state_stub.BatchDeleteConversations(
            pb.BatchDeleteConversationsRequest(user_id=user_id, conversation_ids=["1", "x"])
        ),
        INVALID,
        "conversation_ids[1]",
    )
    await expect_rpc_error(
        state_stub.BatchDeleteConversations(
            pb.BatchDeleteConversationsRequest(
                user_id=user_id, conversation_ids=[str(i) for i in range(1, 1002)]
            )
        ),
        INVALID,
        "at most 1000",
    )


async def test_no_resurrection_after_delete(state_stub: Stub, user_id: str) -> None:
    cid = await _populated(state_stub, user_id)
    await state_stub.DeleteConversation(
        pb.DeleteConversationRequest(user_id=user_id, conversation_id=cid)
    )
    await expect_rpc_error(
        put_state(state_stub, user_id, cid, {"late": True}), NOT_FOUND, "not found"
    )
    await expect_rpc_error(
        put_state(state_stub, user_id, cid, {"late": True}, expected_version=0), NOT_FOUND
    )
    await expect_rpc_error(
        put_state(state_stub, user_id, cid, {"late": True}, expected_version=1), NOT_FOUND
    )
    await expect_rpc_error(
        state_stub.AppendMessage(
            pb.AppendMessageRequest(user_id=user_id, conversation_id=cid, message=user_text("late"))
        ),
        NOT_FOUND,
    )
    await _assert_gone(state_stub, user_id, cid)
    listed = await state_stub.ListConversations(pb.ListConversationsRequest(user_id=user_id))
    assert cid not in [c.conversation_id for c in listed.conversations]


# -------------------------------------------------------------------- isolation


async def test_users_are_isolated(state_stub: Stub, user_id: str, other_user_id: str) -> None:
    cid = await _populated(state_stub, user_id)
    thief = other_user_id
    await expect_rpc_error(
        state_stub.GetConversation(pb.GetConversationRequest(user_id=thief, conversation_id=cid)),
        NOT_FOUND,
    )
    await expect_rpc_error(
        state_stub.GetState(pb.GetStateRequest(user_id=thief, conversation_id=cid)), NOT_FOUND
    )
    await expect_rpc_error(put_state(state_stub, thief, cid, {"stolen": True}), NOT_FOUND)
    await expect_rpc_error(
        put_state(state_stub, thief, cid, {"stolen": True}, expected_version=1), NOT_FOUND
    )
    await expect_rpc_error(
        state_stub.RenameConversation(
            pb.RenameConversationRequest(user_id=thief, conversation_id=cid, title="mine now")
        ),
        NOT_FOUND,
    )
    await expect_rpc_error(
        state_stub.AppendMessage(
            pb.AppendMessageRequest(user_id=thief, conversation_id=cid, message=user_text("x"))
        ),
        NOT_FOUND,
    )
    first = (await all_messages(state_stub, user_id, cid))[0]
    await expect_rpc_error(
        state_stub.UpdateMessage(
            pb.UpdateMessageRequest(
                user_id=thief,
                conversation_id=cid,
                update=pb.MessageUpdate(
                    message_id=first.message_id, status=pb.MESSAGE_STATUS_INTERRUPTED
                ),
            )
        ),
        NOT_FOUND,
    )
    await expect_rpc_error(
        state_stub.ListMessages(pb.ListMessagesRequest(user_id=thief, conversation_id=cid)),
        NOT_FOUND,
    )
    await expect_rpc_error(
        state_stub.DeleteConversation(
            pb.DeleteConversationRequest(user_id=thief, conversation_id=cid)
        ),
        NOT_FOUND,
    )
    listed = await state_stub.ListConversations(pb.ListConversationsRequest(user_id=thief))
    assert list(listed.conversations) == []
    # A's data is untouched.
    state, version = await get_state(state_stub, user_id, cid)
    assert (state, version) == (source_agent_state(), 1)
    conversation = await state_stub.GetConversation(
        pb.GetConversationRequest(user_id=user_id, conversation_id=cid)
    )
    assert conversation.conversation.title == "test"
    records = await all_messages(state_stub, user_id, cid)
    assert len(records) == 3 and records[0].status == pb.MESSAGE_STATUS_NORMAL


async def test_not_found_says_what_is_missing(state_stub: Stub, user_id: str) -> None:
    cid = await new_conversation(state_stub, user_id)
    no_state = await expect_rpc_error(
        state_stub.GetState(pb.GetStateRequest(user_id=user_id, conversation_id=cid)), NOT_FOUND
    )
    assert trailer(no_state, MISSING_TRAILER) == "state"
    no_conversation = await expect_rpc_error(
        state_stub.GetState(pb.GetStateRequest(user_id=user_id, conversation_id="5")), NOT_FOUND
    )
    assert trailer(no_conversation, MISSING_TRAILER) == "conversation"
    no_message = await expect_rpc_error(
        state_stub.GetMessage(
            pb.GetMessageRequest(user_id=user_id, conversation_id=cid, message_id="5")
        ),
        NOT_FOUND,
    )
    assert trailer(no_message, MISSING_TRAILER) == "message"


async def test_compaction_records_commit_with_the_state(state_stub: Stub, user_id: str) -> None:
    cid = await new_conversation(state_stub, user_id)
    record = pb.CompactionRecord(
        messages_before=120,
        messages_after=14,
        tokens_before=26000,
        tokens_after=9000,
        summary_chars=800,
        reason="context at 81% of budget",
    )
    await state_stub.UpsertState(
        pb.UpsertStateRequest(
            user_id=user_id, conversation_id=cid, payload=b"{}", compaction_records=[record]
        )
    )
    # A failed write records nothing.
    await expect_rpc_error(
        state_stub.UpsertState(
            pb.UpsertStateRequest(
                user_id=user_id,
                conversation_id=cid,
                payload=b"{}",
                expected_version=9,
                compaction_records=[record],
            )
        ),
        grpc.StatusCode.ABORTED,
    )
    await expect_rpc_error(
        state_stub.UpsertState(
            pb.UpsertStateRequest(
                user_id=user_id,
                conversation_id=cid,
                payload=b"{}",
                compaction_records=[pb.CompactionRecord(messages_before=-1)],
            )
        ),
        INVALID,
        "negative",
    )
    listed = await state_stub.ListCompactions(
        pb.ListCompactionsRequest(user_id=user_id, conversation_id=cid)
    )
    assert len(listed.compactions) == 1
    got = listed.compactions[0]
    assert (got.messages_before, got.messages_after, got.reason) == (120, 14, record.reason)
    assert got.compaction_id.isdigit() and got.create_time.seconds > 0
    await state_stub.DeleteConversation(
        pb.DeleteConversationRequest(user_id=user_id, conversation_id=cid)
    )
    await expect_rpc_error(
        state_stub.ListCompactions(pb.ListCompactionsRequest(user_id=user_id, conversation_id=cid)),
        NOT_FOUND,
    )


async def test_list_messages_newest_first(state_stub: Stub, user_id: str) -> None:
    cid = await new_conversation(state_stub, user_id)
    for i in range(5):
        await state_stub.AppendMessage(
            pb.AppendMessageRequest(user_id=user_id, conversation_id=cid, message=user_text(f"{i}"))
        )
    texts: list[str] = []
    token = ""
    while True:
        page = await state_stub.ListMessages(
            pb.ListMessagesRequest(
                user_id=user_id,
                conversation_id=cid,
                page_size=2,
                page_token=token,
                newest_first=True,
            )
        )
        texts += [json.loads(m.blocks_json)[0]["text"] for m in page.messages]
        token = page.next_page_token
        if not token:
            break
    assert texts == ["4", "3", "2", "1", "0"]


async def test_list_messages_newest_first_tokens_empty_and_bad(
    state_stub: Stub, user_id: str
) -> None:
    """Both orders page through the same records; a token of one order is an id cursor
    that the same order continues from; an empty conversation is one empty page; a bad
    token is INVALID_ARGUMENT and changes nothing."""

    async def listed(cid: str, newest_first: bool, token: str = "") -> tuple[list[str], str]:
        page = await state_stub.ListMessages(
            pb.ListMessagesRequest(
                user_id=user_id,
                conversation_id=cid,
                page_size=3,
                page_token=token,
                newest_first=newest_first,
            )
        )
        return [m.message_id for m in page.messages], page.next_page_token

    empty = await new_conversation(state_stub, user_id)
    assert await listed(empty, True) == ([], "")
    assert await listed(empty, False) == ([], "")

    cid = await new_conversation(state_stub, user_id)
    for i in range(7):
        await state_stub.AppendMessage(
            pb.AppendMessageRequest(user_id=user_id, conversation_id=cid, message=user_text(f"{i}"))
        )
    pages: dict[bool, list[list[str]]] = {}
    for newest_first in (False, True):
        token, pages[newest_first] = "", []
        while True:
            ids, token = await listed(cid, newest_first, token)
            pages[newest_first].append(ids)
            if not token:
                break
    oldest = [i for page in pages[False] for i in page]
    assert [len(p) for p in pages[True]] == [3, 3, 1] == [len(p) for p in pages[False]]
    assert [i for page in pages[True] for i in page] == oldest[::-1]
    # Newest first from the 4th newest record's token: the three before it.
    ids, token = await listed(cid, True, pages[True][0][-1])
    assert ids == pages[True][1] and token
    for bad in ("not-a-token", "-1", "1.5"):
        for newest_first in (False, True):
            await expect_rpc_error(
                state_stub.ListMessages(
                    pb.ListMessagesRequest(
                        user_id=user_id,
                        conversation_id=cid,
                        page_token=bad,
                        newest_first=newest_first,
                    )
                ),
                INVALID,
            )
    ids, _ = await listed(cid, False)
    assert ids == oldest[:3]  # still there


async def test_postgres_newest_first_page_uses_the_index(
    pg_store: PostgresStore, database_url: str, user_id: str
) -> None:
    """A newest-first page is O(page): the plan walks the (user_id, conversation_id, id)
    index backwards and stops at the limit, from the end or from a token."""
    import psycopg

    from agentstate.state_service.storage.postgres import sql

    async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as conn:
        row = await (
            await conn.execute(
                "INSERT INTO t_conversation (user_id, title) VALUES (%s, 't') RETURNING id",
                (user_id,),
            )
        ).fetchone()
        assert row is not None
        cid = row[0]
        await conn.execute(
            "INSERT INTO t_agent_message (user_id, conversation_id, role, blocks, status) "
            "SELECT %s, %s, 'USER', '[]', 'NORMAL' FROM generate_series(1, 3000)",
            (user_id, cid),
        )
        await conn.execute("ANALYZE t_agent_message")
    for after_id in (None, 10**12):
        rows = await pg_store._rows(
            "EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF) " + sql.LIST_MESSAGES_NEWEST_FIRST,
            {"user_id": user_id, "conversation_id": cid, "after_id": after_id, "limit": 51},
        )
        plan = [str(next(iter(r.values()))) for r in rows]
        scans = [line for line in plan if "on t_agent_message " in line]
        assert scans and all("Index" in line and "Backward" in line for line in scans), (
            after_id,
            "\n".join(plan),
        )
        read = [int(n) for line in scans for n in re.findall(r"actual rows=(\d+)", line)]
        assert read and max(read) <= 51, "\n".join(plan)  # 3000 rows, one page read
