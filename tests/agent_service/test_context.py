"""Context management: trimming, compaction, size guard, handbooks, RAG-mode history."""

from __future__ import annotations

import json
from typing import Any

import grpc
import pytest

from agentstate.agent.v1 import agent_service_pb2 as pb
from agentstate.agent_service.agent_state import (
    AgentState,
    Msg,
    Role,
    TextBlock,
    ToolResultBlock,
    ToolResultState,
    ToolUseBlock,
    ToolUseState,
)
from agentstate.agent_service.context.manager import (
    TRIM_MARKER,
    TRUNCATION_MARKER,
    ContextManager,
    ContextSettings,
)
from agentstate.agent_service.context.rag_history import HistoryRecord, rag_history, strip_citations
from agentstate.agent_service.context.tokens import BpeCounter, EstimatingCounter, make_counter
from agentstate.agent_service.errors import LimitReached
from agentstate.agent_service.model.base import ToolSpec
from agentstate.agent_service.model.scripted import ScriptedModel
from agentstate.agent_service.tools.registry import Tool, ToolContext, ToolOutput
from agentstate.examples.order_demo.profile import SYSTEM_PROMPT
from agentstate.state.v1 import state_service_pb2 as spb
from tests.support.agent_harness import RecordingModel, Stack, metadata
from tests.support.source_example import QUESTION

ADDRESS = "上海市浦东新区世纪大道100号"


def _report_text(n: int) -> str:
    lines = [f"报告 {n} 的编号是 R-{n:03d}-{(n * 7919) % 10000:04d}。"]
    lines += [f"第{i}行：订单处理日志 {n}-{i}，状态正常，耗时 {i * 3} 毫秒。" for i in range(40)]
    return "\n".join(lines)


def fetch_report_tool() -> Tool:
    async def run(args: dict[str, Any], context: ToolContext) -> ToolOutput:
        return ToolOutput(_report_text(int(args["n"])))

    return Tool(
        spec=ToolSpec(
            name="fetch_report",
            description="取一份很长的运营报告",
            parameters={
                "type": "object",
                "properties": {"n": {"type": "integer"}},
                "required": ["n"],
            },
        ),
        run=run,
    )


def _pairing_intact(state: AgentState) -> bool:
    uses = [b.id for m in state.context for b in m.content if isinstance(b, ToolUseBlock)]
    results = [b.id for m in state.context for b in m.content if isinstance(b, ToolResultBlock)]
    pending = {c.id for _, c in state.pending_calls()}
    return sorted(results) == sorted(u for u in uses if u not in pending) and len(
        set(results)
    ) == len(results)


def _trimmed(state: AgentState) -> int:
    return sum(
        1
        for m in state.context
        for b in m.content
        if isinstance(b, ToolResultBlock) and b.text.startswith(TRIM_MARKER)
    )


async def test_long_conversation_trims_then_compacts_and_remembers(
    database_url: str, orders_database_url: str, user_id: str
) -> None:
    budget = 6000
    stack = Stack(
        database_url, orders_database_url, context_budget_tokens=budget, keep_tool_cycles=3
    )
    await stack.start_state()
    model = RecordingModel()
    client = await stack.start_agent(model=model, extra_tools=[fetch_report_tool()])
    counter = make_counter("auto", "scripted")
    try:
        first = await client.chat(user_id, f"我的收货地址是{ADDRESS}")
        assert "记住了" in first.reply
        conversation_id = first.meta.conversation_id
        card = await client.chat(user_id, QUESTION, conversation_id)
        await client.confirm(user_id, conversation_id, card.card.message_id, approved=False)
        history: list[tuple[int, int, int]] = []  # (turn, trimmed placeholders, compactions)
        turns = 2
        for n in range(1, 49):
            turn = await client.chat(user_id, f'/fetch_report {{"n": {n}}}', conversation_id)
            assert turn.code == grpc.StatusCode.OK, turn.details
            turns += 1
            state, _ = await stack.reader.state(user_id, conversation_id)
            listed = await stack.reader.stub.ListCompactions(
                spb.ListCompactionsRequest(user_id=user_id, conversation_id=conversation_id)
            )
            history.append((n, _trimmed(state), len(listed.compactions)))
            assert _pairing_intact(state)
            request = model.requests[-1]
            measure = ContextManager(
                ContextSettings(budget_tokens=budget),
                counter,
                ScriptedModel().summarize,
                SYSTEM_PROMPT,
            ).measure
            sent = measure(
                AgentState("", "", context=list(request.context), summary=request.summary),
                request.tools,
            )
            assert sent <= budget, f"turn {n}: {sent} tokens sent to the model"
        first_trim = next(n for n, trimmed, _ in history if trimmed > 0)
        first_compaction = next(n for n, _, compactions in history if compactions > 0)
        assert first_trim < first_compaction
        assert history[-1][2] >= 2  # compacted more than once over the conversation

        state, _ = await stack.reader.state(user_id, conversation_id)
        assert ADDRESS in state.summary
        assert all(ADDRESS not in m.text for m in state.context)  # only the summary has it
        # The model answers the early fact from the summary.
        answer = await client.chat(user_id, "我的收货地址是什么？", conversation_id)
        assert ADDRESS in answer.reply and "摘要" in answer.reply

        # The message records still hold every original message, untrimmed.
        records: list[spb.MessageRecord] = []
        token = ""
        while True:
            page = await stack.reader.stub.ListMessages(
                spb.ListMessagesRequest(
                    user_id=user_id, conversation_id=conversation_id, page_token=token
                )
            )
            records.extend(page.messages)
            token = page.next_page_token
            if not token:
                break
        assert len(records) == 2 * (turns + 1) + 1  # +1: the confirm turn's reply record
        texts = [json.loads(r.blocks_json) for r in records]
        assert texts[0] == [{"type": "text", "text": f"我的收货地址是{ADDRESS}"}]
        early_report = next(
            b["output"][0]["text"]
            for blocks in texts
            for b in blocks
            if b.get("type") == "tool_result" and b["name"] == "fetch_report"
        )
        assert early_report == _report_text(1)
        total_context_messages = 8 + 4 * 48 + 2
        assert total_context_messages >= 200
    finally:
        await stack.close()


async def test_handbook_tools_follow_the_context(
    database_url: str, orders_database_url: str, user_id: str
) -> None:
    stack = Stack(database_url, orders_database_url, context_budget_tokens=4000)
    await stack.start_state()
    model = RecordingModel()
    client = await stack.start_agent(model=model, extra_tools=[fetch_report_tool()])
    try:
        card = await client.chat(user_id, QUESTION)
        conversation_id = card.meta.conversation_id
        await client.confirm(user_id, conversation_id, card.card.message_id, approved=False)
        assert "cancel_order" in {t.name for t in model.requests[-1].tools}
        for n in range(1, 30):
            await client.chat(user_id, f'/fetch_report {{"n": {n}}}', conversation_id)
        state, _ = await stack.reader.state(user_id, conversation_id)
        assert state.summary  # compacted: the handbook's turn is gone from the context
        assert not any(
            isinstance(b, ToolResultBlock) and b.name == "load_skill"
            for m in state.context
            for b in m.content
        )
        assert "cancel_order" not in {t.name for t in model.requests[-1].tools}
        # Asking to cancel again reloads the handbook first; then cancel_order is offered.
        again = await client.chat(user_id, QUESTION, conversation_id)
        ran = [(b.tool_name, b.status) for b in again.of("block")]
        assert ran[0] == ("load_skill", pb.TOOL_CALL_STATUS_RUNNING)
        assert again.kinds()[-2:] == ["confirm", "done"]
    finally:
        await stack.close()


async def test_size_guard_refuses_and_keeps_previous_state(
    database_url: str, orders_database_url: str, user_id: str
) -> None:
    stack = Stack(database_url, orders_database_url, state_max_bytes=8192)
    await stack.start_state()
    client = await stack.start_agent()
    try:
        first = await client.chat(user_id, "我的订单88235现在什么状态？")
        conversation_id = first.meta.conversation_id
        before, version = await stack.reader.state(user_id, conversation_id)
        huge_question = "请帮我看看" + "很长的问题" * 1500
        turn = await client.chat(user_id, huge_question, conversation_id)
        assert turn.code == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "over the 8192-byte limit" in turn.details
        assert turn.of("message")[-1].type == pb.MESSAGE_TYPE_ERROR
        after, version_after = await stack.reader.state(user_id, conversation_id)
        assert version_after == version and after.to_json() == before.to_json()
        records = await stack.reader.records(user_id, conversation_id)
        assert records[-1].status == spb.MESSAGE_STATUS_ERROR
        # The page shows why (the same sentence the ERROR event carried).
        shown = json.loads(records[-1].metadata_json)["error"]
        assert shown == turn.of("message")[-1].delta and "新的会话" in shown
    finally:
        await stack.close()


# ------------------------------------------------------------- manager, unit level


def _manager(budget: int = 2000, **settings: Any) -> ContextManager:
    return ContextManager(
        ContextSettings(budget_tokens=budget, **settings),
        EstimatingCounter(),
        ScriptedModel().summarize,
        "system",
    )


def _cycle(n: int, text: str, state: ToolResultState = ToolResultState.SUCCESS) -> list[Msg]:
    call = f"call_{n}"
    return [
        Msg(Role.USER, [TextBlock(f"问题 {n}")], name="user"),
        Msg(Role.ASSISTANT, [ToolUseBlock(call, "fetch_report", {"n": n}, ToolUseState.ALLOWED)]),
        Msg(Role.TOOL, [ToolResultBlock.of_text(call, "fetch_report", state, text)]),
        Msg(Role.ASSISTANT, [TextBlock(f"回答 {n}")]),
    ]


def _state(*messages: list[Msg]) -> AgentState:
    return AgentState("1", "u", context=[m for group in messages for m in group])


def test_trimming_keeps_identity_and_recent_cycles() -> None:
    state = _state(*(_cycle(n, f"结果 {n} " * 100) for n in range(6)))
    count = len(state.context)
    trimmed = _manager().trim(state, keep_cycles=3)
    assert trimmed == 2  # 6 cycles; the current turn's and the last 3 finished are kept
    assert len(state.context) == count
    first = state.context[2].content[0]
    assert isinstance(first, ToolResultBlock)
    assert first.id == "call_0" and first.name == "fetch_report" and first.state.value == "success"
    assert first.text.startswith(TRIM_MARKER)
    assert f"original_length={len('结果 0 ' * 100)}" in first.text
    assert 'arguments={"n": 0}' in first.text
    kept = state.context[-2].content[0]
    assert isinstance(kept, ToolResultBlock) and not kept.text.startswith(TRIM_MARKER)
    assert _manager().trim(state, keep_cycles=3) == 0  # idempotent


async def test_all_one_huge_tool_result() -> None:
    state = _state(_cycle(1, "巨大的结果" * 40_000)[:3])
    manager = _manager(budget=2000)
    report = await manager.prepare(state)
    assert report.compactions == []  # one turn: no safe cut
    assert len(state.context) == 3 and _pairing_intact(state)
    result = state.context[2].content[0]
    assert isinstance(result, ToolResultBlock) and result.text.startswith(TRUNCATION_MARKER)
    assert report.tokens <= 2000


async def test_compaction_keeps_a_pending_card() -> None:
    history = [_cycle(n, f"结果 {n} " * 60) for n in range(8)]
    card = [
        Msg(Role.USER, [TextBlock("取消订单 88235")], name="user"),
        Msg(
            Role.ASSISTANT,
            [ToolUseBlock("call_card", "cancel_order", {"orderNo": "88235"}, ToolUseState.ASKING)],
        ),
    ]
    state = _state(*history, card)
    report = await _manager(budget=1200).prepare(state)
    assert report.compactions, "expected a compaction"
    assert [c.id for _, c in state.pending_calls()] == ["call_card"]
    assert state.context[0].text == "取消订单 88235" or state.context[0].role is Role.USER
    assert _pairing_intact(state) and state.summary.startswith("【早前对话摘要】")
    done = report.compactions[0]
    assert done.messages_before == len(history) * 4 + 2
    assert done.messages_after == len(state.context) < done.messages_before


async def test_no_safe_cut_compacts_nothing() -> None:
    # One long turn: many tool cycles after a single user message.
    turn: list[Msg] = [Msg(Role.USER, [TextBlock("做很多事")], name="user")]
    for n in range(12):
        turn += _cycle(n, f"结果 {n} " * 40)[1:3]
    state = _state(turn)
    before = [m.id for m in state.context]
    report = await _manager(budget=1500, keep_cycles=0).prepare(state)
    assert report.compactions == []
    assert [m.id for m in state.context] == before and state.summary == ""


async def test_pending_call_in_an_early_turn_blocks_cutting_past_it() -> None:
    early_card = [
        Msg(Role.USER, [TextBlock("取消吧")], name="user"),
        Msg(Role.ASSISTANT, [ToolUseBlock("call_x", "cancel_order", {}, ToolUseState.ASKING)]),
    ]
    state = _state(early_card, *(_cycle(n, "x " * 300) for n in range(6)))
    report = await _manager(budget=1500).prepare(state)
    assert report.compactions == []  # every cut would drop the pending call
    assert [c.id for _, c in state.pending_calls()] == ["call_x"]


async def test_fit_for_save_refuses_what_cannot_fit() -> None:
    state = _state([Msg(Role.USER, [TextBlock("问" * 5000)], name="user")])
    with pytest.raises(LimitReached, match="over the 4096-byte limit"):
        await _manager(max_state_bytes=4096).fit_for_save(state)


async def test_fit_for_save_returns_the_payload_it_checked() -> None:
    state = _state(*(_cycle(n, f"结果 {n} " * 400) for n in range(8)))
    payload, _ = await _manager(max_state_bytes=20_000).fit_for_save(state)
    assert payload == state.encode() and len(payload) <= 20_000
    assert _trimmed(state) > 0 and _pairing_intact(state)
    small = _state(_cycle(1, "短"))
    assert (await _manager().fit_for_save(small)) == (small.encode(), [])


def test_real_tokenizer_is_offline_and_counts() -> None:
    counter = make_counter("auto", "gpt-4o-mini")
    assert isinstance(counter, BpeCounter) and counter.name == "o200k_base"
    assert counter.count("hello world") == 2
    assert make_counter("auto", "gpt-4").name == "cl100k_base"
    assert EstimatingCounter().count("你好") == 2


# ------------------------------------------------------------------- RAG history


def _rec(role: str, *texts: str, complete: bool = True, extra: Any = None) -> HistoryRecord:
    blocks: list[dict[str, Any]] = [{"type": "text", "text": t} for t in texts]
    if extra:
        blocks.insert(0, extra)
    return HistoryRecord(role, json.dumps(blocks, ensure_ascii=False).encode(), complete)


def test_rag_history_rules() -> None:
    records = [
        _rec("assistant", "欢迎！"),  # would start with the assistant: dropped
        _rec("user", "q1"),
        _rec("assistant", "a1[^1]", extra={"type": "thinking", "thinking": "hidden"}),
        _rec("user", "   "),  # empty: skipped
        _rec("user", "q2"),
        _rec("assistant", "a2 见【1】和[2]。"),
        _rec("assistant", "[1]"),  # empty after stripping citations: skipped
        _rec("user", "q3"),
        _rec("assistant", "partial", complete=False),  # still streaming: skipped
        _rec("user", "q4"),
        _rec("assistant", "a4", extra={"type": "tool_use", "id": "c", "name": "t", "input": {}}),
    ]
    full = rag_history(records, turns=8)
    assert [(m.role, m.text) for m in full] == [
        ("user", "q1"),
        ("assistant", "a1"),
        ("user", "q2"),
        ("assistant", "a2 见和。"),
        # q3's answer never completed: q3 is not history (asked again, it would
        # otherwise be there twice in a row).
        ("user", "q4"),
        ("assistant", "a4"),
    ]
    last_two = rag_history(records, turns=2)
    assert [m.text for m in last_two] == ["q2", "a2 见和。", "q4", "a4"]
    assert rag_history([_rec("assistant", "only me")], turns=8) == []
    assert strip_citations("结论[^12] 如下[3]【45】。") == "结论 如下。"


async def test_rag_history_rpc(stack: Stack, user_id: str) -> None:
    client = stack.agents[0][1]
    first = await client.chat(user_id, "我的订单88235现在什么状态？")
    conversation_id = first.meta.conversation_id
    await client.chat(user_id, "那88240呢？", conversation_id)
    response = await client.stub.GetRagHistory(
        pb.GetRagHistoryRequest(conversation_id=conversation_id, turns=1),
        metadata=metadata(user_id),
    )
    assert [m.role for m in response.messages] == ["user", "assistant"]
    assert response.messages[0].text == "那88240呢？"
    assert "88240" in response.messages[1].text
    everything = await client.stub.GetRagHistory(
        pb.GetRagHistoryRequest(conversation_id=conversation_id), metadata=metadata(user_id)
    )
    assert len(everything.messages) == 4
    # The paging rule of every list RPC: above the maximum is the maximum (50).
    capped = await client.stub.GetRagHistory(
        pb.GetRagHistoryRequest(conversation_id=conversation_id, turns=99),
        metadata=metadata(user_id),
    )
    assert capped.messages == everything.messages
    with pytest.raises(grpc.aio.AioRpcError) as bad:
        await client.stub.GetRagHistory(
            pb.GetRagHistoryRequest(conversation_id=conversation_id, turns=-1),
            metadata=metadata(user_id),
        )
    assert bad.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "turns must not be negative" in (bad.value.details() or "")
