"""One of two processes invoking a LangGraph graph on one thread (test_langgraph_races.py).

    python -m tests.support.langgraph_invokes ADDRESS THREAD_ID NAME COUNT GO_FILE

Waits for GO_FILE, then makes COUNT invokes, each adding one human message and its reply.
An invoke the saver refuses (CheckpointConflict) is tried again with a new message, so
every attempt's input is unique. Prints one JSON line: the inputs of the acknowledged
invokes and of the refused attempts, in order.
"""

from __future__ import annotations

import json
import random
import sys
import time
from pathlib import Path
from typing import Annotated, Any, TypedDict

from langchain_core.messages import AIMessage, AnyMessage, HumanMessage
from langgraph.graph import START, StateGraph
from langgraph.graph.message import add_messages

from agentstate.integrations.langgraph import AgentStateSaver, CheckpointConflict


class State(TypedDict):
    messages: Annotated[list[AnyMessage], add_messages]


def reply(state: State) -> dict[str, Any]:
    time.sleep(random.random() * 0.005)  # a model call, shortened
    return {"messages": [AIMessage(f"reply to {state['messages'][-1].content}")]}


def main(address: str, thread_id: str, name: str, count: str, go: str) -> int:
    builder = StateGraph(State)
    builder.add_node("reply", reply)
    builder.add_edge(START, "reply")
    acknowledged: list[str] = []
    refused: list[str] = []
    with AgentStateSaver(address) as saver:
        graph = builder.compile(checkpointer=saver)
        while not Path(go).exists():
            time.sleep(0.01)
        attempt = 0
        while len(acknowledged) < int(count):
            attempt += 1
            text = f"{name}-{len(acknowledged)}-attempt-{attempt}"
            try:
                graph.invoke(
                    {"messages": [HumanMessage(text)]}, {"configurable": {"thread_id": thread_id}}
                )
            except CheckpointConflict:
                refused.append(text)
                time.sleep(random.random() * 0.02)
                continue
            acknowledged.append(text)
    print(json.dumps({"acknowledged": acknowledged, "refused": refused}), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(*sys.argv[1:6]))
