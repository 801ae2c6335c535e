"""The runtime sends deltas (issue 16): what a turn changed since the version it loaded,
and nothing at a turn's start when this replica saved that version itself."""

from __future__ import annotations

import json

import grpc

from agentstate.agent_service.agent_state import (
    AgentState,
    Msg,
    Role,
    TextBlock,
    ToolResultBlock,
    ToolResultState,
)
from agentstate.agent_service.runtime.deltas import (
    CachedState,
    StateCache,
    baseline_of,
    change_since,
    encode_parts,
)
from tests.support.agent_harness import Stack
from tests.support.source_example import QUESTION


def _state(n: int) -> AgentState:
    return AgentState(
        session_id="1",
        user_id="u",
        context=[Msg(role=Role.USER, content=[TextBlock(f"m{i}")], id=f"m{i}") for i in range(n)],
    )


def _apply(stored: AgentState, changed: AgentState) -> AgentState:
    """What the state service stores: the loaded state with the change applied."""
    base = baseline_of(stored, 5)
    change = change_since(base, changed, encode_parts(changed))
    context = [json.loads(m) for m in base.messages][change.drop_head :]
    if change.replace_from is not None:
        context = context[: change.replace_from]
    context += [json.loads(m) for m in change.messages]
    fields = json.loads(change.fields_json or base.fields)
    return AgentState.from_json({**fields, "context": context})


def test_change_since_covers_appends_replacements_compactions_and_fields() -> None:
    loaded = _state(6)
    base = baseline_of(loaded, 5)

    appended = loaded.copy()
    appended.context += [Msg(role=Role.ASSISTANT, content=[TextBlock("new")], id="n1")]
    change = change_since(base, appended, encode_parts(appended))
    assert (change.base_version, change.drop_head, change.replace_from) == (5, 0, None)
    assert len(change.messages) == 1 and change.fields_json is None

    # An older tool result trimmed: replace from that message on.
    trimmed = loaded.copy()
    trimmed.context[2].content = [
        ToolResultBlock.of_text("c", "t", ToolResultState.SUCCESS, "[trimmed tool result]")
    ]
    change = change_since(base, trimmed, encode_parts(trimmed))
    assert change.replace_from == 2 and len(change.messages) == 4

    # A compaction: the first four dropped, the summary in the fields.
    compacted = loaded.copy()
    compacted.context = compacted.context[4:]
    compacted.summary = "the first four"
    change = change_since(base, compacted, encode_parts(compacted))
    assert (change.drop_head, change.replace_from, change.messages) == (4, None, ())
    assert change.fields_json is not None and b"the first four" in change.fields_json

    # Everything replaced by new messages.
    fresh = _state(0)
    fresh.context = [Msg(role=Role.USER, content=[TextBlock("x")], id="x")]
    change = change_since(base, fresh, encode_parts(fresh))
    assert change.drop_head == 6 and len(change.messages) == 1

    # The size of the parts is the size of the whole encoding, without encoding it.
    for state in (loaded, appended, compacted, fresh, _state(0)):
        assert encode_parts(state).size == len(state.encode())
    for state in (appended, trimmed, compacted, fresh):
        assert _apply(loaded, state) == state


def test_state_cache_is_bounded_and_taken_out_by_a_turn() -> None:
    cache = StateCache(max_entries=2, max_bytes=10_000)
    for n in range(3):
        state = _state(3)
        cache.put("u", f"c{n}", CachedState(state, baseline_of(state, 1)))
    assert len(cache) == 2 and cache.take("u", "c0") is None  # least recently used out
    assert cache.take("u", "c2") is not None and cache.take("u", "c2") is None  # taken once
    big = _state(500)
    cache.put("u", "big", CachedState(big, baseline_of(big, 1)))  # over max_bytes
    assert cache.take("u", "big") is None


async def test_two_replicas_take_turns_and_nothing_is_lost(stack: Stack, user_id: str) -> None:
    """A replica's held copy goes stale when another replica saves: its next turn gets
    the whole stored state (the versions differ) and saves a delta on it."""
    first = stack.agents[0][1]
    second = await stack.start_agent(replica_name="replica-2")
    turn = await first.chat(user_id, QUESTION)
    cid = turn.meta.conversation_id
    records = await stack.reader.records(user_id, cid)
    turn = await second.confirm(user_id, cid, records[1].message_id, approved=False)
    assert turn.code == grpc.StatusCode.OK, turn.details
    for replica, question in ((first, "我的名字是小王"), (second, "我叫什么？"), (first, "谢谢")):
        turn = await replica.chat(user_id, question, cid)
        assert turn.code == grpc.StatusCode.OK, turn.details
    stored, version = await stack.reader.state(user_id, cid)
    assert version == 5
    questions = [m.text for m in stored.context if m.role is Role.USER and m.text]
    assert questions == [QUESTION, "我的名字是小王", "我叫什么？", "谢谢"]
    # The copy the last replica holds is the stored state, value for value.
    runner = stack.agents[0][0].runner
    assert runner is not None
    held = runner.cache.take(user_id, cid)
    assert held is not None and held.baseline.version == version
    assert held.state == stored


def test_token_counts_are_cached_per_message_and_forgotten_when_trimmed() -> None:
    from agentstate.agent_service.context.manager import ContextManager, ContextSettings
    from agentstate.agent_service.context.tokens import EstimatingCounter

    class Counting(EstimatingCounter):
        calls = 0

        def count(self, text: str) -> int:
            Counting.calls += 1
            return super().count(text)

    async def summarize(previous: str, messages: object, allowance: int) -> str:
        return previous

    manager = ContextManager(ContextSettings(), Counting(), summarize, "prompt")
    state = _state(512)
    first = manager.measure(state)
    calls = Counting.calls
    assert manager.measure(state) == first
    assert Counting.calls - calls == 2  # the prompt and the summary; no message again
    state.context.append(Msg(role=Role.ASSISTANT, content=[TextBlock("one more")]))
    calls = Counting.calls
    manager.measure(state)
    assert Counting.calls - calls == 3
    # A trimmed message is counted again.
    state.context[3].content = [
        ToolResultBlock.of_text("c", "t", ToolResultState.SUCCESS, "x" * 3000)
    ]
    state.context[3].role = Role.TOOL
    before_trim = manager.measure(state)
    assert manager.trim(state, keep_cycles=0) == 1
    assert manager.measure(state) < before_trim
