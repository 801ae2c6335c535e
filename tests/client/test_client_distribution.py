"""agentstate-client installs on its own: `pip install 'agentstate-client[langgraph]'` built
from this checkout into a new virtual environment brings the client, the stubs and LangGraph,
and none of the servers' dependencies; a LangGraph graph on the saver then runs there
against a real state service process (both the sync and the async half)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
import venv
from pathlib import Path

import pytest

from tests.support.paths import REPO

# What only the servers need: none of it may arrive with the client.
SERVER_ONLY = ["psycopg", "psycopg-binary", "psycopg-pool", "openai", "PyJWT", "jsonschema"]

GRAPH = """
import asyncio, json, sys
from importlib import metadata
from typing import TypedDict

from langgraph.graph import END, START, StateGraph

from agentstate.integrations.langgraph import AgentStateSaver


class Count(TypedDict):
    n: int


builder = StateGraph(Count)
builder.add_node("step", lambda state: {"n": state["n"] + 1})
builder.add_edge(START, "step")
builder.add_edge("step", END)

saver = AgentStateSaver(sys.argv[1], user_id=sys.argv[2])
graph = builder.compile(checkpointer=saver)
sync_thread = {"configurable": {"thread_id": "sync"}}
async_thread = {"configurable": {"thread_id": "async"}}
first = graph.invoke({"n": 1}, sync_thread)
again = graph.invoke({"n": first["n"]}, sync_thread)


async def arun() -> int:
    done = await graph.ainvoke({"n": 10}, async_thread)
    await saver.aclose()
    return done["n"]


print(json.dumps({
    "sync": again["n"],
    "history": len(list(saver.list(sync_thread))),
    "async": asyncio.run(arun()),
    "installed": sorted(d.metadata["Name"].lower() for d in metadata.distributions()),
    "modules": sorted(sys.modules),
}))
"""


@pytest.mark.timeout(600)
def test_the_client_with_its_langgraph_extra_installs_alone(
    tmp_path: Path, state_process_address: str, user_id: str
) -> None:
    started = time.monotonic()
    # A copy, so that building the wheel writes nothing into the checkout.
    source = tmp_path / "agentstate-client"
    shutil.copytree(
        REPO / "client",
        source,
        ignore=shutil.ignore_patterns("__pycache__", "*.egg-info", "build"),
    )
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=True)
    python = env_dir / "bin" / "python"
    # pip's own cache (not disabled) keeps this to the download-free path after the first run.
    pip = subprocess.run(
        [
            str(python),
            "-m",
            "pip",
            "install",
            "--quiet",
            "--disable-pip-version-check",
            f"{source}[langgraph]",
        ],
        capture_output=True,
        text=True,
        timeout=540,
    )
    assert pip.returncode == 0, pip.stderr[-4000:]
    installed_after = time.monotonic() - started

    done = subprocess.run(
        [str(python), "-c", GRAPH, state_process_address, user_id],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,  # not the checkout: nothing of it is importable from there
    )
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    installed = set(result["installed"])
    assert {"agentstate-client", "langgraph", "grpcio", "protobuf", "grpcio-status"} <= installed
    assert not installed & {name.lower() for name in SERVER_ONLY}, sorted(installed)
    assert "agentstate" not in installed  # the servers' distribution
    assert not [
        m
        for m in result["modules"]
        if m.startswith(("agentstate.common", "agentstate.state_service"))
    ]
    # The graph ran on the state service: two sync runs on one thread, one async run.
    assert (result["sync"], result["async"]) == (3, 11)
    assert result["history"] >= 4  # input and loop checkpoints of both runs
    print(
        f"clean venv: install {installed_after:.1f} s, "
        f"total {time.monotonic() - started:.1f} s ({sys.version.split()[0]})"
    )
