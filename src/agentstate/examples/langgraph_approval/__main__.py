"""`start` runs a thread to its approval card and exits; `resume` answers the card."""

from __future__ import annotations

import argparse
import json
from typing import Any

from langchain_core.messages import HumanMessage
from langgraph.types import Command

from agentstate.examples.langgraph_approval.graph import QUESTION, build
from agentstate.integrations.langgraph import AgentStateSaver


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m agentstate.examples.langgraph_approval")
    parser.add_argument("command", choices=["start", "resume"])
    parser.add_argument("--address", required=True, help="the state service, HOST:PORT")
    parser.add_argument("--thread", required=True, help="the LangGraph thread id")
    parser.add_argument("--approve", choices=["yes", "no"], default="no")
    args = parser.parse_args(argv)

    saver = AgentStateSaver(args.address)
    graph = build(saver)
    config: Any = {"configurable": {"thread_id": args.thread}}
    if args.command == "start":
        result = graph.invoke({"messages": [HumanMessage(QUESTION)], "executed": []}, config)
        card = result["__interrupt__"][0].value
        print(json.dumps({"card": card}, ensure_ascii=False))
    else:
        result = graph.invoke(Command(resume={"approved": args.approve == "yes"}), config)
        print(
            json.dumps(
                {"reply": result["messages"][-1].content, "executed": result["executed"]},
                ensure_ascii=False,
            )
        )
    saver.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
