"""Conversation items and scoped state (AppendItems ... AppendEvent) through real gRPC,
against both stores: order, last-N, pop, clear, compare-and-set on the revision, the
event append's one transaction, temp: keys, deletion and no resurrection."""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime
from typing import Any, TypeAlias

import grpc
from google.protobuf.timestamp_pb2 import Timestamp

from agentstate.client import NewItem, StateClient, VersionConflict
from agentstate.state.v1 import state_service_pb2 as pb
from agentstate.state.v1 import state_service_pb2_grpc as pb_grpc
from agentstate.state_service.servicer import CURRENT_VERSION_TRAILER
from agentstate.state_service.storage.base import StateStore
from agentstate.state_service.storage.postgres import PostgresStore
from tests.conftest import TEST_MAX_PAYLOAD_BYTES
from tests.support.helpers import expect_rpc_error, new_conversation, trailer

Stub: TypeAlias = "pb_grpc.StateServiceAsyncStub"
INVALID = grpc.StatusCode.INVALID_ARGUMENT
NOT_FOUND = grpc.StatusCode.NOT_FOUND
ABORTED = grpc.StatusCode.ABORTED


def _item(n: int, at: float | None = None) -> pb.NewItem:
    item = pb.NewItem(item_json=json.dumps({"role": "user", "content": f"m{n}"}).encode())
    if at is not None:
        ts = Timestamp()
        ts.FromDatetime(datetime.fromtimestamp(at, UTC))
        item.item_time.CopyFrom(ts)
    return item


async def _session_state(stub: Stub, user_id: str, cid: str) -> Any:
    response = await stub.GetState(
        pb.GetStateRequest(user_id=user_id, conversation_id=cid, state_key="adk.session")
    )
    return json.loads(response.payload)


def _contents(items: Any) -> list[str]:
    return [json.loads(i.item_json)["content"] for i in items]


async def _list(stub: Stub, user_id: str, cid: str, **kwargs: Any) -> pb.ListItemsResponse:
    return await stub.ListItems(pb.ListItemsRequest(user_id=user_id, conversation_id=cid, **kwargs))


async def test_items_append_list_pop_clear(state_stub: Stub, user_id: str) -> None:
    cid = await new_conversation(state_stub, user_id)
    appended = await state_stub.AppendItems(
        pb.AppendItemsRequest(
            user_id=user_id, conversation_id=cid, items=[_item(i) for i in range(5)]
        )
    )
    assert [i.seq for i in appended.items] == [1, 2, 3, 4, 5] and appended.revision == 5
    assert _contents((await _list(state_stub, user_id, cid)).items) == [f"m{i}" for i in range(5)]
    # The newest N, oldest first (SQLiteSession's get_items(limit)); 0 gives none.
    assert _contents((await _list(state_stub, user_id, cid, last_n=2)).items) == ["m3", "m4"]
    assert (await _list(state_stub, user_id, cid, last_n=0)).items == []
    # Pages of the newest 4.
    first = await _list(state_stub, user_id, cid, last_n=4, page_size=3)
    assert _contents(first.items) == ["m1", "m2", "m3"] and first.next_page_token
    rest = await _list(
        state_stub, user_id, cid, last_n=4, page_size=3, page_token=first.next_page_token
    )
    assert _contents(rest.items) == ["m4"] and not rest.next_page_token

    popped = await state_stub.PopItem(pb.PopItemRequest(user_id=user_id, conversation_id=cid))
    assert json.loads(popped.item.item_json)["content"] == "m4" and popped.revision == 6
    # A seq is never reused: the next append after a pop gets 7.
    again = await state_stub.AppendItems(
        pb.AppendItemsRequest(user_id=user_id, conversation_id=cid, items=[_item(9)])
    )
    assert again.items[0].seq == 7
    cleared = await state_stub.ClearItems(
        pb.ClearItemsRequest(user_id=user_id, conversation_id=cid)
    )
    assert cleared.items_deleted == 5 and cleared.revision == 8
    empty = await state_stub.PopItem(pb.PopItemRequest(user_id=user_id, conversation_id=cid))
    assert not empty.HasField("item") and empty.revision == 8
    # The conversation itself stays.
    await state_stub.GetConversation(
        pb.GetConversationRequest(user_id=user_id, conversation_id=cid)
    )


async def test_items_min_item_time(state_stub: Stub, user_id: str) -> None:
    cid = await new_conversation(state_stub, user_id)
    await state_stub.AppendItems(
        pb.AppendItemsRequest(
            user_id=user_id,
            conversation_id=cid,
            items=[_item(i, at=1_700_000_000.0 + i) for i in range(4)],
        )
    )
    since = Timestamp()
    since.FromDatetime(datetime.fromtimestamp(1_700_000_002.0, UTC))
    listed = await _list(state_stub, user_id, cid, min_item_time=since)
    assert _contents(listed.items) == ["m2", "m3"]
    assert listed.items[0].item_time.ToDatetime(UTC).timestamp() == 1_700_000_002.0
    assert _contents(
        (await _list(state_stub, user_id, cid, min_item_time=since, last_n=1)).items
    ) == ["m3"]


async def test_items_compare_and_set(state_stub: Stub, user_id: str) -> None:
    cid = await new_conversation(state_stub, user_id)
    await state_stub.AppendItems(
        pb.AppendItemsRequest(
            user_id=user_id, conversation_id=cid, items=[_item(0)], expected_revision=0
        )
    )
    error = await expect_rpc_error(
        state_stub.AppendItems(
            pb.AppendItemsRequest(
                user_id=user_id, conversation_id=cid, items=[_item(1)], expected_revision=0
            )
        ),
        ABORTED,
        "revision",
    )
    assert trailer(error, CURRENT_VERSION_TRAILER) == "1"
    await expect_rpc_error(
        state_stub.PopItem(
            pb.PopItemRequest(user_id=user_id, conversation_id=cid, expected_revision=7)
        ),
        ABORTED,
    )
    assert _contents((await _list(state_stub, user_id, cid)).items) == ["m0"]


async def test_items_concurrent_appends_all_land(state_stub: Stub, user_id: str) -> None:
    cid = await new_conversation(state_stub, user_id)
    await asyncio.gather(
        *(
            state_stub.AppendItems(
                pb.AppendItemsRequest(
                    user_id=user_id, conversation_id=cid, items=[_item(i), _item(100 + i)]
                )
            )
            for i in range(20)
        )
    )
    listed = await _list(state_stub, user_id, cid)
    assert len(listed.items) == 40 and listed.revision == 40
    assert [i.seq for i in listed.items] == list(range(1, 41))
    # Each call's two items stay next to each other.
    contents = _contents(listed.items)
    for k in range(0, 40, 2):
        assert int(contents[k + 1][1:]) == int(contents[k][1:]) + 100


async def test_items_bad_input(state_stub: Stub, user_id: str, other_user_id: str) -> None:
    cid = await new_conversation(state_stub, user_id)

    def append(*items: pb.NewItem, user: str = user_id, conv: str = cid) -> Any:
        return state_stub.AppendItems(
            pb.AppendItemsRequest(user_id=user, conversation_id=conv, items=list(items))
        )

    await expect_rpc_error(append(), INVALID, "1..1000")
    await expect_rpc_error(append(pb.NewItem(item_json=b"[1]")), INVALID, "items[0]")
    await expect_rpc_error(append(pb.NewItem(item_json=b'{"a": ')), INVALID, "items[0]")
    await expect_rpc_error(
        append(_item(1), pb.NewItem(item_json=b'{"a": "x"} {"b": 1}')), INVALID, "items[1]"
    )
    await expect_rpc_error(append(_item(1), pb.NewItem(item_json=b'{"a": \xff}')), INVALID, "UTF-8")
    await expect_rpc_error(
        append(pb.NewItem(item_json=b'{"a": "' + b"x" * TEST_MAX_PAYLOAD_BYTES + b'"}')),
        grpc.StatusCode.RESOURCE_EXHAUSTED,
    )
    await expect_rpc_error(append(_item(1), user=other_user_id), NOT_FOUND)
    await expect_rpc_error(append(_item(1), conv="x"), INVALID, "conversation_id")
    await expect_rpc_error(_list(state_stub, user_id, cid, last_n=-1), INVALID, "last_n")
    assert (await _list(state_stub, user_id, cid)).items == []  # nothing was stored


async def test_items_and_state_go_with_the_conversation(
    state_stub: Stub, store: StateStore, user_id: str
) -> None:
    cid = await new_conversation(state_stub, user_id)
    await state_stub.AppendEvent(
        pb.AppendEventRequest(
            user_id=user_id,
            conversation_id=cid,
            item=_item(1),
            state_delta_json=b'{"k": 1}',
            state_key="adk.session",
        )
    )
    deleted = await state_stub.DeleteConversation(
        pb.DeleteConversationRequest(user_id=user_id, conversation_id=cid)
    )
    assert deleted.states_deleted == 1
    if isinstance(store, PostgresStore):  # the rows are gone, in the delete's transaction
        async with store.pool.connection() as conn:
            cur = await conn.execute(
                "SELECT count(*) AS n FROM t_conversation_item WHERE conversation_id = %s",
                (int(cid),),
            )
            assert (await cur.fetchone()) == {"n": 0}
    # A late write finds no conversation: nothing comes back.
    await expect_rpc_error(
        state_stub.AppendItems(
            pb.AppendItemsRequest(user_id=user_id, conversation_id=cid, items=[_item(2)])
        ),
        NOT_FOUND,
    )
    await expect_rpc_error(
        state_stub.AppendEvent(
            pb.AppendEventRequest(user_id=user_id, conversation_id=cid, item=_item(3))
        ),
        NOT_FOUND,
    )
    await expect_rpc_error(
        state_stub.PopItem(pb.PopItemRequest(user_id=user_id, conversation_id=cid)), NOT_FOUND
    )
    await expect_rpc_error(_list(state_stub, user_id, cid), NOT_FOUND)


async def test_append_event_scopes_and_revision(
    state_stub: Stub, user_id: str, other_user_id: str
) -> None:
    app = f"app-{user_id}"
    cid = await new_conversation(state_stub, user_id)
    first = await state_stub.AppendEvent(
        pb.AppendEventRequest(
            user_id=user_id,
            conversation_id=cid,
            item=_item(1),
            expected_revision=0,
            state_key="adk.session",
            state_delta_json=b'{"count": 1, "temp:scratch": "x", "keep": "a"}',
            app_name=app,
            app_state_delta_json=b'{"motd": "hi"}',
            user_state_delta_json=b'{"name": "Ann"}',
        )
    )
    assert first.revision == 1 and first.item.seq == 1 and first.state_version == 1
    second = await state_stub.AppendEvent(
        pb.AppendEventRequest(
            user_id=user_id,
            conversation_id=cid,
            expected_revision=1,
            state_key="adk.session",
            state_delta_json=b'{"count": 2, "keep": null}',
            app_name=app,
            user_state_delta_json=b"{}",
        )
    )
    assert second.revision == 2 and not second.HasField("item") and second.state_version == 2
    assert await _session_state(state_stub, user_id, cid) == {"count": 2, "keep": None}
    scoped = await state_stub.GetScopedState(
        pb.GetScopedStateRequest(user_id=user_id, app_name=app)
    )
    assert json.loads(scoped.app_state.payload) == {"motd": "hi"}
    assert json.loads(scoped.user_state.payload) == {"name": "Ann"}
    assert scoped.user_state.version == 1  # an empty delta writes nothing
    other = await state_stub.GetScopedState(
        pb.GetScopedStateRequest(user_id=other_user_id, app_name=app)
    )
    assert json.loads(other.app_state.payload) == {"motd": "hi"}
    assert not other.HasField("user_state")

    # A caller whose view is older is refused, and nothing of its event is stored.
    error = await expect_rpc_error(
        state_stub.AppendEvent(
            pb.AppendEventRequest(
                user_id=user_id,
                conversation_id=cid,
                item=_item(2),
                expected_revision=1,
                state_key="adk.session",
                state_delta_json=b'{"count": 99}',
                app_name=app,
                app_state_delta_json=b'{"motd": "stale"}',
            )
        ),
        ABORTED,
    )
    assert trailer(error, CURRENT_VERSION_TRAILER) == "2"
    assert (await _session_state(state_stub, user_id, cid))["count"] == 2
    scoped = await state_stub.GetScopedState(
        pb.GetScopedStateRequest(user_id=user_id, app_name=app)
    )
    assert json.loads(scoped.app_state.payload) == {"motd": "hi"}
    assert len((await _list(state_stub, user_id, cid)).items) == 1

    await expect_rpc_error(
        state_stub.AppendEvent(
            pb.AppendEventRequest(
                user_id=user_id, conversation_id=cid, user_state_delta_json=b'{"a": 1}'
            )
        ),
        INVALID,
        "app_name",
    )
    await expect_rpc_error(
        state_stub.AppendEvent(
            pb.AppendEventRequest(user_id=user_id, conversation_id=cid, state_delta_json=b"[]")
        ),
        INVALID,
        "state_delta",
    )
    await expect_rpc_error(
        state_stub.GetScopedState(pb.GetScopedStateRequest(user_id=user_id)), INVALID, "app_name"
    )


async def test_appends_without_the_texts_sent_back(state_stub: Stub, user_id: str) -> None:
    """omit_item_json: the response's items carry seq and times, not the texts; the
    texts are stored all the same."""
    cid = await new_conversation(state_stub, user_id)
    appended = await state_stub.AppendItems(
        pb.AppendItemsRequest(
            user_id=user_id, conversation_id=cid, items=[_item(0), _item(1)], omit_item_json=True
        )
    )
    assert [(i.seq, i.item_json) for i in appended.items] == [(1, b""), (2, b"")]
    assert appended.items[0].HasField("item_time") and appended.revision == 2
    event = await state_stub.AppendEvent(
        pb.AppendEventRequest(
            user_id=user_id, conversation_id=cid, item=_item(2), omit_item_json=True
        )
    )
    assert event.item.seq == 3 and event.item.item_json == b"" and event.revision == 3
    listed = await _list(state_stub, user_id, cid)
    assert [i.item_json for i in listed.items] == [_item(n).item_json for n in range(3)]
    echoed = await state_stub.AppendItems(
        pb.AppendItemsRequest(user_id=user_id, conversation_id=cid, items=[_item(3)])
    )
    assert echoed.items[0].item_json == _item(3).item_json  # sent back by default


async def test_list_items_after_seq(state_stub: Stub, user_id: str) -> None:
    """after_seq: only the items since; with nothing popped they are exactly the seqs
    between the caller's revision and the page's."""
    cid = await new_conversation(state_stub, user_id)
    append = pb.AppendItemsRequest(
        user_id=user_id, conversation_id=cid, items=[_item(i) for i in range(3)]
    )
    await state_stub.AppendItems(append)
    since = await _list(state_stub, user_id, cid, after_seq=1)
    assert [i.seq for i in since.items] == [2, 3] and since.revision == 3
    assert (await _list(state_stub, user_id, cid, after_seq=3)).items == []
    assert _contents((await _list(state_stub, user_id, cid, after_seq=0)).items) == [
        "m0",
        "m1",
        "m2",
    ]
    # A pop makes a revision no item has: the caller sees the gap.
    await state_stub.PopItem(pb.PopItemRequest(user_id=user_id, conversation_id=cid))
    after_pop = await _list(state_stub, user_id, cid, after_seq=3)
    assert after_pop.items == [] and after_pop.revision == 4
    # With last_n (the newest of those after) and pages (the token goes past after_seq).
    await state_stub.AppendItems(append)  # seqs 5, 6, 7
    newest = await _list(state_stub, user_id, cid, after_seq=1, last_n=2)
    assert [i.seq for i in newest.items] == [6, 7]
    first = await _list(state_stub, user_id, cid, after_seq=1, page_size=2)
    assert [i.seq for i in first.items] == [2, 5] and first.next_page_token
    rest = await _list(
        state_stub, user_id, cid, after_seq=1, page_size=2, page_token=first.next_page_token
    )
    assert [i.seq for i in rest.items] == [6, 7] and not rest.next_page_token
    await expect_rpc_error(_list(state_stub, user_id, cid, after_seq=-1), INVALID, "after_seq")


async def test_list_items_with_state_and_scoped_state(
    state_stub: Stub, store: StateStore, user_id: str, other_user_id: str
) -> None:
    """ListItems can carry the conversation's state and the app's scoped states (an ADK
    session in one call), exactly as GetState and GetScopedState read them."""
    app = f"app-{user_id}"
    cid = await new_conversation(state_stub, user_id)
    full = {"include_state_key": "adk.session", "include_scoped_app_name": app}
    # Nothing written yet: the items and no states.
    empty = await _list(state_stub, user_id, cid, **full)
    assert empty.items == [] and empty.revision == 0
    assert not empty.HasField("state") and not empty.HasField("app_state")
    assert not empty.HasField("user_state")
    await state_stub.AppendEvent(
        pb.AppendEventRequest(
            user_id=user_id,
            conversation_id=cid,
            item=_item(1),
            state_key="adk.session",
            state_delta_json=b'{"n": 1e21, "z": -0.0}',
            app_name=app,
            app_state_delta_json=b'{"motd": "hi"}',
            user_state_delta_json=b'{"name": "Ann"}',
        )
    )
    page = await _list(state_stub, user_id, cid, **full)
    assert _contents(page.items) == ["m1"] and page.revision == 1
    state = await state_stub.GetState(
        pb.GetStateRequest(user_id=user_id, conversation_id=cid, state_key="adk.session")
    )
    assert page.state.payload == state.payload == b'{"n": 1e21, "z": -0.0}'  # its text
    assert page.state.version == state.version == 1
    scoped = await state_stub.GetScopedState(
        pb.GetScopedStateRequest(user_id=user_id, app_name=app)
    )
    assert page.app_state == scoped.app_state and page.user_state == scoped.user_state
    assert json.loads(page.user_state.payload) == {"name": "Ann"}
    # Each part only when asked for; with last_n=0 no items, but the states.
    plain = await _list(state_stub, user_id, cid)
    assert not plain.HasField("state") and not plain.HasField("app_state")
    only_state = await _list(state_stub, user_id, cid, last_n=0, include_state_key="adk.session")
    assert only_state.items == [] and only_state.state.payload == state.payload
    assert not only_state.HasField("app_state")
    # Another user of the app sees the app's state, not this user's.
    other_cid = await new_conversation(state_stub, other_user_id)
    other = await _list(state_stub, other_user_id, other_cid, **full)
    assert json.loads(other.app_state.payload) == {"motd": "hi"}
    assert not other.HasField("user_state") and not other.HasField("state")
    # Any state as GetState reads it: an agent state (its context kept apart) too.
    agent_state = (
        b'{"session_id": "s", "context": [{"id": "m1", "role": "USER", "content": '
        b'[{"type": "text", "text": "\\u0000 1e21"}]}, {"id": "m2"}], "cur_iter": 1e21}'
    )
    await state_stub.UpsertState(
        pb.UpsertStateRequest(user_id=user_id, conversation_id=cid, payload=agent_state)
    )
    stored = await state_stub.GetState(pb.GetStateRequest(user_id=user_id, conversation_id=cid))
    listed = await _list(state_stub, user_id, cid, include_state_key="agent_state")
    assert listed.state.payload == stored.payload and listed.state.version == stored.version
    assert json.loads(listed.state.payload) == json.loads(agent_state)
    if isinstance(store, PostgresStore):  # the context is kept apart (its own rows)
        async with store.pool.connection() as conn:
            cur = await conn.execute(
                "SELECT context_start IS NOT NULL AS split FROM t_agent_state"
                " WHERE session_id = %s AND state_key = 'agent_state'",
                (int(cid),),
            )
            assert (await cur.fetchone()) == {"split": True}
    # Bad input is refused before anything is read; a missing conversation is NOT_FOUND.
    await expect_rpc_error(
        _list(state_stub, user_id, cid, include_state_key="bad key!"), INVALID, "state_key"
    )
    await expect_rpc_error(
        _list(state_stub, user_id, cid, include_scoped_app_name="a" * 129), INVALID, "app_name"
    )
    await expect_rpc_error(_list(state_stub, other_user_id, cid, **full), NOT_FOUND)


async def test_sync_client_items_and_event(state_address: str, user_id: str) -> None:
    """The blocking client has the same calls (run off the loop serving them)."""

    def scenario() -> tuple[Any, ...]:
        with StateClient.connect(state_address) as state:
            cid = state.create_conversation(user_id, "sync").conversation_id
            appended = state.append_items(
                user_id, cid, [NewItem({"n": 1}), NewItem(b'{"n": 2}')], expected_revision=0
            )
            event = state.append_event(
                user_id,
                cid,
                item=NewItem({"n": 3}),
                expected_revision=appended.revision,
                state_key="s",
                state_delta={"a": 1, "temp:b": 2},
                app_name="sync-app",
                user_state_delta={"u": 1},
            )
            try:
                state.pop_item(user_id, cid, expected_revision=0)
            except VersionConflict as exc:
                conflict = exc.current_version
            page = state.list_items(user_id, cid, last_n=2)
            popped = state.pop_item(user_id, cid)
            cleared = state.clear_items(user_id, cid)
            scoped = state.get_scoped_state(user_id, "sync-app")
            stored = state.get_state(user_id, cid, state_key="s")
            return appended, event, conflict, page, popped, cleared, scoped, stored

    appended, event, conflict, page, popped, cleared, scoped, stored = await asyncio.to_thread(
        scenario
    )
    assert [i.seq for i in appended.items] == [1, 2] and appended.revision == 2
    # The texts as sent (the service does not send them back: omit_item_json).
    assert [i.item_json for i in appended.items] == [b'{"n":1}', b'{"n": 2}']
    assert event.revision == 3 and event.item.seq == 3 and event.state_version == 1
    assert event.item.item_json == b'{"n":3}' == page.items[-1].item_json
    assert event.item.item_time == page.items[-1].item_time  # the stored time
    assert conflict == 3
    assert [json.loads(i.item_json)["n"] for i in page.items] == [2, 3] and page.revision == 3
    assert popped.item is not None and json.loads(popped.item.item_json) == {"n": 3}
    assert cleared.deleted == 2 and cleared.revision == 5
    assert scoped.app is None and scoped.user is not None
    assert json.loads(scoped.user.payload) == {"u": 1}
    assert json.loads(stored.payload) == {"a": 1}
