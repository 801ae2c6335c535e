"""The graph: agent → approval (interrupt) → tools → agent, with a scripted model.

The model is the test's own, so the example runs without a network: it asks to cancel
order 88235 (the source's worked example), and after the tool's result it answers with
what happened. `cancel_order` needs approval: the `approval` node interrupts with a card;
a declined call gets a `denied` tool result and the tool never runs.
"""

from __future__ import annotations

import operator
from typing import Annotated, Any, Literal, TypedDict

from langchain_core.messages import AIMessage, AnyMessage, HumanMessage, ToolMessage
from langchain_core.tools import tool
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.graph import START, StateGraph
from langgraph.graph.message import add_messages
from langgraph.graph.state import CompiledStateGraph
from langgraph.prebuilt import ToolNode
from langgraph.types import interrupt

QUESTION = "我买的那块Apple Watch还没发货的话，帮我取消吧，不想要了。"
DENIED = "Permission denied by user"


@tool
def cancel_order(order_no: str) -> str:
    """Cancel an order that has not shipped yet."""
    return f"order {order_no} cancelled: stock restored, coupon returned, 3378.00 refunded"


class State(TypedDict):
    messages: Annotated[list[AnyMessage], add_messages]
    # Every tool that actually ran, so a test can prove a declined one never did.
    executed: Annotated[list[str], operator.add]


def agent(state: State) -> dict[str, Any]:
    """The scripted model: ask for the cancellation, then report its outcome."""
    last = state["messages"][-1]
    if isinstance(last, HumanMessage):
        call = {"name": "cancel_order", "args": {"order_no": "88235"}, "id": "call_cancel"}
        return {"messages": [AIMessage(content="", tool_calls=[call])]}
    assert isinstance(last, ToolMessage)
    if last.status == "error" or DENIED in str(last.content):
        text = "好的，没有取消：订单 88235 仍在待发货。"
    else:
        text = f"已取消：{last.content}"
    return {"messages": [AIMessage(content=text)]}


def approval(state: State) -> dict[str, Any]:
    """The confirmation card: pause until a human answers, in this or another process."""
    last = state["messages"][-1]
    assert isinstance(last, AIMessage)
    call = last.tool_calls[0]
    answer = interrupt({"card": "confirm_tool", "tool": call["name"], "args": call["args"]})
    if answer.get("approved"):
        return {}
    denied = ToolMessage(content=DENIED, tool_call_id=call["id"], name=call["name"], status="error")
    return {"messages": [denied]}


def run_tools(state: State) -> dict[str, Any]:
    result: dict[str, Any] = ToolNode([cancel_order]).invoke(state)
    return {**result, "executed": ["cancel_order"]}


def after_agent(state: State) -> Literal["approval", "__end__"]:
    last = state["messages"][-1]
    return "approval" if isinstance(last, AIMessage) and last.tool_calls else "__end__"


def after_approval(state: State) -> Literal["tools", "agent"]:
    return "agent" if isinstance(state["messages"][-1], ToolMessage) else "tools"


def build(checkpointer: BaseCheckpointSaver[Any]) -> CompiledStateGraph[Any, Any, Any, Any]:
    builder = StateGraph(State)
    builder.add_node("agent", agent)
    builder.add_node("approval", approval)
    builder.add_node("tools", run_tools)
    builder.add_edge(START, "agent")
    builder.add_conditional_edges("agent", after_agent)
    builder.add_conditional_edges("approval", after_approval)
    builder.add_edge("tools", "agent")
    return builder.compile(checkpointer=checkpointer)
