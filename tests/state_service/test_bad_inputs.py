"""Inputs that used to corrupt data or mislead callers: NUL bytes and characters, JSON
nested too deep, undecodable requests, a repeated identity. Each gets INVALID_ARGUMENT
(or UNAUTHENTICATED) with a message a caller can act on, and nothing is stored.
Both stores (the `state_stub` fixture) unless said otherwise.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any, TypeAlias

import grpc
import pytest

from agentstate.agent.v1 import agent_service_pb2 as apb
from agentstate.common.error_details import error_info
from agentstate.state.v1 import state_service_pb2 as pb
from agentstate.state.v1 import state_service_pb2_grpc as pb_grpc
from agentstate.state_service.domain import MAX_JSON_DEPTH
from tests.support.agent_harness import Stack, collect
from tests.support.helpers import (
    all_messages,
    expect_rpc_error,
    get_state,
    new_conversation,
    put_state,
)

Stub: TypeAlias = "pb_grpc.StateServiceAsyncStub"
INVALID = grpc.StatusCode.INVALID_ARGUMENT


def nested(depth: int, padding: int = 0) -> bytes:
    """A JSON object holding a value `depth` levels deep (the object itself is level 1),
    optionally padded with many shallow brackets so it is large and bracket-rich."""
    pad = b'"pad": [' + b",".join(b"[1]" for _ in range(padding)) + b"], " if padding else b""
    return b"{" + pad + b'"deep": ' + b"[" * (depth - 1) + b"1" + b"]" * (depth - 1) + b"}"


def text_block(text: str) -> bytes:
    return json.dumps([{"type": "text", "text": text}]).encode()


# ------------------------------------------------------------------ NUL bytes


async def test_nul_bytes_in_json_are_refused_not_truncated(state_stub: Stub, user_id: str) -> None:
    cid = await new_conversation(state_stub, user_id)
    await put_state(state_stub, user_id, cid, {"kept": True})
    ids: dict[str, Any] = {"user_id": user_id, "conversation_id": cid}
    record = (
        await state_stub.AppendMessage(
            pb.AppendMessageRequest(
                **ids, message=pb.NewMessage(role=pb.MESSAGE_ROLE_USER, blocks_json=text_block("a"))
            )
        )
    ).message
    nul_payload = b'{"a":1}\x00garbage'
    calls: list[tuple[str, Callable[[], Awaitable[Any]]]] = [
        (
            "payload",
            lambda: state_stub.UpsertState(pb.UpsertStateRequest(**ids, payload=nul_payload)),
        ),
        (
            "message.blocks_json",
            lambda: state_stub.AppendMessage(
                pb.AppendMessageRequest(
                    **ids,
                    message=pb.NewMessage(role=pb.MESSAGE_ROLE_USER, blocks_json=b"[]\x00[1]"),
                )
            ),
        ),
        (
            "message.metadata_json",
            lambda: state_stub.AppendMessage(
                pb.AppendMessageRequest(
                    **ids,
                    message=pb.NewMessage(role=pb.MESSAGE_ROLE_USER, metadata_json=b"{}\x00"),
                )
            ),
        ),
        (
            "update.blocks_json",
            lambda: state_stub.UpdateMessage(
                pb.UpdateMessageRequest(
                    **ids,
                    update=pb.MessageUpdate(message_id=record.message_id, blocks_json=b"[\x00]"),
                )
            ),
        ),
        (
            "message_writes[0].insert.metadata_json",
            lambda: state_stub.UpsertState(
                pb.UpsertStateRequest(
                    **ids,
                    payload=b"{}",
                    message_writes=[
                        pb.MessageWrite(
                            insert=pb.NewMessage(
                                role=pb.MESSAGE_ROLE_USER, metadata_json=b'{"a":"\x00"}'
                            )
                        )
                    ],
                )
            ),
        ),
        (
            "new_messages[0].blocks_json",
            lambda: state_stub.BeginTurn(
                pb.BeginTurnRequest(
                    **ids,
                    holder="h",
                    ttl_ms=1000,
                    new_messages=[pb.NewMessage(role=pb.MESSAGE_ROLE_USER, blocks_json=b"[]\x00")],
                )
            ),
        ),
        (
            "payload",
            lambda: state_stub.EndTurn(pb.EndTurnRequest(**ids, task_id="1", payload=nul_payload)),
        ),
    ]
    for field, call in calls:
        error = await expect_rpc_error(call(), INVALID, f"{field} contains a NUL byte")
        info = error_info(error)
        assert info is not None and info.reason == "INVALID_ARGUMENT"
    assert await get_state(state_stub, user_id, cid) == ({"kept": True}, 1)
    stored = await all_messages(state_stub, user_id, cid)
    assert [(m.blocks_json, m.metadata_json) for m in stored] == [(record.blocks_json, b"{}")]


async def test_nul_characters_in_text_fields_are_invalid(state_stub: Stub, user_id: str) -> None:
    cid = await new_conversation(state_stub, user_id, title="before")
    calls: list[tuple[str, Awaitable[Any]]] = [
        (
            "title",
            state_stub.CreateConversation(
                pb.CreateConversationRequest(user_id=user_id, title="a\x00b")
            ),
        ),
        (
            "title",
            state_stub.RenameConversation(
                pb.RenameConversationRequest(user_id=user_id, conversation_id=cid, title="a\x00b")
            ),
        ),
        (
            "title",
            state_stub.BeginTurn(
                pb.BeginTurnRequest(user_id=user_id, title="x\x00", holder="h", ttl_ms=1000)
            ),
        ),
        (
            "compaction_records[0].reason",
            state_stub.UpsertState(
                pb.UpsertStateRequest(
                    user_id=user_id,
                    conversation_id=cid,
                    payload=b"{}",
                    compaction_records=[pb.CompactionRecord(reason="why\x00")],
                )
            ),
        ),
    ]
    for field, call in calls:
        await expect_rpc_error(call, INVALID, f"{field} must not contain NUL")
    listed = await state_stub.ListConversations(pb.ListConversationsRequest(user_id=user_id))
    assert [c.title for c in listed.conversations] == ["before"]
    await expect_rpc_error(
        state_stub.GetState(pb.GetStateRequest(user_id=user_id, conversation_id=cid)),
        grpc.StatusCode.NOT_FOUND,
    )


# ------------------------------------------------------------------ deep JSON


@pytest.mark.parametrize(
    ("payload", "accepted"),
    [
        (nested(MAX_JSON_DEPTH), True),
        (nested(MAX_JSON_DEPTH + 1), False),
        (nested(MAX_JSON_DEPTH, padding=30_000), True),  # large: the database checks it
        (nested(MAX_JSON_DEPTH + 1, padding=30_000), False),
        (nested(40_000, padding=30_000), False),  # beyond PostgreSQL's own parser stack
        (b'{"s": "' + b"[" * 2000 + b'"}', True),  # brackets inside a string do not nest
    ],
    ids=["at-limit", "over", "large-at-limit", "large-over", "parser-limit", "in-string"],
)
async def test_json_nesting_limit(
    state_stub: Stub, user_id: str, payload: bytes, accepted: bool
) -> None:
    cid = await new_conversation(state_stub, user_id)
    request = pb.UpsertStateRequest(user_id=user_id, conversation_id=cid, payload=payload)
    if accepted:
        await state_stub.UpsertState(request)
        assert (await get_state(state_stub, user_id, cid))[1] == 1
        return
    error = await expect_rpc_error(
        state_stub.UpsertState(request), INVALID, f"more than {MAX_JSON_DEPTH} levels deep"
    )
    assert "\n" not in (error.details() or "")
    await expect_rpc_error(
        state_stub.GetState(pb.GetStateRequest(user_id=user_id, conversation_id=cid)),
        grpc.StatusCode.NOT_FOUND,
    )


async def test_deep_json_in_message_records_is_invalid(state_stub: Stub, user_id: str) -> None:
    cid = await new_conversation(state_stub, user_id)
    deep = b"[" * (MAX_JSON_DEPTH + 1) + b"]" * (MAX_JSON_DEPTH + 1)
    await expect_rpc_error(
        state_stub.AppendMessage(
            pb.AppendMessageRequest(
                user_id=user_id,
                conversation_id=cid,
                message=pb.NewMessage(role=pb.MESSAGE_ROLE_USER, blocks_json=deep),
            )
        ),
        INVALID,
        "message.blocks_json nests arrays and objects more than",
    )
    assert await all_messages(state_stub, user_id, cid) == []


# ------------------------------------------------------------ undecodable requests


def _raw_call(channel: grpc.aio.Channel, method: str) -> Any:
    """A call that sends the given bytes as they are, as a non-Python client might."""
    return channel.unary_unary(
        method, request_serializer=lambda b: b, response_deserializer=lambda b: b
    )


UNDECODABLE = [
    b"\xff\xff\xff\xff",  # not protobuf at all
    b"\x0a\x02\xff\xfe",  # field 1 (user_id), a string that is not UTF-8
    b"\x0a\x10abc",  # field 1 longer than the message
]


@pytest.mark.parametrize("body", UNDECODABLE, ids=["garbage", "bad-utf8", "truncated"])
async def test_undecodable_state_requests_are_invalid_argument(
    state_address: str, body: bytes
) -> None:
    async with grpc.aio.insecure_channel(state_address) as channel:
        for method in ("GetState", "UpsertState", "BeginTurn", "DeleteConversation"):
            call = _raw_call(channel, f"/agentstate.state.v1.StateService/{method}")
            error = await expect_rpc_error(call(body), INVALID, "could not be decoded")
            info = error_info(error)
            assert info is not None and info.reason == "MALFORMED_REQUEST"


async def test_undecodable_agent_requests_are_invalid_argument(stack: Stack) -> None:
    address = stack.agents[0][1].address
    async with grpc.aio.insecure_channel(address) as channel:
        for body in UNDECODABLE:
            unary = _raw_call(channel, "/agentstate.agent.v1.AgentService/Stop")
            await expect_rpc_error(unary(body), INVALID, "could not be decoded")
            streaming = channel.unary_stream(
                "/agentstate.agent.v1.AgentService/Chat",
                request_serializer=lambda b: b,
                response_deserializer=lambda b: b,
            )
            turn = await collect(streaming(body, metadata=(("agentstate-user-id", "u1"),)))
            assert turn.code == INVALID and "could not be decoded" in turn.details
            assert turn.events == []


# ------------------------------------------------------------------ identity


async def test_a_repeated_identity_is_unauthenticated(stack: Stack, user_id: str) -> None:
    client = stack.agents[0][1]
    turn = await collect(
        client.stub.Chat(
            apb.ChatRequest(question="我的订单88235现在什么状态？"),
            metadata=(("agentstate-user-id", user_id), ("agentstate-user-id", "someone-else")),
        )
    )
    assert turn.code == grpc.StatusCode.UNAUTHENTICATED
    assert "2 times" in turn.details and turn.events == []
    listed = await client.stub.ListConversations(
        apb.ListConversationsRequest(), metadata=(("agentstate-user-id", user_id),)
    )
    assert list(listed.conversations) == []  # nothing was started for either identity
    nul = await client.chat(user_id, "取消\x00订单")
    assert nul.code == INVALID and "NUL" in nul.details
