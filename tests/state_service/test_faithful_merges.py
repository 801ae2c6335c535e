"""Faithful payloads under random values (issue 22, item 1), against both stores: a whole
state saved and read back, and a sequence of AppendEvent merges into the session, app and
user states, against a model (a dict updated as dict.update does). Each read must be, byte
for byte, `json.dumps(model)` (ensure_ascii=False), so both stores answer alike and every
value keeps its spelling: 1 and 1.0, -0.0, 1e21, integers above 2**53, NUL, non-BMP, NaN.
"""

from __future__ import annotations

import json
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agentstate.state_service import domain as d
from agentstate.state_service.storage.base import StateStore
from agentstate.state_service.storage.base.items import ItemStore

USER = "merge-user"
LIMIT = 1 << 20

text = st.text(st.characters(exclude_categories=["Cs"]), max_size=8)
scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.sampled_from([1.0, -0.0, 0.0, 1e21, 1e-7, 2.5, float("nan"), float("inf"), -1e308]),
    text,
)
values = st.recursive(
    scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(text, inner, max_size=3)),
    max_leaves=8,
)
keys = st.sampled_from(["a", "b", "z", "k\x00", "é", "😀", "context", "temp:t", "1e21"])
deltas = st.dictionaries(keys, values, max_size=4)


def dumps(value: Any) -> bytes:
    return json.dumps(value, ensure_ascii=False).encode()


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(steps=st.lists(st.tuples(deltas, deltas, deltas), min_size=1, max_size=5))
async def test_merges_keep_every_value(store: StateStore, steps: list[Any]) -> None:
    assert isinstance(store, ItemStore)  # both stores have the capability
    cid = (await store.create_conversation(user_id=USER, title="m")).conversation_id
    app = f"app-{cid}"
    model: dict[str, dict[str, Any]] = {"session": {}, "app": {}, "user": {}}
    for revision, (session, app_delta, user_delta) in enumerate(steps):
        await store.append_event(
            user_id=USER,
            conversation_id=cid,
            event=d.EventAppend(
                item=d.NewItem(dumps({"n": revision, "delta": session})),
                expected_revision=revision,
                state_key="adk.session",
                state_delta=d.without_temp_keys(dumps(session), LIMIT, "state_delta"),
                app_name=app,
                app_delta=d.state_delta(dumps(app_delta), LIMIT, "app_state_delta"),
                user_delta=d.state_delta(dumps(user_delta), LIMIT, "user_state_delta"),
            ),
        )
        model["session"].update({k: v for k, v in session.items() if not k.startswith("temp:")})
        model["app"].update(app_delta)
        model["user"].update(user_delta)
    if model["session"]:
        state = await store.get_state(user_id=USER, conversation_id=cid, state_key="adk.session")
        assert state.payload == dumps(model["session"])
    scoped = await store.get_scoped_state(user_id=USER, app_name=app)
    for got, want in ((scoped.app, model["app"]), (scoped.user, model["user"])):
        assert (got.payload if got else None) == (dumps(want) if want else None)
    page = await store.list_items(
        user_id=USER, conversation_id=cid, last_n=None, min_item_time=None,
        page_size=100, after_seq=None,
    )  # fmt: skip
    assert [i.item_json for i in page.items] == [
        dumps({"n": n, "delta": s}) for n, (s, _, _) in enumerate(steps)
    ]
    await store.delete_conversations(user_id=USER, conversation_ids=[cid])


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    rest=st.dictionaries(keys.filter(lambda k: k != "context"), values, max_size=4),
    context=st.one_of(st.none(), st.lists(values, max_size=4)),
    at=st.integers(0, 4),
)
async def test_a_whole_state_reads_back_as_sent(
    store: StateStore, rest: dict[str, Any], context: list[Any] | None, at: int
) -> None:
    items = list(rest.items())
    if context is not None:
        items.insert(min(at, len(items)), ("context", context))
    state = dict(items)
    cid = (await store.create_conversation(user_id=USER, title="w")).conversation_id
    await store.save_state(
        user_id=USER, conversation_id=cid, state_key="agent_state", payload=dumps(state),
        expected_version=0,
    )  # fmt: skip
    got = await store.get_state(user_id=USER, conversation_id=cid, state_key="agent_state")
    assert got.payload == dumps(state)
    await store.delete_conversations(user_id=USER, conversation_ids=[cid])
