"""Delta saves (issue 16): only what changed is sent and stored, and GetState still
returns the whole state, byte for byte what a whole-state save of the same JSON returns.

The property test runs random sequences of appends, replacements, trims, compactions,
changes of the other fields, whole saves, compare-and-set conflicts, refused parts and
deletes against both stores and a reference model (a plain Python value). After every
step the stored state must be, byte for byte, (1) what a whole save of the model's JSON
to another conversation of the same store returns, and (2) `json.dumps(model)` itself:
every value as it was sent, keys in the model's order (issue 22), so both stores answer
with the same bytes. A state stored before migration 12 (the "legacy" step) reads back
as jsonb printed it until it is saved whole again; it is compared by value meanwhile.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agentstate.state_service import domain as d
from agentstate.state_service.domain import StateDelta
from agentstate.state_service.storage.base import StateStore
from agentstate.state_service.storage.postgres import PostgresStore
from tests.support.state_process import StateServices

USER = "delta-user"
LIMIT = 256 * 1024

# Keys around "context" in jsonb's order (shorter first, then bytewise): the
# assembled state must put "context" exactly where a whole save's jsonb does.
TOP_KEYS = [
    "a", "zz", "contex", "abcdefg", "context_", "contexa", "contexz", "zzzzzzz", "summary",
    "user_id", "cur_iter", "reply_id", "session_id", "é", "ключ", "tool_context",
]  # fmt: skip

text = st.text(st.characters(exclude_categories=["Cs"], exclude_characters="\x00"), max_size=12)
scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(10**20), 10**20),
    st.sampled_from([1.5, -0.0, 1e-7, 2.5e20, 0.1]),
    text,
)
values = st.recursive(
    scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(text, inner, max_size=4)),
    max_leaves=12,
)
messages = st.fixed_dictionaries(
    {"id": text, "role": st.sampled_from(["USER", "ASSISTANT", "TOOL"]), "content": values}
)
fields = st.dictionaries(st.sampled_from(TOP_KEYS), values, max_size=5)

# One step: (kind, argument drawn for it).
steps = st.one_of(
    st.tuples(st.just("append"), st.lists(messages, max_size=4)),
    st.tuples(st.just("replace"), st.tuples(st.floats(0, 1), st.lists(messages, max_size=3))),
    st.tuples(st.just("trim"), st.floats(0, 1)),
    st.tuples(st.just("compact"), st.tuples(st.floats(0, 1), text)),
    st.tuples(st.just("fields"), fields),
    st.tuples(st.just("whole"), st.lists(messages, max_size=5)),
    st.tuples(st.just("conflict"), st.integers(1, 3)),
    st.tuples(st.just("refused"), st.sampled_from(["nul", "deep", "json", "range", "context"])),
    st.tuples(st.just("delete"), st.none()),
    st.tuples(st.just("legacy"), st.none()),
    # Messages of a few KB: states of several chunks, cuts inside them (migration 16).
    st.tuples(st.just("big"), st.lists(st.integers(1500, 7000), min_size=1, max_size=3)),
    st.tuples(st.just("rows"), st.none()),
)


def dumps(value: Any) -> bytes:
    return json.dumps(value, ensure_ascii=False).encode()


class Run:
    """One sequence against one store, with its model."""

    def __init__(self, store: StateStore) -> None:
        self.store = store
        self.model: dict[str, Any] = {}
        self.legacy = False  # rows stored as jsonb before migration 12
        self.version = 0
        self.cid = 0

    async def start(self) -> None:
        self.legacy = False
        self.cid = (await self.store.create_conversation(user_id=USER, title="t")).conversation_id
        self.model = {"session_id": str(self.cid), "context": [{"id": "m0", "content": "hi"}]}
        saved = await self.store.save_state(
            user_id=USER, conversation_id=self.cid, state_key="agent_state",
            payload=dumps(self.model), expected_version=0,
        )  # fmt: skip
        self.version = saved.version

    async def delta(self, delta: StateDelta) -> None:
        saved = await self.store.save_state(
            user_id=USER, conversation_id=self.cid, state_key="agent_state", payload=None,
            expected_version=None, delta=delta, max_state_bytes=LIMIT,
        )  # fmt: skip
        assert saved.version == self.version + 1
        self.version = saved.version

    async def check(self) -> None:
        got = await self.store.get_state(
            user_id=USER, conversation_id=self.cid, state_key="agent_state"
        )
        assert got.version == self.version
        # What a whole save of the model's JSON returns, on the same store.
        twin = await self.store.create_conversation(user_id=USER, title="twin")
        await self.store.save_state(
            user_id=USER, conversation_id=twin.conversation_id, state_key="agent_state",
            payload=dumps(self.model), expected_version=0,
        )  # fmt: skip
        whole = await self.store.get_state(
            user_id=USER, conversation_id=twin.conversation_id, state_key="agent_state"
        )
        await self.store.delete_conversations(user_id=USER, conversation_ids=[twin.conversation_id])
        assert json.loads(got.payload) == json.loads(dumps(self.model))
        if isinstance(self.store, PostgresStore):
            await _check_context_bytes(self.store, self.cid, got.payload)
        if not self.legacy:
            assert got.payload == whole.payload
            assert got.payload == dumps(self.model)

    async def unchanged_after(self, delta: StateDelta, error: type[Exception]) -> None:
        before = await self.store.get_state(
            user_id=USER, conversation_id=self.cid, state_key="agent_state"
        )
        with pytest.raises(error):
            await self.delta(delta)
        after = await self.store.get_state(
            user_id=USER, conversation_id=self.cid, state_key="agent_state"
        )
        assert (after.payload, after.version) == (before.payload, before.version)

    async def step(self, kind: str, arg: Any) -> None:
        context: list[Any] = self.model["context"]
        rest = {k: v for k, v in self.model.items() if k != "context"}
        if kind == "append":
            await self.delta(StateDelta(self.version, messages=tuple(map(dumps, arg))))
            context.extend(arg)
        elif kind == "replace":
            at, new = int(arg[0] * len(context)), arg[1]
            await self.delta(
                StateDelta(self.version, replace_from=at, messages=tuple(map(dumps, new)))
            )
            self.model["context"] = context[:at] + new
        elif kind == "trim" and context:
            # An older message's content shortened: sent as "replace from it on".
            at = min(int(arg * len(context)), len(context) - 1)
            changed = [dict(context[at], content="[trimmed tool result]"), *context[at + 1 :]]
            await self.delta(
                StateDelta(self.version, replace_from=at, messages=tuple(map(dumps, changed)))
            )
            self.model["context"] = context[:at] + changed
        elif kind == "compact":
            cut, summary = int(arg[0] * len(context)), arg[1]
            rest["summary"] = summary
            await self.delta(StateDelta(self.version, drop_head=cut, fields_json=dumps(rest)))
            self.model = {**rest, "context": context[cut:]}
        elif kind == "fields":
            await self.delta(StateDelta(self.version, fields_json=dumps(arg)))
            self.model = {**arg, "context": context}
        elif kind == "whole":
            self.model = {**rest, "context": context[: len(context) // 2] + arg}
            saved = await self.store.save_state(
                user_id=USER, conversation_id=self.cid, state_key="agent_state",
                payload=dumps(self.model), expected_version=self.version,
            )  # fmt: skip
            self.version = saved.version
            self.legacy = False
        elif kind == "conflict":
            if self.version > arg:
                stale = StateDelta(self.version - arg, messages=(b'{"lost": true}',))
                await self.unchanged_after(stale, d.VersionConflict)
            ahead = StateDelta(self.version + arg, messages=(b'{"lost": true}',))
            await self.unchanged_after(ahead, d.VersionConflict)
        elif kind == "refused":
            bad = {
                "nul": StateDelta(self.version, messages=(b'{"a": "x\x00"}',)),
                "deep": StateDelta(self.version, messages=(b"[" * 511 + b"]" * 511,)),
                "json": StateDelta(self.version, messages=(b'{"a": ',)),
                "range": StateDelta(self.version, replace_from=len(context) + 1),
                "context": StateDelta(self.version, fields_json=b'{"context": []}'),
            }[arg]
            await self.unchanged_after(bad, d.InvalidArgument)
        elif kind == "delete":
            await self.store.delete_conversations(user_id=USER, conversation_ids=[self.cid])
            with pytest.raises(d.NotFound):  # a late delta never brings it back
                await self.delta(StateDelta(self.version, messages=(b"{}",)))
            with pytest.raises(d.NotFound):
                await self.store.get_state(
                    user_id=USER, conversation_id=self.cid, state_key="agent_state"
                )
            if isinstance(self.store, PostgresStore):
                assert await _state_rows(self.store, self.cid) == 0
            await self.start()
        elif kind == "legacy" and isinstance(self.store, PostgresStore):
            # A state as it was stored before migration 10: whole, in one row.
            await _store_whole(self.store, self.cid, self.model)
            self.legacy = True
        elif kind == "big":
            big = [{"pad": "p" * size, "n": len(context) + i} for i, size in enumerate(arg)]
            await self.delta(StateDelta(self.version, messages=tuple(map(dumps, big))))
            context.extend(big)
        elif kind == "rows" and isinstance(self.store, PostgresStore):
            # Split as before migration 16: one message a row.
            await _one_message_a_row(self.store, self.cid)


async def _state_rows(store: PostgresStore, cid: int) -> int:
    async with store.pool.connection() as conn:
        cur = await conn.execute(
            # Messages, in chunks (migration 16) or, written before, one to a row.
            "SELECT coalesce(sum(coalesce(cardinality(messages), 1)), 0) AS n "
            "FROM t_agent_state_message WHERE session_id = %s",
            (cid,),
        )
        row = await cur.fetchone()
        assert row is not None
        return int(row["n"])


async def _check_context_bytes(store: PostgresStore, cid: int, payload: bytes) -> None:
    """The stored size of a split context (what the size limit is computed from) is
    that of the messages GetState returns, with chunks cut by a compaction."""
    async with store.pool.connection() as conn:
        cur = await conn.execute(
            # The frame's plaintext size (sealed when encryption is on, migration 14).
            "SELECT agentstate_plain_length(context_head) + agentstate_plain_length(context_tail)"
            " AS frame, context_count, context_bytes FROM t_agent_state "
            "WHERE user_id = %s AND session_id = %s",
            (USER, cid),
        )
        row = await cur.fetchone()
    assert row is not None
    if row["context_count"] is None:
        return
    n = int(row["context_count"])
    frame = int(row["frame"])
    assert int(row["context_bytes"]) == len(payload) - frame - 2 - 2 * max(n - 1, 0)
    assert n == len(json.loads(payload)["context"])


async def _one_message_a_row(store: PostgresStore, cid: int) -> None:
    async with store.pool.connection() as conn:
        await conn.execute(
            "WITH old AS (DELETE FROM t_agent_state_message WHERE user_id = %s "
            "AND session_id = %s RETURNING *) "
            "INSERT INTO t_agent_state_message (user_id, session_id, state_key, position, message) "
            "SELECT o.user_id, o.session_id, o.state_key, o.position + u.i - 1, u.m FROM old AS o "
            "JOIN t_agent_state AS s USING (user_id, session_id, state_key), "
            "unnest(coalesce(o.messages, ARRAY[o.message])) WITH ORDINALITY AS u(m, i) "
            "WHERE o.position + u.i - 1 >= s.context_start",  # a cut chunk's skipped head
            (USER, cid),
        )


async def _store_whole(store: PostgresStore, cid: int, model: dict[str, Any]) -> None:
    """Rewrite a state into the pre-migration form (whole payload, no rows)."""
    async with store.pool.connection() as conn, conn.transaction():
        await conn.execute(
            "DELETE FROM t_agent_state_message WHERE user_id = %s AND session_id = %s",
            (USER, cid),
        )
        await conn.execute(
            "UPDATE t_agent_state SET payload = %s::text::jsonb, member_keys = NULL, "
            "member_values = NULL, context_start = NULL, "
            "context_count = NULL, context_bytes = NULL, context_head = NULL, context_tail = NULL "
            "WHERE user_id = %s AND session_id = %s",
            (dumps(model).decode(), USER, cid),
        )


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(sequence=st.lists(steps, min_size=1, max_size=14))
async def test_delta_saves_match_a_whole_save_byte_for_byte(
    store: StateStore, sequence: list[tuple[str, Any]]
) -> None:
    run = Run(store)
    await run.start()
    await run.check()
    for kind, arg in sequence:
        await run.step(kind, arg)
        await run.check()


# ------------------------------------------------------------ specific cases


async def _conversation_with_state(store: StateStore, state: dict[str, Any]) -> Run:
    run = Run(store)
    await run.start()
    run.model = state
    saved = await store.save_state(
        user_id=USER, conversation_id=run.cid, state_key="agent_state",
        payload=dumps(state), expected_version=run.version,
    )  # fmt: skip
    run.version = saved.version
    return run


async def test_size_limit_applies_to_the_assembled_state(store: StateStore) -> None:
    run = await _conversation_with_state(store, {"context": [{"t": "x" * 1000}] * 200})
    before = await store.get_state(user_id=USER, conversation_id=run.cid, state_key="agent_state")
    assert len(before.payload) < LIMIT
    # Each delta is small; the state it would make is not.
    big = dumps({"t": "y" * 40_000})
    with pytest.raises(d.PayloadTooLarge, match="over the limit"):
        await run.delta(StateDelta(run.version, messages=(big, big)))
    after = await store.get_state(user_id=USER, conversation_id=run.cid, state_key="agent_state")
    assert (after.payload, after.version) == (before.payload, before.version)
    # Exactly at the limit is accepted: the size is the assembled state's.
    room = LIMIT - len(before.payload) - 2 - len(b'{"t": ""}')
    await run.delta(StateDelta(run.version, messages=(dumps({"t": "z" * room}),)))
    at_limit = await store.get_state(user_id=USER, conversation_id=run.cid, state_key="agent_state")
    assert len(at_limit.payload) == LIMIT
    with pytest.raises(d.PayloadTooLarge):
        await run.delta(StateDelta(run.version, messages=(b"1",)))


async def test_delta_on_a_state_whose_context_is_not_an_array(store: StateStore) -> None:
    run = await _conversation_with_state(store, {"context": "not a list", "x": 1})
    with pytest.raises(d.FailedPrecondition, match="send the whole state"):
        await run.delta(StateDelta(run.version, messages=(b"{}",)))
    # A state without "context" gets one.
    run = await _conversation_with_state(store, {"x": 1})
    await run.delta(StateDelta(run.version, messages=(b'{"m": 1}',)))
    got = await store.get_state(user_id=USER, conversation_id=run.cid, state_key="agent_state")
    assert got.payload == b'{"x": 1, "context": [{"m": 1}]}'


async def test_each_bad_part_is_named_and_nothing_changes(store: StateStore) -> None:
    run = await _conversation_with_state(store, {"context": [{"m": 0}], "summary": ""})
    cases: list[tuple[StateDelta, str]] = [
        (StateDelta(run.version, messages=(b"{}", b'{"a": "\x00"}')), r"delta.messages\[1\]"),
        (StateDelta(run.version, messages=(b'{"a": tru}',)), r"delta.messages\[0\]"),
        (StateDelta(run.version, messages=(b'{"a": ',)), r"delta.messages\[0\]"),
        (StateDelta(run.version, messages=(b"[" * 511 + b"]" * 511,)), "510 levels"),
        (StateDelta(run.version, messages=(b"",)), "empty"),
        (StateDelta(run.version, fields_json=b'{"s": "\x00"}'), "fields_json"),
        (StateDelta(run.version, fields_json=b'{"s": nul}'), "fields_json"),
        (StateDelta(run.version, fields_json=b"[1]"), "fields_json must be a JSON object"),
        (StateDelta(run.version, fields_json=b'{"a": ' + b"[" * 512 + b"]" * 512 + b"}"), "512"),
        (StateDelta(run.version, fields_json=b'{"context": []}'), 'must not name "context"'),
        (StateDelta(run.version, drop_head=2), "drop_head is 2"),
        (StateDelta(run.version, drop_head=1, replace_from=1), "replace_from is 1"),
        (StateDelta(run.version, drop_head=-1), "negative"),
        (StateDelta(0, messages=(b"{}",)), "base_version"),
    ]
    for delta, message in cases:
        before = await store.get_state(
            user_id=USER, conversation_id=run.cid, state_key="agent_state"
        )
        with pytest.raises(d.InvalidArgument, match=message):
            await run.delta(delta)
        after = await store.get_state(
            user_id=USER, conversation_id=run.cid, state_key="agent_state"
        )
        assert (after.payload, after.version) == (before.payload, before.version), message


async def test_delta_with_records_and_lease_is_one_transaction(store: StateStore) -> None:
    """EndTurn with a delta: the state, the record writes and the lease release together;
    a refused record write leaves the state and the lease as they were."""
    run = await _conversation_with_state(store, {"context": []})
    turn = await store.begin_turn(
        user_id=USER, conversation_id=run.cid,
        start=d.TurnStart(holder="h", ttl_ms=10_000, new_messages=(
            d.NewMessage(d.MessageRole.ASSISTANT, status=d.MessageStatus.STREAMING),)),
    )  # fmt: skip
    record = turn.messages[0].message_id
    bad = d.MessageUpdate(999, status=d.MessageStatus.NORMAL)
    with pytest.raises(d.NotFound):
        await store.save_state(
            user_id=USER, conversation_id=run.cid, state_key="agent_state", payload=None,
            expected_version=None, delta=StateDelta(run.version, messages=(b"{}",)),
            message_writes=[bad], task_id=turn.lease.task_id,
        )  # fmt: skip
    unchanged = await store.get_state(
        user_id=USER, conversation_id=run.cid, state_key="agent_state"
    )
    assert unchanged.version == run.version
    saved = await store.save_state(
        user_id=USER, conversation_id=run.cid, state_key="agent_state", payload=None,
        expected_version=None, delta=StateDelta(run.version, messages=(b"{}",)),
        message_writes=[d.MessageUpdate(record, status=d.MessageStatus.NORMAL)],
        task_id=turn.lease.task_id,
    )  # fmt: skip
    assert saved.lease_released and saved.version == run.version + 1
    assert saved.messages[0].status is d.MessageStatus.NORMAL


async def test_begin_turn_omits_the_payload_the_caller_holds(store: StateStore) -> None:
    run = await _conversation_with_state(store, {"context": [{"m": 1}]})
    start = d.TurnStart(holder="h", ttl_ms=10_000, cached_version=run.version)
    held = await store.begin_turn(user_id=USER, conversation_id=run.cid, start=start)
    assert held.payload_omitted and held.state is not None
    assert held.state.payload == b"" and held.state.version == run.version
    await store.release_lease(user_id=USER, task_id=held.lease.task_id)
    stale = d.TurnStart(holder="h", ttl_ms=10_000, cached_version=run.version - 1)
    full = await store.begin_turn(user_id=USER, conversation_id=run.cid, start=stale)
    assert not full.payload_omitted and full.state is not None
    assert full.state.payload == b'{"context": [{"m": 1}]}'


# ------------------------------------------------ PostgreSQL: storage and migration


async def test_a_turn_writes_only_its_messages(pg_store: PostgresStore) -> None:
    """O(delta) storage: messages are kept in chunks of about 8 KB (migration 16); a
    delta appending messages touches only the last chunk and new ones, a whole save
    rewrites only the chunks that changed, a compaction only deletes."""

    def message(i: int | str) -> dict[str, Any]:
        return {"i": i, "text": "x" * 1010}  # just over 1 KB: 8 to a chunk

    run = await _conversation_with_state(
        pg_store, {"context": [message(i) for i in range(50)], "summary": "s"}
    )

    async def row_versions() -> dict[int, tuple[int, str]]:
        async with pg_store.pool.connection() as conn:
            cur = await conn.execute(
                "SELECT position, cardinality(messages) AS n, xmin::text AS x "
                "FROM t_agent_state_message WHERE session_id = %s ORDER BY position",
                (run.cid,),
            )
            return {int(r["position"]): (int(r["n"]), r["x"]) for r in await cur.fetchall()}

    before = await row_versions()
    assert sorted(before) == [0, 8, 16, 24, 32, 40, 48]
    assert sum(n for n, _ in before.values()) == 50
    await run.delta(StateDelta(run.version, messages=(dumps(message(50)), dumps(message(51)))))
    after = await row_versions()
    assert {p: v for p, v in after.items() if p < 48} == {p: v for p, v in before.items() if p < 48}
    assert after[48][0] == 4 and after[48][1] != before[48][1]  # the last chunk, filled
    # A whole save changing one message rewrites that chunk only.
    state: dict[str, Any] = {"context": [message(i) for i in range(52)], "summary": "s"}
    state["context"][10] = message("ten")
    await pg_store.save_state(
        user_id=USER, conversation_id=run.cid, state_key="agent_state",
        payload=dumps(state), expected_version=run.version,
    )  # fmt: skip
    run.version += 1
    rewritten = await row_versions()
    assert sorted(rewritten) == sorted(after)
    assert [p for p in rewritten if rewritten[p] != after[p]] == [8]
    # A compaction deletes the chunks before the new start and writes no other row: the
    # chunk it ends in stays as it was (reads skip its first messages); positions are
    # not renumbered.
    await run.delta(StateDelta(run.version, drop_head=42))
    compacted = await row_versions()
    assert compacted == {40: rewritten[40], 48: rewritten[48]}
    got = await pg_store.get_state(user_id=USER, conversation_id=run.cid, state_key="agent_state")
    assert json.loads(got.payload)["context"] == state["context"][42:]


async def test_deleting_a_conversation_removes_its_state_rows(pg_store: PostgresStore) -> None:
    run = await _conversation_with_state(pg_store, {"context": [{"i": i} for i in range(5)]})
    assert await _state_rows(pg_store, run.cid) == 5
    counts = await pg_store.delete_conversations(user_id=USER, conversation_ids=[run.cid])
    assert counts.states == 1
    assert await _state_rows(pg_store, run.cid) == 0
    with pytest.raises(d.NotFound):
        await run.delta(StateDelta(run.version, messages=(b"{}",)))
    assert await _state_rows(pg_store, run.cid) == 0


async def test_online_split_of_states_stored_whole(pg_store: PostgresStore) -> None:
    """Migration 11: states stored whole are split in batches while turns go on; their
    JSON and versions do not change, and writes during the split are kept."""
    runs = []
    for n in range(12):
        state: dict[str, Any] = {
            "context": [{"i": i, "n": n} for i in range(n)],
            "summary": f"s{n}",
        }
        if n == 3:
            state = {"context": "not a list"}  # stays whole
        if n == 4:
            state = {"no_context": True}
        run = await _conversation_with_state(pg_store, state)
        await _store_whole(pg_store, run.cid, state)
        runs.append(run)
    before = {
        r.cid: await pg_store.get_state(
            user_id=USER, conversation_id=r.cid, state_key="agent_state"
        )
        for r in runs
    }
    # A write racing the split: both orders are fine.
    split_task = asyncio.create_task(pg_store.split_whole_states(batch_size=5))
    racing = runs[7]
    await racing.delta(StateDelta(racing.version, messages=(b'{"late": 1}',)))
    racing.model["context"].append({"late": 1})
    # 12 states, 2 without a context array, one maybe split by the write (the
    # database is shared: other tests' whole states may be split too).
    assert await split_task >= 9
    for run in runs:
        got = await pg_store.get_state(
            user_id=USER, conversation_id=run.cid, state_key="agent_state"
        )
        if run is racing:
            assert json.loads(got.payload) == run.model
            continue
        assert (got.payload, got.version) == (before[run.cid].payload, before[run.cid].version)
    async with pg_store.pool.connection() as conn:
        cur = await conn.execute(
            "SELECT count(*) FILTER (WHERE context_start IS NULL) AS whole FROM t_agent_state "
            "WHERE session_id = ANY(%s)",
            ([r.cid for r in runs],),
        )
        row = await cur.fetchone()
    assert row is not None and row["whole"] == 2
    assert await pg_store.split_whole_states(batch_size=5) == 0  # nothing left, idempotent


async def test_assembly_matches_jsonb_for_awkward_keys(database_url: str) -> None:
    """The key order around "context" and escapes, against PostgreSQL itself."""
    keys = [
        "",
        "a",
        "contex",
        "context",
        "contexa",
        "contexz",
        "contextt",
        "ä",
        "\u00e9\u00e9\u00e9",
    ]
    with psycopg.connect(database_url) as conn:
        for key in keys:
            if key == "context":
                continue
            rest = {key: 'v\n"\u2028', "z": [1, {"b": None}]}
            whole = conn.execute(
                "SELECT (%s::jsonb || jsonb_build_object('context', %s::jsonb))::text",
                (json.dumps(rest), "[1, 2]"),
            ).fetchone()
            assembled = conn.execute(
                "SELECT agentstate_state_text(%s::jsonb, '[1, 2]')", (json.dumps(rest),)
            ).fetchone()
            assert whole is not None and assembled is not None
            assert assembled[0] == whole[0], key


# ----------------------------------------------------------------- over gRPC


async def test_end_turn_and_upsert_with_a_delta_over_grpc(state_stub: Any) -> None:
    from agentstate.state.v1 import state_service_pb2 as pb

    cid = (
        await state_stub.CreateConversation(pb.CreateConversationRequest(user_id=USER))
    ).conversation.conversation_id
    first = await state_stub.UpsertState(
        pb.UpsertStateRequest(
            user_id=USER, conversation_id=cid, payload=b'{"context": [{"m": 0}], "summary": ""}'
        )
    )
    upserted = await state_stub.UpsertState(
        pb.UpsertStateRequest(
            user_id=USER, conversation_id=cid,
            delta=pb.StateDelta(base_version=first.version, messages=[b'{"m": 1}']),
        )
    )  # fmt: skip
    begun = await state_stub.BeginTurn(
        pb.BeginTurnRequest(
            user_id=USER, conversation_id=cid, holder="h", ttl_ms=10_000,
            cached_version=upserted.version,
        )
    )  # fmt: skip
    assert begun.payload_omitted and begun.payload == b"" and begun.version == upserted.version
    ended = await state_stub.EndTurn(
        pb.EndTurnRequest(
            user_id=USER, conversation_id=cid, task_id=begun.lease.task_id,
            delta=pb.StateDelta(
                base_version=begun.version, drop_head=1, replace_from=0,
                messages=[b'{"m": 2}'], fields_json=b'{"summary": "m0 and m1"}',
            ),
        )
    )  # fmt: skip
    assert ended.lease_released and ended.version == 3
    got = await state_stub.GetState(pb.GetStateRequest(user_id=USER, conversation_id=cid))
    assert got.payload == b'{"summary": "m0 and m1", "context": [{"m": 2}]}'

    async def refused(request: Any, code: Any, text: str) -> None:
        import grpc

        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await state_stub.UpsertState(request)
        assert caught.value.code() == code, caught.value.details()
        assert text in (caught.value.details() or "")
        after = await state_stub.GetState(pb.GetStateRequest(user_id=USER, conversation_id=cid))
        assert (after.payload, after.version) == (got.payload, got.version)

    import grpc

    delta = pb.StateDelta(base_version=3, messages=[b"{}"])
    code = grpc.StatusCode
    await refused(
        pb.UpsertStateRequest(user_id=USER, conversation_id=cid, payload=b"{}", delta=delta),
        code.INVALID_ARGUMENT, "either payload or delta",
    )  # fmt: skip
    await refused(
        pb.UpsertStateRequest(
            user_id=USER, conversation_id=cid, expected_version=3, delta=delta
        ),
        code.INVALID_ARGUMENT, "expected_version must be absent",
    )  # fmt: skip
    await refused(
        pb.UpsertStateRequest(
            user_id=USER, conversation_id=cid, delta=pb.StateDelta(base_version=2)
        ),
        code.ABORTED, "current version is 3",
    )  # fmt: skip
    await refused(
        pb.UpsertStateRequest(
            user_id=USER, conversation_id=cid,
            delta=pb.StateDelta(base_version=3, messages=[b'"' + b"x" * 1024 * 1024 + b'"']),
        ),
        code.RESOURCE_EXHAUSTED, "over the limit",
    )  # fmt: skip
    await refused(
        pb.UpsertStateRequest(
            user_id=USER, conversation_id=cid,
            delta=pb.StateDelta(base_version=3, messages=[b"{}", b"nul\x00"]),
        ),
        code.INVALID_ARGUMENT, "delta.messages[1] contains a NUL byte",
    )  # fmt: skip


async def test_a_delta_from_a_turn_whose_lease_was_taken_over_is_refused(
    store: StateStore,
) -> None:
    """The fence of migration 6 holds for deltas: taken over means never again, even
    once the lease is free; nothing changes."""
    run = await _conversation_with_state(store, {"context": [{"m": 0}]})
    start = d.TurnStart(holder="h", ttl_ms=100)
    late = await store.begin_turn(user_id=USER, conversation_id=run.cid, start=start)
    await asyncio.sleep(0.25)
    newer = await store.begin_turn(user_id=USER, conversation_id=run.cid, start=start)
    await store.release_lease(user_id=USER, task_id=newer.lease.task_id)  # the lease is free
    before = await store.get_state(user_id=USER, conversation_id=run.cid, state_key="agent_state")
    with pytest.raises(d.LeaseLost):
        await store.save_state(
            user_id=USER, conversation_id=run.cid, state_key="agent_state", payload=None,
            expected_version=None, delta=StateDelta(run.version, messages=(b'{"late": 1}',)),
            task_id=late.lease.task_id,
        )  # fmt: skip
    after = await store.get_state(user_id=USER, conversation_id=run.cid, state_key="agent_state")
    assert (after.payload, after.version) == (before.payload, before.version)


async def test_split_states_command(
    pg_store: PostgresStore, state_services: StateServices, database_url: str
) -> None:
    """`agentstate-state split-states` runs the online split against the configured
    database and leaves nothing stored whole that could be split."""
    run = await _conversation_with_state(pg_store, {"context": [{"i": 1}], "summary": "s"})
    await _store_whole(pg_store, run.cid, run.model)
    before = await pg_store.get_state(
        user_id=USER, conversation_id=run.cid, state_key="agent_state"
    )
    command = state_services.start(
        {"STATE_STORE": "postgres", "DATABASE_URL": database_url},
        "split-states",
        "--batch-size",
        "3",
    )
    assert await asyncio.to_thread(command.wait, 60) == 0, command.output
    assert "none is left" in command.output
    after = await pg_store.get_state(user_id=USER, conversation_id=run.cid, state_key="agent_state")
    assert (after.payload, after.version) == (before.payload, before.version)
    assert await _state_rows(pg_store, run.cid) == 1


async def test_the_public_client_sends_deltas_sync_and_async(state_address: str) -> None:
    from agentstate.client import AsyncStateClient, StateChange, StateClient

    async with AsyncStateClient.connect(state_address) as client:
        cid = (await client.create_conversation(USER)).conversation_id
        first = await client.upsert_state(USER, cid, {"context": [], "summary": ""})
        saved = await client.upsert_state(
            USER, cid, delta=StateChange(first.version, messages=(b'{"m": 1}',))
        )
        assert saved.version == first.version + 1

    def sync_part() -> bytes:
        with StateClient.connect(state_address) as client:
            again = client.upsert_state(
                USER, cid, delta=StateChange(saved.version, fields_json=b'{"summary": "s"}')
            )
            assert again.version == saved.version + 1
            return client.get_state(USER, cid).payload

    payload = await asyncio.to_thread(sync_part)
    assert payload == b'{"summary": "s", "context": [{"m": 1}]}'
