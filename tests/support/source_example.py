"""The source's worked example as data: the 8-message AgentState stored after the
user pressed Cancel on the cancel_order card (see ../shared/BRIEF.md)."""

from __future__ import annotations

import json
from typing import Any

CONVERSATION_ID = "2104420977583996928"
QUESTION = "我买的那块Apple Watch还没发货的话，帮我取消吧，不想要了。"
HANDBOOK_STEP_3 = "取消前把这单会一起发生的事说清楚：库存回补、用掉的券退回、已支付的原路退款"
ORDERS_TEXT = (
    "【最近 5 笔订单】\n\n"
    "1. 订单 88240 | 已支付待发货 | 实付 129.00 | 下单 2026-09-20 09:12\n"
    "   商品: USB-C 充电线 ×2\n"
    "2. 订单 88239 | 已完成 | 实付 59.00 | 下单 2026-09-18 20:41\n"
    "   商品: 手机壳 ×1\n"
    "3. 订单 88237 | 已发货 | 实付 899.00 | 下单 2026-09-15 10:03\n"
    "   商品: AirPods 4 ×1\n"
    "4. 订单 88235 | 已支付待发货 | 实付 3378.00 | 下单 2026-09-13 14:56\n"
    "   商品: Apple Watch Series 12 深空灰色 42 毫米 铝金属 GPS ×1、运动表带 ×1\n"
    "5. 订单 88230 | 已完成 | 实付 45.00 | 下单 2026-09-02 18:30\n"
    "   商品: 屏幕贴膜 ×1"
)


def _msg(msg_id: str, role: str, content: list[dict[str, Any]], ts: str) -> dict[str, Any]:
    return {
        "id": msg_id,
        "name": "user" if role == "USER" else "RagentAI",
        "role": role,
        "content": content,
        "metadata": {},
        "usage": None if role != "ASSISTANT" else {"input_tokens": 1200, "output_tokens": 80},
        "timestamp": ts,
    }


def _tool_result(call_id: str, name: str, state: str, text: str) -> dict[str, Any]:
    return {
        "type": "tool_result",
        "id": call_id,
        "name": name,
        "state": state,
        "output": [{"type": "text", "text": text}],
    }


def source_agent_state() -> dict[str, Any]:
    """The whole AgentState (11 top-level fields) with its 8 context messages."""
    context = [
        _msg("m1", "USER", [{"type": "text", "text": QUESTION}], "2026-09-28 12:00:30.101"),
        _msg(
            "m2",
            "ASSISTANT",
            [
                {"type": "thinking", "thinking": "用户要取消订单，先加载订单变更手册。"},
                {"type": "text", "text": "我先看一下订单变更的处理规范。"},
                {
                    "type": "tool_use",
                    "id": "call_00_LoadSkill0001",
                    "name": "load_skill",
                    "input": {"name": "order-change"},
                    "state": "allowed",
                },
            ],
            "2026-09-28 12:00:31.250",
        ),
        _msg(
            "m3",
            "TOOL",
            [
                _tool_result(
                    "call_00_LoadSkill0001",
                    "load_skill",
                    "success",
                    f"# 订单变更手册\n1. 先查订单\n2. 只有待发货的订单能取消\n3. {HANDBOOK_STEP_3}",
                )
            ],
            "2026-09-28 12:00:31.300",
        ),
        _msg(
            "m4",
            "ASSISTANT",
            [
                {"type": "thinking", "thinking": "查最近5笔订单，找Apple Watch。"},
                {
                    "type": "tool_use",
                    "id": "call_00_Pn5XSbxzGg78PDQZTSmS2548",
                    "name": "query_order",
                    "input": {"limit": 5},
                    "state": "allowed",
                },
            ],
            "2026-09-28 12:00:34.900",
        ),
        {
            "id": "b16e63c2-911b-4233-95cd-8b423eab5079",
            "name": "RagentAI",
            "role": "TOOL",
            "content": [
                _tool_result(
                    "call_00_Pn5XSbxzGg78PDQZTSmS2548", "query_order", "success", ORDERS_TEXT
                )
            ],
            "metadata": {},
            "usage": None,
            "timestamp": "2026-09-28 12:00:35.842",
        },
        _msg(
            "m6",
            "ASSISTANT",
            [
                {"type": "thinking", "thinking": "88235 已支付待发货，可以取消，需要用户确认。"},
                {"type": "text", "text": "找到了订单88235，还没发货，我来帮你取消。"},
                {
                    "type": "tool_use",
                    "id": "call_00_CancelOrder0003",
                    "name": "cancel_order",
                    "input": {"orderNo": "88235"},
                    "state": "asking",
                },
            ],
            "2026-09-28 12:00:38.120",
        ),
        _msg(
            "m7",
            "TOOL",
            [
                _tool_result(
                    "call_00_CancelOrder0003", "cancel_order", "denied", "Permission denied by user"
                )
            ],
            "2026-09-28 12:01:02.004",
        ),
        _msg(
            "m8",
            "ASSISTANT",
            [
                {"type": "thinking", "thinking": "用户在确认卡上点了取消，如实说明。"},
                {
                    "type": "text",
                    "text": (
                        "这次取消没有执行——你在确认卡片上点了「取消」，所以我停下来了，"
                        "订单88235目前还是已支付待发货状态。"
                    ),
                },
            ],
            "2026-09-28 12:01:05.777",
        ),
    ]
    return {
        "session_id": CONVERSATION_ID,
        "user_id": "admin",
        "context": context,
        "summary": "",
        "reply_id": "r-2104420992494747648",
        "cur_iter": 0,
        "shutdown_interrupted": False,
        "permission_context": {
            "mode": "default",
            "allow_rules": [],
            "ask_rules": [],
            "deny_rules": [],
        },
        "tool_context": {
            "activated_groups": [],
            "sub_agents": {},
            "read_cache": {"enabled": True, "max_entries": 64},
        },
        "tasks_context": {"tasks": []},
        "plan_mode_context": {"enabled": False, "plan": None},
    }


def source_state_bytes() -> bytes:
    return json.dumps(source_agent_state(), ensure_ascii=False).encode()
