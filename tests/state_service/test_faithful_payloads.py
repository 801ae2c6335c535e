"""Faithful payloads (issue 22, item 1), through real gRPC against both stores: every
payload comes back as it was sent, compared as bytes, so `1` and `1.0` differ, and
`\\u0000`, `1e21`, `-0.0`, integers above 2**53, key order, non-BMP characters and
NaN keep their spelling. Where the service computes (a state's "context", a top-level
merge) only the separators between top-level members and between the context's
messages are its own (", " and ": "); every value's text is copied as sent. Rows stored
as jsonb before migration 12 read back as they did and are rewritten on their next write.
"""

from __future__ import annotations

import asyncio
import json
from typing import TypeAlias

import grpc

from agentstate.state.v1 import state_service_pb2 as pb
from agentstate.state.v1 import state_service_pb2_grpc as pb_grpc
from agentstate.state_service.storage.base import StateStore
from agentstate.state_service.storage.postgres import PostgresStore
from tests.state_service.test_checkpoints import put_request
from tests.support.helpers import expect_rpc_error, new_conversation

Stub: TypeAlias = "pb_grpc.StateServiceAsyncStub"

# One value of every hard kind, as compact text and as the service writes members.
HARD = (
    b'{"nul":"a\\u0000b","big":1e21,"neg":-0.0,"exact":9007199254740993,"one":1,'
    b'"onef":1.0,"emoji":"\xf0\x9f\x98\x80","esc":"\\ud83d\\ude00","nan":NaN,'
    b'"inf":-Infinity,"z":{"b" :1, "a":[1 ,2]},"a":null}'
)
HARD_MEMBERS = (
    b'{"nul": "a\\u0000b", "big": 1e21, "neg": -0.0, "exact": 9007199254740993, "one": 1, '
    b'"onef": 1.0, "emoji": "\xf0\x9f\x98\x80", "esc": "\\ud83d\\ude00", "nan": NaN, '
    b'"inf": -Infinity, "z": {"b" :1, "a":[1 ,2]}, "a": null}'
)


async def test_items_come_back_byte_for_byte(state_stub: Stub, user_id: str) -> None:
    cid = await new_conversation(state_stub, user_id)
    items = [HARD, b' {"x": 1E+21 ,"x": 2} ', b'{"s":"\\u0000\\"\\\\"}']
    appended = await state_stub.AppendItems(
        pb.AppendItemsRequest(
            user_id=user_id,
            conversation_id=cid,
            items=[pb.NewItem(item_json=item) for item in items],
        )
    )
    assert [i.item_json for i in appended.items] == items
    listed = await state_stub.ListItems(pb.ListItemsRequest(user_id=user_id, conversation_id=cid))
    assert [i.item_json for i in listed.items] == items
    popped = await state_stub.PopItem(pb.PopItemRequest(user_id=user_id, conversation_id=cid))
    assert popped.item.item_json == items[-1]
    # Read as json.loads reads it: every type kept.
    value = json.loads(listed.items[0].item_json)
    assert value["nul"] == "a\x00b" and isinstance(value["big"], float)
    assert str(value["neg"]) == "-0.0" and value["exact"] == 2**53 + 1
    assert type(value["one"]) is int and type(value["onef"]) is float
    assert list(value) == ["nul", "big", "neg", "exact", "one", "onef", "emoji", "esc", "nan",
                           "inf", "z", "a"]  # fmt: skip


async def test_event_deltas_merge_without_rewriting_values(state_stub: Stub, user_id: str) -> None:
    cid = await new_conversation(state_stub, user_id)

    async def event(n: int, delta: bytes, app: bytes = b"", user: bytes = b"") -> None:
        await state_stub.AppendEvent(
            pb.AppendEventRequest(
                user_id=user_id,
                conversation_id=cid,
                item=pb.NewItem(item_json=b'{"id":"ev-%d","v":1e21}' % n),
                state_key="adk.session",
                state_delta_json=delta,
                app_name="faithful-app",
                app_state_delta_json=app,
                user_state_delta_json=user,
            )
        )

    await event(1, HARD, app=b'{"k":1e21,"temp:x":1}', user=b'{"u":"\\u0000"}')
    state = await state_stub.GetState(
        pb.GetStateRequest(user_id=user_id, conversation_id=cid, state_key="adk.session")
    )
    assert state.payload == HARD_MEMBERS
    # A merge: "z" keeps its place and takes the new value, "new" goes last, temp:
    # keys never stored, every other value untouched; the last of duplicate keys wins.
    await event(2, b'{"temp:t": 1, "z": 2.50, "new": 1E+21, "new": -0}', user=b'{"v":-0.0}')
    state = await state_stub.GetState(
        pb.GetStateRequest(user_id=user_id, conversation_id=cid, state_key="adk.session")
    )
    assert state.payload == HARD_MEMBERS.replace(
        b'"z": {"b" :1, "a":[1 ,2]}', b'"z": 2.50'
    ).replace(b'"a": null}', b'"a": null, "new": -0}')
    assert state.version == 2
    scoped = await state_stub.GetScopedState(
        pb.GetScopedStateRequest(user_id=user_id, app_name="faithful-app")
    )
    assert scoped.app_state.payload == b'{"k": 1e21, "temp:x": 1}'
    assert scoped.user_state.payload == b'{"u": "\\u0000", "v": -0.0}'
    listed = await state_stub.ListItems(pb.ListItemsRequest(user_id=user_id, conversation_id=cid))
    assert [i.item_json for i in listed.items] == [
        b'{"id":"ev-1","v":1e21}',
        b'{"id":"ev-2","v":1e21}',
    ]


async def test_agent_state_keeps_every_value(state_stub: Stub, user_id: str) -> None:
    cid = await new_conversation(state_stub, user_id)
    sent = (
        b'{"b":1e21,"context":[{"x":-0.0,"s":"tool \\u0000 output"} , {"n":9007199254740993}],'
        b'"a":{"k" : 1.0},"session_id":"\xf0\x9f\x98\x80"}'
    )
    saved = await state_stub.UpsertState(
        pb.UpsertStateRequest(user_id=user_id, conversation_id=cid, payload=sent)
    )
    got = await state_stub.GetState(pb.GetStateRequest(user_id=user_id, conversation_id=cid))
    assert got.payload == (
        b'{"b": 1e21, "context": [{"x":-0.0,"s":"tool \\u0000 output"}, {"n":9007199254740993}], '
        b'"a": {"k" : 1.0}, "session_id": "\xf0\x9f\x98\x80"}'
    )
    # A delta: the appended message as sent, "context" where it stood.
    saved = await state_stub.UpsertState(
        pb.UpsertStateRequest(
            user_id=user_id,
            conversation_id=cid,
            delta=pb.StateDelta(base_version=saved.version, messages=[b' {"m":1.10} ']),
        )
    )
    got = await state_stub.GetState(pb.GetStateRequest(user_id=user_id, conversation_id=cid))
    assert got.payload == (
        b'{"b": 1e21, "context": [{"x":-0.0,"s":"tool \\u0000 output"}, {"n":9007199254740993}, '
        b'{"m":1.10}], "a": {"k" : 1.0}, "session_id": "\xf0\x9f\x98\x80"}'
    )
    # New fields: their values as sent, then "context".
    await state_stub.UpsertState(
        pb.UpsertStateRequest(
            user_id=user_id,
            conversation_id=cid,
            delta=pb.StateDelta(
                base_version=saved.version, drop_head=2, fields_json=b'{"z":NaN,"y":"\\u0000"}'
            ),
        )
    )
    got = await state_stub.GetState(pb.GetStateRequest(user_id=user_id, conversation_id=cid))
    assert got.payload == b'{"z": NaN, "y": "\\u0000", "context": [{"m":1.10}]}'
    # A state without a "context" array is its members; a delta gives it one, last.
    other = await new_conversation(state_stub, user_id)
    first = await state_stub.UpsertState(
        pb.UpsertStateRequest(user_id=user_id, conversation_id=other, payload=HARD)
    )
    got = await state_stub.GetState(pb.GetStateRequest(user_id=user_id, conversation_id=other))
    assert got.payload == HARD_MEMBERS
    await state_stub.UpsertState(
        pb.UpsertStateRequest(
            user_id=user_id,
            conversation_id=other,
            delta=pb.StateDelta(base_version=first.version, messages=[b"1e21"]),
        )
    )
    got = await state_stub.GetState(pb.GetStateRequest(user_id=user_id, conversation_id=other))
    assert got.payload == HARD_MEMBERS[:-1] + b', "context": [1e21]}'
    begun = await state_stub.BeginTurn(
        pb.BeginTurnRequest(user_id=user_id, conversation_id=other, holder="h", ttl_ms=5000)
    )
    assert begun.payload == got.payload


async def test_merging_into_an_agent_state_is_refused(state_stub: Stub, user_id: str) -> None:
    cid = await new_conversation(state_stub, user_id)
    await state_stub.UpsertState(
        pb.UpsertStateRequest(
            user_id=user_id, conversation_id=cid, state_key="adk.session",
            payload=b'{"context": [1]}',
        )
    )  # fmt: skip
    await expect_rpc_error(
        state_stub.AppendEvent(
            pb.AppendEventRequest(
                user_id=user_id, conversation_id=cid, item=pb.NewItem(item_json=b"{}"),
                state_key="adk.session", state_delta_json=b'{"k": 1}',
            )
        ),
        grpc.StatusCode.FAILED_PRECONDITION,
        "nothing was stored",
    )  # fmt: skip
    listed = await state_stub.ListItems(pb.ListItemsRequest(user_id=user_id, conversation_id=cid))
    assert list(listed.items) == [] and listed.revision == 0


async def test_checkpoint_metadata_as_sent_and_still_searchable(
    state_stub: Stub, user_id: str
) -> None:
    cid = await new_conversation(state_stub, user_id)
    request = put_request(user_id, cid, "c1")
    metadata = b'{"run_id":"r1","step":1e21,"note":"\\u0000","w":NaN,"source":"loop"}'
    request.metadata_json = metadata
    await state_stub.PutCheckpoint(request)
    found = await state_stub.GetCheckpoint(
        pb.GetCheckpointRequest(user_id=user_id, conversation_id=cid)
    )
    assert found.checkpoint.metadata_json == metadata
    listed = await state_stub.ListCheckpoints(
        pb.ListCheckpointsRequest(
            user_id=user_id, conversation_id=cid, metadata_filter_json=b'{"source": "loop"}'
        )
    )
    assert [c.metadata_json for c in listed.checkpoints] == [metadata]
    copy = await new_conversation(state_stub, user_id)
    await state_stub.CopyCheckpoints(
        pb.CopyCheckpointsRequest(
            user_id=user_id, source_conversation_id=cid, target_conversation_id=copy
        )
    )
    copied = await state_stub.GetCheckpoint(
        pb.GetCheckpointRequest(user_id=user_id, conversation_id=copy)
    )
    assert copied.checkpoint.metadata_json == metadata
    deleted = await state_stub.DeleteCheckpointsForRuns(
        pb.DeleteCheckpointsForRunsRequest(user_id=user_id, run_ids=["r1"])
    )
    assert deleted.checkpoints_deleted == 2  # the original and its copy


async def test_rows_stored_before_migration_12_read_and_merge(
    state_stub: Stub, store: StateStore, user_id: str
) -> None:
    """A row in the jsonb layout (as migration 11 left it) reads back as jsonb prints
    it, and its next write moves it to text without losing anything."""
    if not isinstance(store, PostgresStore):
        return
    cid = await new_conversation(state_stub, user_id)
    await state_stub.AppendEvent(
        pb.AppendEventRequest(
            user_id=user_id, conversation_id=cid, item=pb.NewItem(item_json=b'{"id": 1}'),
            state_key="adk.session", state_delta_json=b'{"b": 1, "a": 2}',
            app_name="legacy-app", app_state_delta_json=b'{"x": 1}',
        )
    )  # fmt: skip
    async with store.pool.connection() as conn:
        await conn.execute(
            "UPDATE t_conversation_item SET item = item_text::jsonb, item_text = NULL "
            "WHERE conversation_id = %s",
            (int(cid),),
        )
        await conn.execute(
            'UPDATE t_agent_state SET payload = \'{"b": 1, "a": 2.50}\'::jsonb, '
            "member_keys = NULL, member_values = NULL WHERE session_id = %s",
            (int(cid),),
        )
        await conn.execute(
            "UPDATE t_scoped_state SET payload = '{\"x\": 1}'::jsonb, member_keys = NULL, "
            "member_values = NULL WHERE app_name = 'legacy-app'"
        )
    listed = await state_stub.ListItems(pb.ListItemsRequest(user_id=user_id, conversation_id=cid))
    assert [i.item_json for i in listed.items] == [b'{"id": 1}']
    state = await state_stub.GetState(
        pb.GetStateRequest(user_id=user_id, conversation_id=cid, state_key="adk.session")
    )
    assert state.payload == b'{"a": 2.50, "b": 1}'  # jsonb's order and print
    await state_stub.AppendEvent(
        pb.AppendEventRequest(
            user_id=user_id, conversation_id=cid, item=pb.NewItem(item_json=b'{"id":2}'),
            state_key="adk.session", state_delta_json=b'{"b": 1e21, "c": "\\u0000"}',
            app_name="legacy-app", app_state_delta_json=b'{"y": -0.0}',
        )
    )  # fmt: skip
    state = await state_stub.GetState(
        pb.GetStateRequest(user_id=user_id, conversation_id=cid, state_key="adk.session")
    )
    assert state.payload == b'{"a": 2.50, "b": 1e21, "c": "\\u0000"}'
    scoped = await state_stub.GetScopedState(
        pb.GetScopedStateRequest(user_id=user_id, app_name="legacy-app")
    )
    assert scoped.app_state.payload == b'{"x": 1, "y": -0.0}'
    popped = await state_stub.PopItem(pb.PopItemRequest(user_id=user_id, conversation_id=cid))
    assert popped.item.item_json == b'{"id":2}'
    popped = await state_stub.PopItem(pb.PopItemRequest(user_id=user_id, conversation_id=cid))
    assert popped.item.item_json == b'{"id": 1}'


async def test_a_filter_naming_what_jsonb_cannot_hold_is_refused(
    state_stub: Stub, user_id: str
) -> None:
    cid = await new_conversation(state_stub, user_id)
    for bad in (b'{"note": "\\u0000"}', b'{"w": NaN}'):
        await expect_rpc_error(
            state_stub.ListCheckpoints(
                pb.ListCheckpointsRequest(
                    user_id=user_id, conversation_id=cid, metadata_filter_json=bad
                )
            ),
            grpc.StatusCode.INVALID_ARGUMENT,
            "metadata_filter_json",
        )


async def test_concurrent_merges_into_one_scoped_state_lose_nothing(
    state_stub: Stub, user_id: str
) -> None:
    """Twenty sessions merge into one app state at once: every key lands, in one of
    the serial orders, and the version counts every merge (the row is locked, and the
    first two writers race to create it)."""
    app = f"race-{user_id}"
    cids = [await new_conversation(state_stub, user_id) for _ in range(20)]
    await asyncio.gather(
        *(
            state_stub.AppendEvent(
                pb.AppendEventRequest(
                    user_id=user_id, conversation_id=cid, item=pb.NewItem(item_json=b"{}"),
                    app_name=app, app_state_delta_json=b'{"k%d": %d.0}' % (n, n),
                    user_state_delta_json=b'{"shared": %d}' % n,
                )
            )
            for n, cid in enumerate(cids)
        )
    )  # fmt: skip
    scoped = await state_stub.GetScopedState(
        pb.GetScopedStateRequest(user_id=user_id, app_name=app)
    )
    app_state = json.loads(scoped.app_state.payload)
    assert sorted(app_state) == sorted(f"k{n}" for n in range(20))
    assert all(app_state[f"k{n}"] == float(n) for n in range(20))
    assert b'"k3": 3.0' in scoped.app_state.payload  # the spelling sent
    assert scoped.app_state.version == 20 and scoped.user_state.version == 20
    assert list(json.loads(scoped.user_state.payload)) == ["shared"]
