"""Conversation keys chosen by callers (ResolveConversation), on both stores over gRPC."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from agentstate.client import (
    AlreadyExists,
    AsyncStateClient,
    InvalidArgument,
    MessageRole,
    NewMessage,
    NotFound,
)
from agentstate.state_service.storage.base import StateStore


@pytest.fixture
async def client(state_address: str) -> AsyncIterator[AsyncStateClient]:
    async with AsyncStateClient.connect(state_address) as client:
        yield client


async def test_resolve_creates_once_then_finds(
    client: AsyncStateClient, user_id: str, other_user_id: str
) -> None:
    with pytest.raises(NotFound) as absent:
        await client.resolve_conversation(user_id, "thread-1", create=False)
    assert absent.value.missing == "conversation"

    first = await client.resolve_conversation(user_id, "thread-1", title="Thread one")
    assert first.created and first.conversation.external_key == "thread-1"
    assert first.conversation.title == "Thread one"
    again = await client.resolve_conversation(user_id, "thread-1", create=False)
    assert not again.created and again.conversation == first.conversation
    got = await client.get_conversation(user_id, first.conversation.conversation_id)
    assert got.external_key == "thread-1"
    listed = await client.list_conversations(user_id)
    assert [c.external_key for c in listed.items] == ["thread-1"]

    # Unique per user: another user's same key is another conversation.
    theirs = await client.resolve_conversation(other_user_id, "thread-1")
    assert theirs.created
    assert theirs.conversation.conversation_id != first.conversation.conversation_id


async def test_create_with_a_taken_key_is_already_exists(
    client: AsyncStateClient, user_id: str
) -> None:
    made = await client.create_conversation(user_id, "t", external_key="k")
    assert made.external_key == "k"
    with pytest.raises(AlreadyExists) as taken:
        await client.create_conversation(user_id, "t2", external_key="k")
    assert taken.value.reason == "ALREADY_EXISTS"
    listed = await client.list_conversations(user_id)
    assert [c.conversation_id for c in listed.items] == [made.conversation_id]
    plain = await client.create_conversation(user_id)  # no key: never conflicts
    assert plain.external_key == ""
    assert (await client.create_conversation(user_id)).external_key == ""


@pytest.mark.parametrize("key", ["", "x" * 257, "a\x00b"])
async def test_bad_keys_are_invalid_argument(
    client: AsyncStateClient, user_id: str, key: str
) -> None:
    with pytest.raises(InvalidArgument):
        await client.resolve_conversation(user_id, key)
    if key:
        with pytest.raises(InvalidArgument):
            await client.create_conversation(user_id, external_key=key)
    assert (await client.list_conversations(user_id)).items == []
    assert (await client.resolve_conversation(user_id, "x" * 256)).created  # the limit


async def test_delete_frees_the_key_and_the_old_id_stays_gone(
    client: AsyncStateClient, user_id: str
) -> None:
    old = (await client.resolve_conversation(user_id, "thread")).conversation
    await client.append_message(user_id, old.conversation_id, NewMessage(MessageRole.USER))
    await client.delete_conversation(user_id, old.conversation_id)
    with pytest.raises(NotFound):
        await client.resolve_conversation(user_id, "thread", create=False)
    new = await client.resolve_conversation(user_id, "thread")
    assert new.created and new.conversation.conversation_id != old.conversation_id
    # A late write to the old id does not bring it back.
    with pytest.raises(NotFound):
        await client.upsert_state(user_id, old.conversation_id, {"late": True})
    with pytest.raises(NotFound):
        await client.append_message(user_id, old.conversation_id, NewMessage(MessageRole.USER))
    assert (await client.list_messages(user_id, new.conversation.conversation_id)).items == []


async def test_concurrent_resolves_make_one_conversation(store: StateStore, user_id: str) -> None:
    """The race on the store itself: many resolvers of one new key at once."""
    results = await asyncio.gather(
        *(
            store.resolve_conversation(
                user_id=user_id, external_key="race", create_if_missing=True, title="t"
            )
            for _ in range(20)
        )
    )
    ids = {r.conversation.conversation_id for r in results}
    assert len(ids) == 1
    assert sum(r.created for r in results) == 1
    page = await store.list_conversations(user_id=user_id, page_size=50, before_id=None)
    assert len(page.items) == 1
