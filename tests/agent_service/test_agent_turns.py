"""Agent service behaviour: cards settle once, replicas and restarts, failures, limits, Stop."""

from __future__ import annotations

import asyncio
import json
from decimal import Decimal
from typing import Any

import grpc
import pytest

from agentstate.agent.v1 import agent_service_pb2 as pb
from agentstate.agent_service import server as server_module
from agentstate.agent_service.agent_state import PERMISSION_DENIED_TEXT, ToolResultBlock
from agentstate.agent_service.client_state_port import ClientStatePort
from agentstate.agent_service.middleware import DENIAL_REWRITE_TEXT
from agentstate.agent_service.model.base import ToolSpec
from agentstate.agent_service.tools.registry import Permission, Tool, ToolContext, ToolOutput
from agentstate.state.v1 import state_service_pb2 as spb
from tests.support.agent_harness import RecordingModel, Stack, collect, metadata
from tests.support.source_example import QUESTION

FAILED_PRECONDITION = grpc.StatusCode.FAILED_PRECONDITION


async def _card(stack: Stack, user_id: str) -> tuple[str, str]:
    first = await stack.agents[0][1].chat(user_id, QUESTION)
    assert first.code == grpc.StatusCode.OK, first.details
    return first.meta.conversation_id, first.card.message_id


async def test_concurrent_confirms_run_the_tool_once(stack: Stack, user_id: str) -> None:
    conversation_id, card_id = await _card(stack, user_id)
    client = stack.agents[0][1]
    results = await asyncio.gather(
        client.confirm(user_id, conversation_id, card_id, approved=True),
        client.confirm(user_id, conversation_id, card_id, approved=True),
    )
    ok = [t for t in results if t.code == grpc.StatusCode.OK]
    refused = [t for t in results if t.code != grpc.StatusCode.OK]
    assert len(ok) == 1 and len(refused) == 1
    assert refused[0].code == FAILED_PRECONDITION
    assert refused[0].events == []  # refused before the stream started
    retry = await client.confirm(user_id, conversation_id, card_id, approved=True)
    assert retry.code == FAILED_PRECONDITION and "already handled" in retry.details
    denied_late = await client.confirm(user_id, conversation_id, card_id, approved=False)
    assert denied_late.code == FAILED_PRECONDITION
    assert await stack.orders.refunds(user_id, "88235") == [Decimal("3378.00")]
    state, _ = await stack.reader.state(user_id, conversation_id)
    results_for_call = [
        b for m in state.context for b in m.content if isinstance(b, ToolResultBlock)
    ]
    assert [r.name for r in results_for_call].count("cancel_order") == 1


async def test_restart_and_another_replica_answer_the_card(stack: Stack, user_id: str) -> None:
    conversation_id, card_id = await _card(stack, user_id)
    # The replica that showed the card goes away; a new one starts.
    await stack.stop_agent(stack.agents[0][1])
    restarted = await stack.start_agent()
    other_user = f"{user_id}-b"
    other_conversation = (await restarted.chat(other_user, QUESTION)).meta.conversation_id
    other_card = (await stack.reader.records(other_user, other_conversation))[1].message_id
    second_replica = await stack.start_agent(replica_name="replica-2")

    # The restarted replica answers the first card from the stored state alone.
    turn = await restarted.confirm(user_id, conversation_id, card_id, approved=False)
    assert turn.code == grpc.StatusCode.OK, turn.details
    assert "订单88235目前还是已支付待发货状态" in turn.reply
    # A different replica answers a card another replica showed.
    turn = await second_replica.confirm(other_user, other_conversation, other_card, approved=True)
    assert turn.code == grpc.StatusCode.OK, turn.details
    assert "已经帮你取消了" in turn.reply
    assert await stack.orders.refunds(other_user, "88235") == [Decimal("3378.00")]


async def test_state_service_down_then_back(stack: Stack, user_id: str) -> None:
    client = stack.agents[0][1]
    first = await client.chat(user_id, "我的订单88235现在什么状态？")
    conversation_id = first.meta.conversation_id
    before, version = await stack.reader.state(user_id, conversation_id)
    await stack.stop_state()
    turn = await client.chat(user_id, "那88240呢？", conversation_id)
    assert turn.code == grpc.StatusCode.UNAVAILABLE, turn.details
    assert "state service unavailable" in turn.details
    # The state service's address is for operators: ErrorInfo, not the message.
    port = stack.state_address.rsplit(":", 1)[1]
    assert port not in turn.details
    assert port in turn.error_info.metadata["detail"]
    assert turn.events == []
    await stack.start_state()
    after, version_after = await stack.reader.state(user_id, conversation_id)
    assert version_after == version and after.to_json() == before.to_json()
    for _ in range(50):  # the client retries while the channel reconnects
        turn = await client.chat(user_id, "那88240呢？", conversation_id)
        if turn.code != grpc.StatusCode.UNAVAILABLE:
            break
        await asyncio.sleep(0.1)
    assert turn.code == grpc.StatusCode.OK, turn.details
    assert "88240" in turn.reply
    state, _ = await stack.reader.state(user_id, conversation_id)
    assert [m.text for m in state.context if m.role.value == "USER"] == [
        "我的订单88235现在什么状态？",
        "那88240呢？",
    ]


async def test_denial_rewrite_reaches_the_model_and_is_not_stored(
    stack: Stack, user_id: str
) -> None:
    model = RecordingModel()
    client = await stack.start_agent(model=model)
    first = await client.chat(user_id, QUESTION)
    conversation_id = first.meta.conversation_id
    await client.confirm(user_id, conversation_id, first.card.message_id, approved=False)
    seen = [
        b.text
        for m in model.requests[-1].context
        for b in m.content
        if isinstance(b, ToolResultBlock) and b.name == "cancel_order"
    ]
    assert seen == [DENIAL_REWRITE_TEXT]
    state, _ = await stack.reader.state(user_id, conversation_id)
    stored = [
        b.text
        for m in state.context
        for b in m.content
        if isinstance(b, ToolResultBlock) and b.name == "cancel_order"
    ]
    assert stored == [PERMISSION_DENIED_TEXT]
    # The confirmation message itself never reached the model context.
    assert all(m.text or m.content for m in model.requests[-1].context)


async def test_without_the_rewrite_the_model_blames_permissions(stack: Stack, user_id: str) -> None:
    """Why the middleware exists: the raw stored text reads like missing rights."""
    raw = await stack.start_agent(middlewares=())
    first = await raw.chat(user_id, QUESTION)
    turn = await raw.confirm(user_id, first.meta.conversation_id, first.card.message_id, False)
    assert "没有权限" in turn.reply


async def test_new_question_while_card_pending_is_refused(stack: Stack, user_id: str) -> None:
    conversation_id, card_id = await _card(stack, user_id)
    before, version = await stack.reader.state(user_id, conversation_id)
    turn = await stack.agents[0][1].chat(user_id, "算了，查一下别的", conversation_id)
    assert turn.code == FAILED_PRECONDITION
    assert f"confirmation card {card_id} is still pending" in turn.details
    after, version_after = await stack.reader.state(user_id, conversation_id)
    assert version_after == version and after.to_json() == before.to_json()


async def test_expired_card(database_url: str, orders_database_url: str, user_id: str) -> None:
    stack = Stack(database_url, orders_database_url, card_ttl_seconds=0.3)
    await stack.start_state()
    client = await stack.start_agent()
    try:
        first = await client.chat(user_id, QUESTION)
        conversation_id, card_id = first.meta.conversation_id, first.card.message_id
        await asyncio.sleep(0.5)
        turn = await client.confirm(user_id, conversation_id, card_id, approved=True)
        assert turn.code == FAILED_PRECONDITION and "expired" in turn.details
        state, _ = await stack.reader.state(user_id, conversation_id)
        assert not state.pending_calls()
        last = state.context[-1].content[0]
        assert isinstance(last, ToolResultBlock) and last.state.value == "interrupted"
        records = await stack.reader.records(user_id, conversation_id)
        assert records[1].status == spb.MESSAGE_STATUS_NORMAL
        # The card's record says what became of each call (issue 14).
        outcomes = [
            (b["name"], b.get("outcome"))
            for b in json.loads(records[1].blocks_json)
            if b["type"] == "tool_use"
        ]
        assert outcomes == [
            ("load_skill", "finished"),
            ("query_order", "finished"),
            ("cancel_order", "expired"),
        ]
        # Nothing ran, and the conversation is free again.
        assert await stack.orders.refunds(user_id, "88235") == []
        again = await client.chat(user_id, "我的订单88235现在什么状态？", conversation_id)
        assert again.code == grpc.StatusCode.OK, again.details
        assert "已支付待发货" in again.reply
    finally:
        await stack.close()


async def test_card_and_conversation_scoping(stack: Stack, user_id: str) -> None:
    conversation_id, card_id = await _card(stack, user_id)
    client = stack.agents[0][1]
    stranger = await client.confirm(f"{user_id}-x", conversation_id, card_id, approved=True)
    assert stranger.code == grpc.StatusCode.NOT_FOUND
    wrong_card = await client.confirm(user_id, conversation_id, "12345", approved=True)
    assert wrong_card.code == grpc.StatusCode.NOT_FOUND
    no_user = await collect(
        client.stub.Chat(pb.ChatRequest(question="hi"))  # no identity metadata
    )
    assert no_user.code == grpc.StatusCode.UNAUTHENTICATED
    assert "agentstate-user-id" in no_user.details
    empty = await client.chat(user_id, "   ")
    assert empty.code == grpc.StatusCode.INVALID_ARGUMENT
    bad_id = await client.chat(user_id, "hi", "not-an-id")
    assert bad_id.code == grpc.StatusCode.INVALID_ARGUMENT
    assert await stack.orders.refunds(user_id, "88235") == []


async def test_one_turn_at_a_time_and_per_user_limit(
    database_url: str, orders_database_url: str, user_id: str
) -> None:
    stack = Stack(database_url, orders_database_url, max_turns_per_user=2)
    await stack.start_state()
    slow = await stack.start_agent(model=RecordingModel(delay=0.6))
    try:
        conversations = [
            (await slow.chat(user_id, f"订单88240什么状态？{i}")).meta.conversation_id
            for i in range(3)
        ]
        same = await asyncio.gather(
            slow.chat(user_id, "再查一次88240", conversations[0]),
            slow.chat(user_id, "再查一次88239", conversations[0]),
        )
        codes = sorted(t.code.name for t in same)
        assert codes == ["FAILED_PRECONDITION", "OK"]
        refused = next(t for t in same if t.code != grpc.StatusCode.OK)
        assert "has a running turn" in refused.details
        many = await asyncio.gather(
            *(slow.chat(user_id, "再查一次88240", cid) for cid in conversations)
        )
        assert sorted(t.code.name for t in many) == ["OK", "OK", "RESOURCE_EXHAUSTED"]
        # At the limit, a new conversation is refused and leaves nothing behind.
        running = [
            slow.stub.Chat(
                pb.ChatRequest(conversation_id=cid, question="再查一次88240"),
                metadata=metadata(user_id),
            )
            for cid in conversations[:2]
        ]
        for call in running:
            assert (await call.read()).event.HasField("meta")
        refused = await slow.chat(user_id, "新的问题")
        assert refused.code == grpc.StatusCode.RESOURCE_EXHAUSTED, refused.details
        for call in running:
            assert (await collect(call)).code == grpc.StatusCode.OK
        listed = await slow.stub.ListConversations(
            pb.ListConversationsRequest(), metadata=metadata(user_id)
        )
        assert len(listed.conversations) == 3
    finally:
        await stack.close()


async def test_stop_from_another_replica(
    database_url: str, orders_database_url: str, user_id: str
) -> None:
    stack = Stack(database_url, orders_database_url)
    await stack.start_state()
    slow = await stack.start_agent(model=RecordingModel(delay=1.0))
    other = await stack.start_agent(replica_name="replica-2")
    try:
        call = slow.stub.Chat(
            pb.ChatRequest(question="我的订单88235现在什么状态？"), metadata=metadata(user_id)
        )
        first = await call.read()
        task_id = first.event.meta.task_id
        conversation_id = first.event.meta.conversation_id
        stopped = await other.stub.Stop(pb.StopRequest(task_id=task_id), metadata=metadata(user_id))
        assert stopped.conversation_id == conversation_id
        rest = await collect(call)
        assert rest.code == grpc.StatusCode.OK, rest.details
        assert rest.kinds()[-2:] == ["cancel", "done"]
        assert rest.of("cancel")[0].reason == "stopped by the user"
        records = await stack.reader.records(user_id, conversation_id)
        assert records[-1].status == spb.MESSAGE_STATUS_INTERRUPTED
        state, _ = await stack.reader.state(user_id, conversation_id)
        assert not state.shutdown_interrupted
        assert state.context[-1].text == "我的订单88235现在什么状态？"
        unknown = await collect_stop(other, user_id, task_id)
        assert unknown == grpc.StatusCode.NOT_FOUND
        # The conversation is free again.
        again = await other.chat(user_id, "我的订单88235现在什么状态？", conversation_id)
        assert again.code == grpc.StatusCode.OK, again.details
    finally:
        await stack.close()


async def collect_stop(client: object, user_id: str, task_id: str) -> grpc.StatusCode:
    try:
        await client.stub.Stop(  # type: ignore[attr-defined]
            pb.StopRequest(task_id=task_id), metadata=metadata(user_id)
        )
    except grpc.aio.AioRpcError as exc:
        return exc.code()
    return grpc.StatusCode.OK


async def test_conversation_management_delegates(stack: Stack, user_id: str) -> None:
    client = stack.agents[0][1]
    conversation_id, _ = await _card(stack, user_id)
    listed = await client.stub.ListConversations(
        pb.ListConversationsRequest(), metadata=metadata(user_id)
    )
    assert [c.conversation_id for c in listed.conversations] == [conversation_id]
    assert listed.conversations[0].title.startswith("我买的那块Apple Watch")
    renamed = await client.stub.RenameConversation(
        pb.RenameConversationRequest(conversation_id=conversation_id, title="Apple Watch"),
        metadata=metadata(user_id),
    )
    assert renamed.conversation.title == "Apple Watch"
    messages = await client.stub.ListMessages(
        pb.ListMessagesRequest(conversation_id=conversation_id), metadata=metadata(user_id)
    )
    assert len(messages.messages) == 2
    deleted = await client.stub.DeleteConversation(
        pb.DeleteConversationRequest(conversation_id=conversation_id), metadata=metadata(user_id)
    )
    assert deleted.messages_deleted == 2
    listed = await client.stub.ListConversations(
        pb.ListConversationsRequest(), metadata=metadata(user_id)
    )
    assert list(listed.conversations) == []


async def test_shutdown_during_an_approved_call_keeps_the_card_answerable(
    database_url: str, orders_database_url: str, user_id: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A hard interruption in the middle of an approved call: nothing is lost or half-settled."""
    runs: list[str] = []
    started = asyncio.Event()
    release = asyncio.Event()

    async def slow_refund(args: dict[str, Any], context: ToolContext) -> ToolOutput:
        runs.append(context.idempotency_key)
        started.set()
        if len(runs) == 1:
            await asyncio.sleep(60)  # the first attempt hangs until it is cancelled
        release.set()
        return ToolOutput("退款已登记。")

    tool = Tool(
        spec=ToolSpec("refund", "登记一笔退款", {"type": "object", "properties": {}}),
        run=slow_refund,
        permission=Permission.ASK,
    )
    monkeypatch.setattr(server_module, "_INTERRUPT_SAVE_SECONDS", 0.3)
    stack = Stack(database_url, orders_database_url, shutdown_grace_seconds=0.2)
    await stack.start_state()
    first_replica = await stack.start_agent(extra_tools=[tool])
    try:
        card = await first_replica.chat(user_id, "/refund {}")
        conversation_id, card_id = card.meta.conversation_id, card.card.message_id
        confirm = first_replica.stub.Confirm(
            pb.ConfirmRequest(conversation_id=conversation_id, message_id=card_id, approved=True),
            metadata=metadata(user_id),
        )
        await asyncio.wait_for(started.wait(), 10)
        await stack.stop_agent(first_replica)  # grace passes, the stuck call is cancelled
        del confirm
        state, _ = await stack.reader.state(user_id, conversation_id)
        assert state.shutdown_interrupted
        assert [c.name for _, c in state.pending_calls()] == ["refund"]
        records = await stack.reader.records(user_id, conversation_id)
        assert records[1].status == spb.MESSAGE_STATUS_AWAITING_CONFIRM  # still answerable

        second_replica = await stack.start_agent(extra_tools=[tool])
        again = await second_replica.confirm(user_id, conversation_id, card_id, approved=True)
        assert again.code == grpc.StatusCode.OK, again.details
        assert release.is_set() and runs == [runs[0], runs[0]]  # the same stored call: the same key
        state, _ = await stack.reader.state(user_id, conversation_id)
        assert not state.pending_calls() and not state.shutdown_interrupted
    finally:
        await stack.close()


async def test_a_client_may_answer_the_card_the_moment_it_sees_it(
    stack: Stack, user_id: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The lease is released before the last events go out, so no race with the next turn."""
    release = ClientStatePort.release_lease

    async def slow_release(self: ClientStatePort, user_id: str, task_id: str) -> bool:
        await asyncio.sleep(0.3)  # a slow network makes any race certain
        return await release(self, user_id, task_id)

    monkeypatch.setattr(ClientStatePort, "release_lease", slow_release)
    client = stack.agents[0][1]
    for _ in range(2):
        call = client.stub.Chat(pb.ChatRequest(question=QUESTION), metadata=metadata(user_id))
        conversation_id = card_id = ""
        while not card_id:
            event = (await call.read()).event
            if event.HasField("meta"):
                conversation_id = event.meta.conversation_id
            if event.HasField("confirm"):
                card_id = event.confirm.message_id
        # Answer at once, before the first stream has even ended.
        turn = await client.confirm(user_id, conversation_id, card_id, approved=False)
        assert turn.code == grpc.StatusCode.OK, turn.details
        assert (await collect(call)).code == grpc.StatusCode.OK
