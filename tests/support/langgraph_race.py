"""One of two processes racing one LangGraph thread (tests/integrations/test_langgraph.py).

    python -m tests.support.langgraph_race ADDRESS THREAD_ID READY_FILE GO_FILE

Runs a one-node graph on the thread through AgentStateSaver. The node writes READY_FILE
and waits for GO_FILE, so the test can hold this run mid-step (as a paused or slow replica
would be) while another process runs the same thread. Prints one JSON line: what the run
ended with ("ok", or the error's type).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any, TypedDict

from langgraph.graph import START, StateGraph

from agentstate.integrations.langgraph import AgentStateSaver


class State(TypedDict):
    steps: list[str]


def main(address: str, thread_id: str, ready: str, go: str) -> int:
    def work(state: State) -> dict[str, Any]:
        Path(ready).touch()
        while not Path(go).exists():
            time.sleep(0.02)
        return {"steps": [*state.get("steps", []), f"pid {__import__('os').getpid()}"]}

    builder = StateGraph(State)
    builder.add_node("work", work)
    builder.add_edge(START, "work")
    saver = AgentStateSaver(address)
    graph = builder.compile(checkpointer=saver)
    try:
        graph.invoke({"steps": []}, {"configurable": {"thread_id": thread_id}})
        outcome: dict[str, Any] = {"outcome": "ok"}
    except Exception as exc:  # the test reads which error the refused writer saw
        outcome = {
            "outcome": type(exc).__name__,
            "stale_writer": getattr(exc, "is_stale_write_owner_error", False),
            "message": str(exc),
        }
    print(json.dumps(outcome), flush=True)
    saver.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main(*sys.argv[1:5]))
