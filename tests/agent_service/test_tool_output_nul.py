"""A tool output holding U+0000 (NUL) never fails a turn (issue 22, item 1).

The rule: the agent state keeps the output exactly (the state service stores it as the
JSON escape \\u0000, as every other payload), so the model reads what the tool returned,
now and after a restart. The message records (what the user saw, replayed by a UI) show
each NUL as U+FFFD: the records are the UI's text, not the model's context, and their
store refuses U+0000 as before. Through the real agent service, state service and
PostgreSQL.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator
from typing import Any

import grpc

from agentstate.agent_service.agent_state import Role, ToolResultBlock
from agentstate.agent_service.model.base import (
    ChatModel,
    ModelEvent,
    ModelRequest,
    TextDelta,
    ToolCall,
    ToolSpec,
)
from agentstate.agent_service.tools.registry import Tool, ToolContext, ToolOutput
from tests.support.agent_harness import Stack

OUTPUT = "库存回补\x00 done \x00\x00 😀"


class EchoTool(ChatModel):
    """Calls the tool once, then answers with the tool's result (NULs included)."""

    name = "echo-tool"

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelEvent]:
        last = max(i for i, m in enumerate(request.context) if m.role is Role.USER and m.text)
        results = [
            block
            for msg in request.context[last:]
            for block in msg.content
            if isinstance(block, ToolResultBlock)
        ]
        if results:
            yield TextDelta(f"工具结果：{results[-1].text}")
            return
        yield ToolCall(f"call-{uuid.uuid4().hex}", "leak", {})


async def test_a_tool_output_with_nul_does_not_fail_the_turn(stack: Stack, user_id: str) -> None:
    async def leak(args: dict[str, Any], context: ToolContext) -> ToolOutput:
        return ToolOutput(OUTPUT)

    client = await stack.start_agent(
        model=EchoTool(),
        extra_tools=[Tool(ToolSpec("leak", "returns NUL", {"type": "object"}), leak)],
    )
    turn = await client.chat(user_id, "run the tool")
    assert turn.code == grpc.StatusCode.OK, turn.details
    assert turn.kinds()[-2:] == ["finish", "done"]
    # The model read the output exactly, and the state keeps it exactly.
    assert turn.reply == f"工具结果：{OUTPUT}"
    state, _ = await stack.reader.state(user_id, turn.meta.conversation_id)
    [result] = [b for m in state.context for b in m.content if isinstance(b, ToolResultBlock)]
    assert result.text == OUTPUT
    # The records (the UI's replay) show each NUL as U+FFFD.
    records = await stack.reader.records(user_id, turn.meta.conversation_id)
    shown = b"".join(r.blocks_json for r in records).decode()
    assert "\\u0000" not in shown and "\x00" not in shown
    assert json.dumps(OUTPUT.replace("\x00", "\ufffd"), ensure_ascii=False)[1:-1] in shown
    # The next turn loads the state (NULs and all) and runs.
    again = await client.chat(user_id, "again", turn.meta.conversation_id)
    assert again.code == grpc.StatusCode.OK, again.details
    state, _ = await stack.reader.state(user_id, turn.meta.conversation_id)
    texts = [b.text for m in state.context for b in m.content if isinstance(b, ToolResultBlock)]
    assert texts == [OUTPUT, OUTPUT]
