"""LangGraph on the state service (issue 15), as LangGraph's users would use it.

Everything runs against a state service in its own process on the test run's PostgreSQL:
LangGraph's own conformance suite (langgraph-checkpoint-conformance, unchanged), two
processes racing one thread, a graph interrupted for human approval in one process and
resumed from another, bad input, and deletion.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import grpc
import pytest
from langchain_core.messages import HumanMessage, ToolMessage
from langgraph.checkpoint.base import copy_checkpoint
from langgraph.checkpoint.base.id import uuid6
from langgraph.checkpoint.conformance import checkpointer_test, validate
from langgraph.checkpoint.conformance.capabilities import (
    BASE_CAPABILITIES,
    EXTENDED_CAPABILITIES,
)
from langgraph.checkpoint.conformance.report import ProgressCallbacks
from langgraph.types import Command

from agentstate.examples.langgraph_approval.graph import DENIED, QUESTION, build
from agentstate.integrations.langgraph import AgentStateSaver, CheckpointConflict, ThreadDeleted
from agentstate.integrations.langgraph.saver_base import (
    WRITES_WAIT_AFTER_FAILED_PUT_SECONDS,
    WRITES_WAIT_SECONDS,
)
from agentstate.state.v1 import state_service_pb2 as pb
from agentstate.state.v1 import state_service_pb2_grpc as pb_grpc
from tests.support import paths

ROOT = paths.REPO
# langgraph-checkpoint-conformance 0.0.2: 17 put, 10 put_writes, 10 get_tuple, 16 list,
# 5 delete_thread (the 5 base capabilities), 7 delete_for_runs, 8 copy_thread, 8 prune.
CONFORMANCE_TESTS = 81


def config(thread_id: str, **extra: Any) -> Any:
    return {"configurable": {"thread_id": thread_id, **extra}}


def run_example(address: str, *args: str) -> dict[str, Any]:
    """One process of the example: it runs, prints one JSON line and exits."""
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "agentstate.examples.langgraph_approval",
            *args,
            "--address",
            address,
        ],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


async def conversation_gone(address: str, user_id: str, conversation_id: str) -> bool:
    async with grpc.aio.insecure_channel(address) as channel:
        stub = pb_grpc.StateServiceStub(channel)
        try:
            await stub.GetConversation(
                pb.GetConversationRequest(user_id=user_id, conversation_id=conversation_id)
            )
        except grpc.aio.AioRpcError as exc:
            return exc.code() == grpc.StatusCode.NOT_FOUND
    return False


async def test_conformance_suite_passes_every_base_and_extended_capability(
    state_process_address: str,
) -> None:
    @checkpointer_test(name="AgentStateSaver")
    async def saver_factory() -> Any:
        saver = AgentStateSaver(state_process_address, user_id=f"conformance-{uuid.uuid4()}")
        yield saver
        await saver.aclose()

    outcomes: list[tuple[str, str, bool, str | None]] = []
    report = await validate(
        saver_factory,
        progress=ProgressCallbacks(on_test_result=lambda *result: outcomes.append(result)),
    )
    report.print_report()
    failures = [f"{cap}.{name}: {error}" for cap, name, ok, error in outcomes if not ok]
    assert not failures, "\n".join(failures)
    every = {c.value for c in BASE_CAPABILITIES | EXTENDED_CAPABILITIES}
    assert set(report.results) == every
    for name, result in report.results.items():
        assert result.detected, f"{name} not detected"
        assert result.passed is True, f"{name}: {result.failures}"
    assert report.passed_all_base() and report.conformance_level() == "FULL"
    assert len(outcomes) == CONFORMANCE_TESTS
    assert sum(r.tests_passed for r in report.results.values()) == CONFORMANCE_TESTS


async def test_two_processes_racing_one_thread_one_is_refused_and_nothing_forks(
    state_process_address: str, tmp_path: Path
) -> None:
    """langgraph#8796's scenario: replica A is held mid-step (a paused or slow worker),
    replica B runs the same thread meanwhile. A's run holds the thread's run lease from its
    first put to its last, so B is refused at its first put, before anything of it is
    stored, and A's step lands."""
    thread = f"race-{uuid.uuid4()}"

    def start(name: str) -> subprocess.Popen[str]:
        return subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tests.support.langgraph_race",
                state_process_address,
                thread,
                str(tmp_path / f"{name}.ready"),
                str(tmp_path / "go"),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=ROOT,
        )

    async def ready(name: str, proc: subprocess.Popen[str]) -> None:
        for _ in range(600):
            if (tmp_path / f"{name}.ready").exists():
                return
            assert proc.poll() is None, proc.communicate()[1][-3000:]
            await asyncio.sleep(0.05)
        raise AssertionError(f"{name} never reached its step")

    first = start("a")
    await ready("a", first)  # A stored its input checkpoint and is inside its step
    second = start("b")
    await ready("b", second)  # B read A's checkpoint and is inside its step, unsaved
    (tmp_path / "go").touch()
    outcomes = {}
    for name, proc in (("a", first), ("b", second)):
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err[-3000:]
        outcomes[name] = json.loads(out.strip().splitlines()[-1])
    assert outcomes["a"]["outcome"] == "ok", outcomes["a"]
    assert outcomes["b"]["outcome"] == "CheckpointConflict", outcomes["b"]
    assert outcomes["b"]["stale_writer"] is True
    assert "another run holds it: nothing of this run was stored" in outcomes["b"]["message"]

    saver = AgentStateSaver(state_process_address)
    history = [t async for t in saver.alist(config(thread))]
    await saver.aclose()
    # One line of history: every checkpoint's parent is the one before it, none has two
    # children; A's step never landed.
    ids = [t.checkpoint["id"] for t in reversed(history)]
    parents = [
        t.parent_config["configurable"]["checkpoint_id"] if t.parent_config else None
        for t in reversed(history)
    ]
    assert parents == [None, *ids[:-1]], (ids, parents)
    latest = history[0]
    assert len(latest.checkpoint["channel_values"]["steps"]) == 1


async def test_human_approval_interrupt_resumed_from_a_second_process(
    state_process_address: str,
) -> None:
    thread = f"card-{uuid.uuid4()}"
    started = run_example(state_process_address, "start", "--thread", thread)
    assert started["card"] == {
        "card": "confirm_tool",
        "tool": "cancel_order",
        "args": {"order_no": "88235"},
    }
    # The first process has exited; another one answers the card: declined.
    resumed = run_example(state_process_address, "resume", "--thread", thread, "--approve", "no")
    assert resumed == {"reply": "好的，没有取消：订单 88235 仍在待发货。", "executed": []}

    saver = AgentStateSaver(state_process_address)
    state = build(saver).get_state(config(thread))
    messages = state.values["messages"]
    assert isinstance(messages[0], HumanMessage) and messages[0].content == QUESTION
    denied = [m for m in messages if isinstance(m, ToolMessage)]
    assert len(denied) == 1 and denied[0].content == DENIED and denied[0].status == "error"
    assert state.next == ()  # finished: no card open any more
    saver.close()


async def test_approved_card_runs_the_tool_once_async(state_process_address: str) -> None:
    saver = AgentStateSaver(state_process_address)
    graph = build(saver)
    cfg = config(f"approve-{uuid.uuid4()}")
    first = await graph.ainvoke({"messages": [HumanMessage(QUESTION)], "executed": []}, cfg)
    assert first["__interrupt__"][0].value["tool"] == "cancel_order"
    done = await graph.ainvoke(Command(resume={"approved": True}), cfg)
    assert done["executed"] == ["cancel_order"]
    assert done["messages"][-1].content.startswith("已取消：order 88235 cancelled")
    await saver.aclose()


async def test_bad_input_gets_langgraphs_own_errors(state_process_address: str) -> None:
    saver = AgentStateSaver(state_process_address)
    missing = config(f"never-{uuid.uuid4()}")
    # A missing thread reads as LangGraph's savers read it: nothing there.
    assert await saver.aget_tuple(missing) is None
    assert [t async for t in saver.alist(missing)] == []
    assert saver.get_tuple(missing) is None
    await saver.adelete_thread(missing["configurable"]["thread_id"])  # no error
    await saver.acopy_thread(missing["configurable"]["thread_id"], f"t-{uuid.uuid4()}")

    with pytest.raises(ValueError, match="thread_id"):
        await saver.aget_tuple({"configurable": {}})
    with pytest.raises(ValueError, match="thread_id"):
        await saver.aget_tuple({"configurable": {"thread_id": ""}})
    with pytest.raises(ValueError, match="strategy"):
        await saver.aprune(["x"], strategy="everything")

    # A value LangGraph's serializer cannot take: its own TypeError, and nothing stored.
    # Without waiting out WRITES_WAIT_SECONDS: the run's later checkpoints never come
    # (LangGraph chains a run's puts), so their writes stop waiting soon.
    graph = build(saver)
    cfg = config(f"bad-{uuid.uuid4()}")
    started = time.monotonic()
    with pytest.raises(TypeError, match="not msgpack serializable"):
        await graph.ainvoke(
            {"messages": [HumanMessage(QUESTION)], "executed": [threading.Lock()]}, cfg
        )
    assert time.monotonic() - started < WRITES_WAIT_SECONDS / 3
    assert await saver.aget_tuple(cfg) is None
    # An id the service refuses (NUL) is a ValueError naming the field, not a gRPC error.
    good = config(f"good-{uuid.uuid4()}")
    await graph.ainvoke({"messages": [HumanMessage(QUESTION)], "executed": []}, good)
    bad_id = config(good["configurable"]["thread_id"], checkpoint_id="a\x00b")
    with pytest.raises(ValueError, match="checkpoint_id"):
        await saver.aget_tuple(bad_id)
    with pytest.raises(ValueError, match="checkpoint_id"):
        saver.get_tuple(bad_id)
    started = time.monotonic()
    await saver.aclose()  # the failed run's held writes do not keep it waiting either
    assert time.monotonic() - started < WRITES_WAIT_SECONDS / 3


async def test_delete_removes_everything_and_a_late_write_is_refused(
    state_process_address: str,
) -> None:
    user = f"delete-{uuid.uuid4()}"
    saver = AgentStateSaver(state_process_address, user_id=user)
    late = AgentStateSaver(state_process_address, user_id=user)  # another replica
    graph = build(saver)
    thread = f"del-{uuid.uuid4()}"
    await graph.ainvoke({"messages": [HumanMessage(QUESTION)], "executed": []}, config(thread))
    head = await late.aget_tuple(config(thread))  # the other replica has read the thread
    assert head is not None and head.pending_writes
    conversation = saver._conversations[(user, thread)]

    await saver.adelete_thread(thread)
    assert await conversation_gone(state_process_address, user, conversation)
    assert await saver.aget_tuple(config(thread)) is None

    # The replica that was running the thread writes late: refused, nothing comes back.
    next_checkpoint = copy_checkpoint(head.checkpoint)
    next_checkpoint["id"] = str(uuid6(clock_seq=-1))
    with pytest.raises(ThreadDeleted):
        await late.aput(head.config, next_checkpoint, {"source": "loop", "step": 9}, {})
    with pytest.raises(ThreadDeleted):
        await late.aput_writes(head.config, [("messages", "late")], "task-1")
    assert await conversation_gone(state_process_address, user, conversation)
    # A stale head is refused on a live thread too (the same guard as the race above).
    cfg = config(f"cas-{uuid.uuid4()}")
    await graph.ainvoke({"messages": [HumanMessage(QUESTION)], "executed": []}, cfg)
    tup = await saver.aget_tuple(cfg)
    assert tup is not None and tup.parent_config is not None
    stale = copy_checkpoint(tup.checkpoint)
    stale["id"] = str(uuid6(clock_seq=-1))
    with pytest.raises(CheckpointConflict):
        await late.aput(
            tup.parent_config,
            stale,
            {"source": "loop", "step": 1},
            {},
        )
    await saver.aclose()
    await late.aclose()


async def test_held_writes_of_a_refused_run_never_fail_the_next_run(
    state_process_address: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run is refused while writes of a step whose checkpoint LangGraph will never put
    are held; the timer sends them while the next run reads the thread (under load, the
    two runs overlap so). Nothing of the refused run is stored, and the new run's puts
    go through: the held writes' failure is not raised into it."""
    user = f"refused-held-{uuid.uuid4()}"
    saver = AgentStateSaver(state_process_address, user_id=user, writes_delay_seconds=0.05)
    other = AgentStateSaver(state_process_address, user_id=user)
    thread = f"held-{uuid.uuid4()}"
    await build(saver).ainvoke(
        {"messages": [HumanMessage(QUESTION)], "executed": []}, config(thread)
    )
    tup = await saver.aget_tuple(config(thread))
    assert tup is not None
    moved = copy_checkpoint(tup.checkpoint)
    moved["id"] = str(uuid6(clock_seq=-1))
    await other.aput(tup.config, moved, {"source": "update", "step": 8}, {})  # a new head
    # The run of `saver` goes on from the old head: a step's writes, held for the put of
    # their checkpoint's child, then a put that is refused (LangGraph sends no later one).
    orphan = str(uuid6(clock_seq=-1))
    await saver.aput_writes(
        config(thread, checkpoint_ns="", checkpoint_id=orphan), [("messages", "x")], "task-1"
    )
    stale = copy_checkpoint(tup.checkpoint)
    stale["id"] = str(uuid6(clock_seq=-1))
    with pytest.raises(CheckpointConflict):
        await saver.aput(tup.config, stale, {"source": "loop", "step": 1}, {})
    # The timer's send of the held writes is under way when the next run reads.
    client = saver.aclient
    real = client.put_checkpoint_writes
    read: list[Any] = []

    async def read_first(*args: Any, **kwargs: Any) -> Any:
        if not read:
            read.append(await saver.aget_tuple(config(thread)))
        return await real(*args, **kwargs)

    monkeypatch.setattr(client, "put_checkpoint_writes", read_first)
    await asyncio.sleep(WRITES_WAIT_AFTER_FAILED_PUT_SECONDS + 1.0)
    assert read and read[0] is not None and read[0].checkpoint["id"] == moved["id"]
    nxt = copy_checkpoint(read[0].checkpoint)
    nxt["id"] = str(uuid6(clock_seq=-1))
    stored = await saver.aput(read[0].config, nxt, {"source": "update", "step": 9}, {})
    assert stored["configurable"]["checkpoint_id"] == nxt["id"]
    head = await saver.aget_tuple(config(thread))
    assert head is not None and head.checkpoint["id"] == nxt["id"]
    await saver.aclose()
    await other.aclose()


async def test_time_travel_branches_on_purpose(state_process_address: str) -> None:
    """LangGraph's time travel (replay and update_state from an old checkpoint) writes
    branches on purpose; the head check lets them through, and the run continues."""
    saver = AgentStateSaver(state_process_address)
    graph = build(saver)
    cfg = config(f"travel-{uuid.uuid4()}")
    await graph.ainvoke({"messages": [HumanMessage(QUESTION)], "executed": []}, cfg)
    history = [s async for s in graph.aget_state_history(cfg)]
    before_agent = next(s for s in history if s.next == ("agent",))
    replayed = await graph.ainvoke(None, before_agent.config)  # replay: a "fork" checkpoint
    assert replayed["__interrupt__"][0].value["tool"] == "cancel_order"
    edited = await graph.aupdate_state(before_agent.config, {"executed": ["edited"]})
    again = await graph.ainvoke(None, edited)
    assert again["executed"] == ["edited"] and "__interrupt__" in again
    done = await graph.ainvoke(Command(resume={"approved": False}), cfg)
    assert done["messages"][-1].content.startswith("好的，没有取消")
    await saver.aclose()


def test_langgraph_is_an_extra_and_the_adapter_stays_on_the_client() -> None:
    """`pip install agentstate-client` pulls no LangGraph; `[langgraph]` does. The adapter
    reaches the service through agentstate.client only: no service internals, no database
    driver, no generated stubs (tests/test_layering.py checks the servers for every
    integration; tests/client/test_client_distribution.py installs the extra)."""
    import tomllib

    from tests.test_layering import CLIENT_SRC, imported_modules

    project = tomllib.loads((ROOT / "client" / "pyproject.toml").read_text())["project"]
    assert not [d for d in project["dependencies"] if d.lower().startswith("langgraph")]
    assert any(d.startswith("langgraph") for d in project["optional-dependencies"]["langgraph"])
    for path in sorted((CLIENT_SRC / "integrations").rglob("*.py")):
        imported = imported_modules(path)
        assert not [
            m for m in imported if m.startswith(("psycopg", "grpc", "agentstate.state."))
        ], path
