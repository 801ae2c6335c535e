"""Tool arguments are validated with the tool's JSON Schema (Draft 2020-12, jsonschema).

Through the real tool path: a turn whose model calls a tool with arguments that break the
schema gets the error as the tool result (in the product's language, naming the argument
path), the model reads it, and the tool never runs.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest

from agentstate.agent.v1 import agent_service_pb2 as pb
from agentstate.agent_service.agent_state import Role, ToolResultBlock, ToolResultState
from agentstate.agent_service.model.base import (
    ChatModel,
    ModelEvent,
    ModelRequest,
    TextDelta,
    ToolCall,
    ToolSpec,
)
from agentstate.agent_service.tools.registry import (
    Tool,
    ToolContext,
    ToolOutput,
    ToolRegistry,
    check_arguments,
)
from tests.support.agent_harness import Stack

SHIP_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "orderNo": {"type": "string", "pattern": "^[0-9]{5}$"},
        "speed": {"enum": ["standard", "express"], "default": "standard"},
        "items": {
            "type": "array",
            "minItems": 1,
            "items": {
                "type": "object",
                "properties": {
                    "sku": {"type": "string"},
                    "qty": {"type": "integer", "minimum": 1},
                },
                "required": ["sku", "qty"],
                "additionalProperties": False,
            },
        },
        "address": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "zip": {"type": "string"}},
            "required": ["city"],
        },
    },
    "required": ["orderNo", "items"],
    "additionalProperties": False,
}
GOOD: dict[str, Any] = {"orderNo": "88235", "items": [{"sku": "watch", "qty": 1}]}


class CallAsAsked(ChatModel):
    """Calls the tool the user's JSON names with the arguments given, then repeats its result
    (so the test sees exactly what the model was told)."""

    name = "call-as-asked"

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
        asked = json.loads(request.context[last].text)
        yield ToolCall(f"call-{uuid.uuid4().hex}", asked["tool"], asked["arguments"])


@pytest.mark.parametrize(
    ("arguments", "expected"),
    [
        # enum
        ({**GOOD, "speed": "fast"}, '参数 speed 只能是 "standard"、"express" 之一，收到 "fast"'),
        # pattern
        ({**GOOD, "orderNo": "8823x"}, "参数 orderNo 的格式不对，应匹配正则 ^[0-9]{5}$"),
        # items: each element checked, the path names the element
        (
            {**GOOD, "items": [{"sku": "a", "qty": 1}, {"sku": "b", "qty": "2"}]},
            "参数 items[1].qty 应为整数",
        ),
        ({**GOOD, "items": [{"sku": "a", "qty": 0}]}, "参数 items[0].qty 不能小于 1，收到 0"),
        ({**GOOD, "items": []}, "参数 items 至少要有 1 项"),
        # nested objects
        ({**GOOD, "address": {"zip": "100000"}}, "缺少必填参数 address.city"),
        ({**GOOD, "address": {"city": 10}}, "参数 address.city 应为字符串，收到 10"),
        # required
        ({"items": GOOD["items"]}, "缺少必填参数 orderNo"),
        # additionalProperties, at the top and inside an array element
        ({**GOOD, "note": "快点"}, "不认识的参数 note"),
        (
            {**GOOD, "items": [{"sku": "a", "qty": 1, "color": "red"}]},
            "不认识的参数 items[0].color",
        ),
        # an integral float is not an integer (tools index and slice with these)
        ({**GOOD, "items": [{"sku": "a", "qty": 1.0}]}, "参数 items[0].qty 应为整数，收到 1.0"),
    ],
)
async def test_bad_arguments_reach_the_model_and_the_tool_never_runs(
    stack: Stack, user_id: str, arguments: dict[str, Any], expected: str
) -> None:
    ran: list[dict[str, Any]] = []

    async def ship(args: dict[str, Any], context: ToolContext) -> ToolOutput:
        ran.append(args)
        return ToolOutput(f"已发货 {args['orderNo']}（{args['speed']}）")

    client = await stack.start_agent(
        model=CallAsAsked(), extra_tools=[Tool(ToolSpec("ship", "发货", SHIP_SCHEMA), ship)]
    )
    question = json.dumps({"tool": "ship", "arguments": arguments}, ensure_ascii=False)
    turn = await client.chat(user_id, question)
    assert turn.code == grpc.StatusCode.OK, turn.details
    assert turn.kinds()[-2:] == ["finish", "done"]
    [block] = [b for b in turn.of("block") if b.status != pb.TOOL_CALL_STATUS_RUNNING]
    assert (block.tool_name, block.status) == ("ship", pb.TOOL_CALL_STATUS_FAILED)
    assert ran == [], "the tool ran with arguments its schema refuses"

    state, _ = await stack.reader.state(user_id, turn.meta.conversation_id)
    [result] = [b for m in state.context for b in m.content if isinstance(b, ToolResultBlock)]
    assert result.state is ToolResultState.ERROR
    assert result.text.startswith("参数错误：ship：")
    assert expected in result.text, result.text
    assert expected in turn.reply  # what the model read is what it answered from

    # The same tool with good arguments runs once, with the schema's default applied.
    fixed = json.dumps({"tool": "ship", "arguments": GOOD}, ensure_ascii=False)
    again = await client.chat(user_id, fixed, turn.meta.conversation_id)
    assert again.code == grpc.StatusCode.OK, again.details
    assert ran == [{**GOOD, "speed": "standard"}]
    assert "已发货 88235（standard）" in again.reply


def test_every_problem_is_named_in_one_result() -> None:
    spec = ToolSpec("ship", "发货", SHIP_SCHEMA)
    with pytest.raises(ValueError) as raised:
        check_arguments(spec, {"orderNo": 88235, "speed": "fast", "x": 1})
    message = str(raised.value)
    for problem in [
        "缺少必填参数 items",
        "参数 orderNo 应为字符串，收到 88235",
        "参数 speed 只能是",
        "不认识的参数 x",
    ]:
        assert problem in message, message


def test_a_tool_with_an_invalid_schema_is_refused_at_registration() -> None:
    async def run(args: dict[str, Any], context: ToolContext) -> ToolOutput:
        return ToolOutput("never")

    broken = Tool(
        ToolSpec("broken", "d", {"type": "object", "properties": {"n": {"type": "int"}}}), run
    )
    with pytest.raises(ValueError, match="tool 'broken': invalid parameters schema"):
        ToolRegistry([broken])
