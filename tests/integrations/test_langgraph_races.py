"""No ghost writes (issue 22, item 3): runs and update_state calls racing on one thread.

A run holds the thread's run lease from its first put to its last, so a run that is
refused is refused before anything of it is stored; update_state on the latest
checkpoint is compare-and-set. The acceptance test: two processes x 50 invokes on one
thread end with 0 forks, 0 silent losses, 0 ghost inputs and a serial final state.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Annotated, Any, TypedDict

import psycopg
from langchain_core.messages import AIMessage, HumanMessage
from langgraph.graph import START, StateGraph

from agentstate.integrations.langgraph import AgentStateSaver, CheckpointConflict
from tests.support import paths
from tests.support.langgraph_invokes import State, reply

INVOKES = 50


def merge(a: list[str], b: list[str]) -> list[str]:
    return a + b


class Parallel(TypedDict):
    done: Annotated[list[str], merge]


def config(thread_id: str) -> Any:
    return {"configurable": {"thread_id": thread_id}}


def assert_one_line(saver: AgentStateSaver, thread: str) -> list[Any]:
    """The thread's history has no fork: every checkpoint has at most one child, and
    following parents from the head visits them all."""
    history = list(saver.list(config(thread)))
    parents = Counter(
        t.parent_config["configurable"]["checkpoint_id"] for t in history if t.parent_config
    )
    assert max(parents.values()) == 1, "forked"
    ids = [t.checkpoint["id"] for t in reversed(history)]
    chain = [
        t.parent_config["configurable"]["checkpoint_id"] if t.parent_config else None
        for t in reversed(history)
    ]
    assert chain == [None, *ids[:-1]]
    return history


def test_two_processes_times_50_invokes_no_fork_loss_or_ghost(
    state_process_address: str, tmp_path: Path, database_url: str
) -> None:
    thread = f"invokes-{uuid.uuid4()}"
    go = tmp_path / "go"
    procs = {
        name: subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tests.support.langgraph_invokes",
                state_process_address,
                thread,
                name,
                str(INVOKES),
                str(go),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=paths.REPO,
        )
        for name in ("a", "b")
    }
    go.touch()
    results = {}
    for name, proc in procs.items():
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err[-3000:]
        results[name] = json.loads(out.strip().splitlines()[-1])
    acknowledged = results["a"]["acknowledged"] + results["b"]["acknowledged"]
    refused = results["a"]["refused"] + results["b"]["refused"]
    assert len(acknowledged) == 2 * INVOKES

    with AgentStateSaver(state_process_address) as saver:
        history = assert_one_line(saver, thread)  # 0 forks
        graph = StateGraph(State)
        graph.add_node("reply", reply)
        graph.add_edge(START, "reply")
        messages = graph.compile(checkpointer=saver).get_state(config(thread)).values["messages"]
    inputs = [str(m.content) for m in messages if isinstance(m, HumanMessage)]
    assert sorted(inputs) == sorted(acknowledged)  # 0 silent losses, each input once
    assert not set(inputs) & set(refused)  # 0 ghost inputs
    # Serial: every input is followed by its own reply, and each process's in its order.
    assert len(messages) == 2 * len(inputs)
    for human, answer in zip(messages[::2], messages[1::2], strict=True):
        assert isinstance(human, HumanMessage) and isinstance(answer, AIMessage)
        assert answer.content == f"reply to {human.content}"
    for name in ("a", "b"):
        assert [i for i in inputs if i.startswith(f"{name}-")] == results[name]["acknowledged"]
    assert len(history) == 3 * len(inputs)  # input, start and reply checkpoints per invoke
    with psycopg.connect(database_url) as db:
        row = db.execute(
            "SELECT count(*) FROM t_checkpoint_write w JOIN t_conversation c"
            " ON c.user_id = w.user_id AND c.id = w.conversation_id"
            " WHERE c.external_key = %s AND NOT EXISTS (SELECT 1 FROM t_checkpoint k"
            " WHERE k.user_id = w.user_id AND k.conversation_id = w.conversation_id"
            " AND k.namespace = w.namespace AND k.checkpoint_id = w.checkpoint_id)",
            [thread],
        ).fetchone()
    # Nothing of a refused run at all: not even pending writes of its refused checkpoints.
    assert row is not None and row[0] == 0, f"{row} writes of no checkpoint"
    print(f"refused attempts: {len(refused)}; writes of no checkpoint: {row[0]}")


def test_concurrent_update_state_is_refused_or_serialised_never_forked(
    state_process_address: str,
) -> None:
    thread = f"updates-{uuid.uuid4()}"
    builder = StateGraph(State)
    builder.add_node("reply", reply)
    builder.add_edge(START, "reply")
    with AgentStateSaver(state_process_address) as first:
        builder.compile(checkpointer=first).invoke(
            {"messages": [HumanMessage("hi")]}, config(thread)
        )
    acknowledged: list[str] = []
    refusals: list[str] = []
    start = threading.Barrier(2)

    def updater(name: str) -> None:
        with AgentStateSaver(state_process_address) as saver:  # a replica of its own
            graph = builder.compile(checkpointer=saver)
            start.wait()
            done = 0
            while done < 20:
                text = f"{name}-{done}-{len(refusals)}"
                try:
                    graph.update_state(config(thread), {"messages": [HumanMessage(text)]})
                except CheckpointConflict as exc:
                    refusals.append(str(exc))
                    continue
                acknowledged.append(text)
                done += 1

    threads = [threading.Thread(target=updater, args=(n,)) for n in ("a", "b")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    with AgentStateSaver(state_process_address) as saver:
        assert_one_line(saver, thread)
        messages = builder.compile(checkpointer=saver).get_state(config(thread)).values["messages"]
    updates = [m.content for m in messages[2:]]
    assert sorted(updates) == sorted(acknowledged) and len(updates) == 40  # none lost
    assert all("nothing of this run was stored" in r for r in refusals)


def test_a_refusal_says_what_was_stored(state_process_address: str) -> None:
    """A run whose lease is taken over mid-run (it outlived run_lease_seconds) is refused
    at its next put; the error names the checkpoints of the run that are stored."""
    thread = f"lapse-{uuid.uuid4()}"
    gate = threading.Event()
    entered = threading.Event()

    def slow(state: State) -> dict[str, Any]:
        entered.set()
        gate.wait(30)
        return {"messages": [AIMessage("late")]}

    builder = StateGraph(State)
    builder.add_node("reply", slow)
    builder.add_edge(START, "reply")
    errors: list[BaseException] = []
    with AgentStateSaver(state_process_address, run_lease_seconds=1) as saver:
        graph = builder.compile(checkpointer=saver)

        def run() -> None:
            try:
                graph.invoke(
                    {"messages": [HumanMessage("slow")]}, config(thread), durability="sync"
                )
            except CheckpointConflict as exc:
                errors.append(exc)

        runner = threading.Thread(target=run)
        runner.start()
        assert entered.wait(30)
        time.sleep(1.5)  # the run's lease lapses; another replica runs the thread meanwhile
        with AgentStateSaver(state_process_address) as other:
            fast = StateGraph(State)
            fast.add_node("reply", reply)
            fast.add_edge(START, "reply")
            fast.compile(checkpointer=other).invoke(
                {"messages": [HumanMessage("fast")]}, config(thread)
            )
        gate.set()
        runner.join(30)
    assert len(errors) == 1
    message = str(errors[0])
    assert "this run's earlier checkpoints" in message and "are stored" in message, message


def writes_of(database_url: str, thread: str) -> list[tuple[str, str]]:
    """(checkpoint id, channel) of every pending write stored for the thread."""
    with psycopg.connect(database_url) as db:
        rows = db.execute(
            "SELECT w.checkpoint_id, w.channel FROM t_checkpoint_write w JOIN t_conversation c"
            " ON c.user_id = w.user_id AND c.id = w.conversation_id"
            " WHERE c.external_key = %s ORDER BY 1, 2",
            [thread],
        ).fetchall()
    return [(str(r[0]), str(r[1])) for r in rows]


def put_writes_soon(
    saver: AgentStateSaver, thread: str, checkpoint_id: str, errors: list[BaseException]
) -> threading.Thread:
    """put_writes for a checkpoint, sent on a thread of its own before its put (as
    LangGraph may with durability="async")."""
    target: Any = {
        "configurable": {"thread_id": thread, "checkpoint_ns": "", "checkpoint_id": checkpoint_id}
    }

    def send() -> None:
        try:
            saver.put_writes(target, [("messages", "early")], "task-1")
        except BaseException as exc:
            errors.append(exc)

    sender = threading.Thread(target=send)
    sender.start()
    return sender


def test_writes_sent_before_their_checkpoint_wait_for_it_or_go_with_its_refusal(
    state_process_address: str, database_url: str, monkeypatch: Any
) -> None:
    """The race behind "writes of no checkpoint": a step's writes reach the saver before
    its checkpoint's put has started. They are stored once the checkpoint is; when the put
    is refused they are refused with it and nothing of them is stored; writes for a
    checkpoint that never comes fail saying so. (Writes sent at once,
    writes_delay_seconds=0; the next test is about writes held for their child's put.)"""
    from langgraph.checkpoint.base import empty_checkpoint
    from langgraph.checkpoint.base.id import uuid6

    from agentstate.client import CheckpointNotStored
    from agentstate.integrations.langgraph import saver_base

    def checkpoint() -> Any:
        made = empty_checkpoint()
        made["id"] = str(uuid6())
        return made

    thread = f"early-writes-{uuid.uuid4()}"
    errors: list[BaseException] = []
    with (
        AgentStateSaver(state_process_address, writes_delay_seconds=0) as holder,
        AgentStateSaver(state_process_address, writes_delay_seconds=0) as other,
    ):
        first = checkpoint()
        sender = put_writes_soon(holder, thread, first["id"], errors)
        time.sleep(0.3)  # the writes are refused by the service and wait for the put
        holder.put(config(thread), first, {"source": "input", "step": -1}, {})
        sender.join(30)
        assert not sender.is_alive() and errors == []
        assert writes_of(database_url, thread) == [(first["id"], "messages")]

        # `holder` holds the thread's run lease: `other`'s run is refused at its put.
        second = checkpoint()
        sender = put_writes_soon(other, thread, second["id"], errors)
        time.sleep(0.3)
        parent: Any = {
            "configurable": {"thread_id": thread, "checkpoint_ns": "", "checkpoint_id": first["id"]}
        }
        try:
            other.put(parent, second, {"source": "loop", "step": 0}, {})
            raise AssertionError("the put was not refused")
        except CheckpointConflict as exc:
            assert "nothing of this run was stored" in str(exc), exc
        sender.join(30)
        assert not sender.is_alive()
        assert len(errors) == 1 and isinstance(errors[0], CheckpointConflict), errors
        assert writes_of(database_url, thread) == [(first["id"], "messages")]

        # Writes for a checkpoint nobody puts: refused once the wait is over.
        monkeypatch.setattr(saver_base, "WRITES_WAIT_SECONDS", 0.5)
        errors.clear()
        put_writes_soon(holder, thread, str(uuid6()), errors).join(30)
        assert len(errors) == 1 and isinstance(errors[0], CheckpointNotStored), errors
        assert "is not stored" in str(errors[0]) and "were not stored" in str(errors[0])
        assert writes_of(database_url, thread) == [(first["id"], "messages")]


def checkpoints_of(database_url: str, thread: str) -> list[str]:
    with psycopg.connect(database_url) as db:
        rows = db.execute(
            "SELECT k.checkpoint_id FROM t_checkpoint k JOIN t_conversation c"
            " ON c.user_id = k.user_id AND c.id = k.conversation_id"
            " WHERE c.external_key = %s ORDER BY 1",
            [thread],
        ).fetchall()
    return [str(r[0]) for r in rows]


def test_held_writes_go_with_the_child_put_or_alone_and_never_outlive_a_refusal(
    state_process_address: str, database_url: str
) -> None:
    """A task's ordinary writes wait (writes_delay_seconds) for the put of their
    checkpoint's child, which stores them in its own transaction: one call per step.
    A reader of the saver sees them at once; a refused child put stores none of them;
    without a child put they are sent alone; interrupt and error writes go at once."""
    from langgraph.checkpoint.base import empty_checkpoint
    from langgraph.checkpoint.base.id import uuid6

    def checkpoint() -> Any:
        made = empty_checkpoint()
        made["id"] = str(uuid6())
        return made

    def at(thread: str, checkpoint_id: str) -> Any:
        return {
            "configurable": {
                "thread_id": thread,
                "checkpoint_ns": "",
                "checkpoint_id": checkpoint_id,
            }
        }

    thread = f"held-writes-{uuid.uuid4()}"
    with (
        AgentStateSaver(state_process_address, writes_delay_seconds=5) as saver,
        AgentStateSaver(state_process_address, writes_delay_seconds=5) as other,
    ):
        first = checkpoint()
        saver.put(config(thread), first, {"source": "input", "step": -1}, {})
        saver.put_writes(at(thread, first["id"]), [("messages", "a")], "task-1")
        assert writes_of(database_url, thread) == []  # held for the child's put
        second = checkpoint()
        saver.put(at(thread, first["id"]), second, {"source": "loop", "step": 0}, {})
        assert writes_of(database_url, thread) == [(first["id"], "messages")]

        # A reader sees held writes: get_tuple sends them first.
        saver.put_writes(at(thread, second["id"]), [("messages", "b")], "task-1")
        found = saver.get_tuple(at(thread, second["id"]))
        assert found is not None and found.pending_writes == [("task-1", "messages", "b")]

        # A refused child put stores none of the writes it carried.
        third = checkpoint()
        other.get_tuple(config(thread))
        other.put_writes(at(thread, second["id"]), [("other", "ghost")], "task-2")
        try:
            other.put(at(thread, second["id"]), third, {"source": "loop", "step": 1}, {})
            raise AssertionError("the put was not refused")
        except CheckpointConflict as exc:
            assert "nothing of this run was stored" in str(exc), exc
        assert writes_of(database_url, thread) == [
            (first["id"], "messages"),
            (second["id"], "messages"),
        ]
        assert third["id"] not in checkpoints_of(database_url, thread)

        # An interrupt goes at once, with the writes held for its checkpoint.
        saver.put_writes(at(thread, second["id"]), [("later", "c")], "task-3")
        saver.put_writes(at(thread, second["id"]), [("__interrupt__", "stop")], "task-4")
        assert sorted(writes_of(database_url, thread)) == sorted(
            [
                (first["id"], "messages"),
                (second["id"], "messages"),
                (second["id"], "later"),
                (second["id"], "__interrupt__"),
            ]
        )

    # Without a child put, held writes are sent alone once the delay is over.
    thread = f"held-alone-{uuid.uuid4()}"
    with AgentStateSaver(state_process_address, writes_delay_seconds=0.2) as saver:
        first = checkpoint()
        saver.put(config(thread), first, {"source": "input", "step": -1}, {})
        saver.put_writes(at(thread, first["id"]), [("messages", "alone")], "task-1")
        deadline = time.monotonic() + 10
        while not writes_of(database_url, thread) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert writes_of(database_url, thread) == [(first["id"], "messages")]


def test_a_failed_step_resumes_without_rerunning_the_tasks_that_finished(
    state_process_address: str,
) -> None:
    """What LangGraph relies on from pending writes: when one node of a super-step fails,
    the writes of the nodes that finished are stored (held writes go with the error), so
    the resumed run does not run them again."""
    runs: Counter[str] = Counter()

    def fine(state: Parallel) -> dict[str, Any]:
        runs["fine"] += 1
        return {"done": ["fine"]}

    def flaky(state: Parallel) -> dict[str, Any]:
        runs["flaky"] += 1
        time.sleep(0.3)  # the other node's writes are held meanwhile
        if runs["flaky"] == 1:
            raise RuntimeError("first attempt fails")
        return {"done": ["flaky"]}

    builder = StateGraph(Parallel)
    builder.add_node("fine", fine)
    builder.add_node("flaky", flaky)
    builder.add_edge(START, "fine")
    builder.add_edge(START, "flaky")
    thread = f"resume-{uuid.uuid4()}"
    with AgentStateSaver(state_process_address, writes_delay_seconds=5) as saver:
        graph = builder.compile(checkpointer=saver)
        try:
            graph.invoke({"done": []}, config(thread), durability="sync")
            raise AssertionError("the step did not fail")
        except RuntimeError:
            pass
    with AgentStateSaver(state_process_address) as fresh:  # another process, say
        graph = builder.compile(checkpointer=fresh)
        final = graph.invoke(None, config(thread), durability="sync")
    assert sorted(final["done"]) == ["fine", "flaky"]
    assert runs == Counter({"fine": 1, "flaky": 2})


async def test_held_writes_of_an_async_run_are_sent_alone_by_its_event_loop(
    state_process_address: str, database_url: str
) -> None:
    from langgraph.checkpoint.base import empty_checkpoint
    from langgraph.checkpoint.base.id import uuid6

    thread = f"held-async-{uuid.uuid4()}"
    async with AgentStateSaver(state_process_address, writes_delay_seconds=0.1) as saver:
        first = empty_checkpoint()
        first["id"] = str(uuid6())
        await saver.aput(config(thread), first, {"source": "input", "step": -1}, {})
        target: Any = {
            "configurable": {"thread_id": thread, "checkpoint_ns": "", "checkpoint_id": first["id"]}
        }
        await saver.aput_writes(target, [("messages", "alone")], "task-1")
        assert writes_of(database_url, thread) == []
        for _ in range(100):
            await asyncio.sleep(0.05)
            if writes_of(database_url, thread):
                break
        assert writes_of(database_url, thread) == [(first["id"], "messages")]
