"""Small helpers shared by the tests."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Iterable
from typing import Any, cast

import grpc

from agentstate.state.v1 import state_service_pb2 as pb
from agentstate.state.v1 import state_service_pb2_grpc as pb_grpc


async def expect_rpc_error(
    call: Awaitable[Any], code: grpc.StatusCode, contains: str = ""
) -> grpc.aio.AioRpcError:
    """Await a call that must fail with `code` and a message containing `contains`."""
    try:
        await call
    except grpc.aio.AioRpcError as exc:
        assert exc.code() == code, f"expected {code}, got {exc.code()}: {exc.details()}"
        assert contains.lower() in (exc.details() or "").lower(), exc.details()
        return exc
    raise AssertionError(f"expected {code}, but the call succeeded")


async def new_conversation(
    stub: pb_grpc.StateServiceAsyncStub, user_id: str, title: str = "test"
) -> str:
    response = await stub.CreateConversation(
        pb.CreateConversationRequest(user_id=user_id, title=title)
    )
    return str(response.conversation.conversation_id)


async def put_state(
    stub: pb_grpc.StateServiceAsyncStub,
    user_id: str,
    conversation_id: str,
    state: dict[str, Any],
    expected_version: int | None = None,
) -> int:
    request = pb.UpsertStateRequest(
        user_id=user_id, conversation_id=conversation_id, payload=json.dumps(state).encode()
    )
    if expected_version is not None:
        request.expected_version = expected_version
    response = await stub.UpsertState(request)
    return int(response.version)


async def get_state(
    stub: pb_grpc.StateServiceAsyncStub, user_id: str, conversation_id: str
) -> tuple[dict[str, Any], int]:
    response = await stub.GetState(
        pb.GetStateRequest(user_id=user_id, conversation_id=conversation_id)
    )
    return json.loads(response.payload), int(response.version)


def user_text(text: str) -> pb.NewMessage:
    return pb.NewMessage(
        role=pb.MESSAGE_ROLE_USER,
        blocks_json=json.dumps([{"type": "text", "text": text}]).encode(),
    )


async def all_messages(
    stub: pb_grpc.StateServiceAsyncStub, user_id: str, conversation_id: str
) -> list[pb.MessageRecord]:
    records: list[pb.MessageRecord] = []
    token = ""
    while True:
        page = await stub.ListMessages(
            pb.ListMessagesRequest(
                user_id=user_id, conversation_id=conversation_id, page_token=token
            )
        )
        records.extend(page.messages)
        token = page.next_page_token
        if not token:
            return records


def trailer(error: grpc.aio.AioRpcError, key: str) -> str | None:
    """The value of one trailing-metadata key of a failed call, or None."""
    # grpc.aio yields (key, value) pairs; grpc-stubs types them as _Metadatum.
    pairs = cast(Iterable[tuple[str, str | bytes]], error.trailing_metadata() or ())
    for item_key, value in pairs:
        if item_key == key:
            return value if isinstance(value, str) else value.decode()
    return None
