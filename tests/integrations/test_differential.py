"""Differential tests (issue 22, item 2): random sequences of operations run against each
framework's reference backend and against our adapter, every result compared as JSON with
sorted keys (so that 1 and 1.0 differ).

- OpenAI Agents: `SQLiteSession` (on a file, so that reopening a session is tested too).
- ADK: `InMemorySessionService`.
- LangGraph: `InMemorySaver`, through a real graph (invoke, update_state, get_state,
  get_state_history), besides LangGraph's conformance suite (test_langgraph.py).

Payload-fidelity values (NUL, -0.0, 1e21, integers above 2^53, key order) are in the
strategies, and `test_fidelity_*` below check each, NaN included, one by one (issue 22,
item 1). NaN stays out of the sequences: ADK's own event JSON writes it as null (the one
documented difference, checked in test_fidelity_adk).

Deliberate differences, each tested elsewhere and kept out of these sequences:
- ADK: a session object older than the stored session gets StaleSessionError, as
  DatabaseSessionService raises it (InMemorySessionService appends anyway):
  test_adk_session_service.py::test_stale_session_is_refused. So each side here appends
  with the session object its last call returned.
- ADK: `last_update_time` is the store's time of the last write (as DatabaseSessionService),
  not the event's own timestamp: left out of the comparison.
- ADK: an empty app_name or user_id is ValueError (ours keys by them); list_sessions
  without a user_id is ValueError (listing across users is issue 23's).
- LangGraph: checkpoint ids and timestamps differ by construction; values, metadata,
  `next`, and the shape of the history are compared. Runs racing on one thread are
  refused (`CheckpointConflict`, nothing stored) where InMemorySaver forks the history:
  test_langgraph_races.py. These sequences run one writer at a time.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import tempfile
import uuid
from pathlib import Path
from typing import Annotated, Any, TypedDict

import pytest
from agents import SQLiteSession
from google.adk.events.event import Event
from google.adk.events.event_actions import EventActions
from google.adk.sessions import InMemorySessionService
from google.adk.sessions.base_session_service import BaseSessionService, GetSessionConfig
from google.adk.sessions.session import Session
from google.genai import types
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, rule, run_state_machine_as_test
from langchain_core.messages import AIMessage, AnyMessage, HumanMessage
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import START, StateGraph
from langgraph.graph.message import add_messages

from agentstate.client import AsyncStateClient
from agentstate.integrations.adk import AgentStateSessionService
from agentstate.integrations.langgraph import AgentStateSaver
from agentstate.integrations.openai_agents import AgentStateSession

FIDELITY_VALUES: list[Any] = ["a\x00b", math.nan, -0.0, 1e21, {"b": 1, "a": 2}]
FIDELITY_IDS = ["nul", "nan", "minus-zero", "1e21", "key-order"]

RUNS = settings(
    max_examples=int(os.environ.get("AGENTSTATE_DIFFERENTIAL_EXAMPLES", "8")),
    stateful_step_count=20,
    deadline=None,
    suppress_health_check=list(HealthCheck),
    database=None,  # no example database in the checkout
)


def same(ours: Any, theirs: Any) -> None:
    """Equal as JSON with sorted keys: 1 and 1.0 differ, so do "1" and 1."""
    left = json.dumps(ours, sort_keys=True, default=repr)
    right = json.dumps(theirs, sort_keys=True, default=repr)
    assert left == right


def outcome(loop: asyncio.AbstractEventLoop, call: Any) -> Any:
    """The result of a call, or the type of the exception it raised."""
    try:
        return {"ok": loop.run_until_complete(call)}
    except Exception as exc:  # the comparison is of what each backend raised
        return {"raised": type(exc).__name__}


TEXT = st.characters(codec="utf-8")
scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**31), 2**31),
    st.sampled_from([2**53 + 1, -(2**63)]),  # kept exactly already
    st.floats(-1e6, 1e6, allow_nan=False, width=32),
    st.text(TEXT, max_size=8),
    st.sampled_from([v for v in FIDELITY_VALUES if not isinstance(v, float) or v == v]),
)
json_values = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.dictionaries(st.text(TEXT, max_size=4), inner, max_size=3)
    ),
    max_leaves=6,
)

ADDRESS: dict[str, str] = {}


# ------------------------------------------------------------------- OpenAI Agents


class OpenAISessions(RuleBasedStateMachine):
    """SQLiteSession (a file) against AgentStateSession, the same operations on both."""

    @initialize()
    def start(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.client = AsyncStateClient.connect(ADDRESS["state"])
        self.user = f"diff-openai-{uuid.uuid4()}"
        self.dir = tempfile.mkdtemp()
        self.ids = ["s1", "s2"]
        self.open_all()

    def open_all(self) -> None:
        db = Path(self.dir) / "sessions.db"
        self.theirs = {s: SQLiteSession(s, db) for s in self.ids}
        self.ours = {
            s: AgentStateSession(s, client=self.client, user_id=self.user) for s in self.ids
        }
        # The same sessions opened by another process: what they change, ours must see
        # (a session keeps the items it has read, and reads only what came since).
        self.elsewhere = {
            s: AgentStateSession(s, client=self.client, user_id=self.user) for s in self.ids
        }

    def both(self, session_id: str, call: str, *args: Any, elsewhere: bool = False) -> None:
        theirs = outcome(self.loop, getattr(self.theirs[session_id], call)(*args))
        sessions = self.elsewhere if elsewhere else self.ours
        ours = outcome(self.loop, getattr(sessions[session_id], call)(*args))
        same(ours, theirs)

    @rule(
        session_id=st.sampled_from(["s1", "s2"]),
        call=st.sampled_from(["add_items", "pop_item", "clear_session", "get_items"]),
    )
    def elsewhere_too(self, session_id: str, call: str) -> None:
        args: tuple[Any, ...] = ([{"role": "user", "content": "from elsewhere"}],)
        self.both(session_id, call, *(args if call == "add_items" else ()), elsewhere=True)

    @rule(
        session_id=st.sampled_from(["s1", "s2"]),
        items=st.lists(
            st.fixed_dictionaries(
                {"role": st.sampled_from(["user", "assistant"]), "content": json_values}
            ),
            max_size=3,
        ),
    )
    def add_items(self, session_id: str, items: list[Any]) -> None:
        self.both(session_id, "add_items", items)

    @rule(
        session_id=st.sampled_from(["s1", "s2"]), limit=st.sampled_from([None, 0, 1, 2, 3, 100, -1])
    )
    def get_items(self, session_id: str, limit: int | None) -> None:
        self.both(session_id, "get_items", limit)

    @rule(session_id=st.sampled_from(["s1", "s2"]))
    def pop_item(self, session_id: str) -> None:
        self.both(session_id, "pop_item")

    @rule(session_id=st.sampled_from(["s1", "s2"]))
    def clear_session(self, session_id: str) -> None:
        self.both(session_id, "clear_session")

    @rule()
    def reopen(self) -> None:
        for session in self.theirs.values():
            session.close()
        for ours in [*self.ours.values(), *self.elsewhere.values()]:
            ours.close()
        self.open_all()
        for session_id in self.ids:
            self.both(session_id, "get_items", None)

    def teardown(self) -> None:
        if hasattr(self, "loop"):
            for session in self.theirs.values():
                session.close()
            self.loop.run_until_complete(self.client.close())
            self.loop.close()


def test_openai_session_matches_sqlite_session(state_process_address: str) -> None:
    ADDRESS["state"] = state_process_address
    run_state_machine_as_test(OpenAISessions, settings=RUNS)


# --------------------------------------------------------------------------- ADK

T0 = 1_700_000_000.0
ADK_IDS = ["s1", " s1 ", "s2", "  "]
timestamps = st.sampled_from([T0, T0 + 1, T0 + 1, T0 + 2.5, T0 + 3, T0 - 1])
state_keys = st.sampled_from(["k", "n", "app:motd", "user:name", "temp:scratch"])


def session_view(session: Session | None) -> Any:
    if session is None:
        return None
    return {
        # A generated id (a uuid) differs by construction.
        "id": session.id if session.id in ADK_IDS else "<generated>",
        "app_name": session.app_name,
        "user_id": session.user_id,
        "state": session.state,
        "events": [e.model_dump(mode="json", exclude_none=True) for e in session.events],
    }


class ADKSessions(RuleBasedStateMachine):
    """InMemorySessionService against AgentStateSessionService."""

    @initialize()
    def start(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.client = AsyncStateClient.connect(ADDRESS["state"])
        self.user = f"diff-adk-{uuid.uuid4()}"
        self.app = f"app-{uuid.uuid4()}"
        self.services: dict[str, BaseSessionService] = {
            "theirs": InMemorySessionService(),
            "ours": AgentStateSessionService(self.client),
        }
        # Each side's session objects, as its last call returned them.
        self.sessions: dict[str, dict[str, Session]] = {"theirs": {}, "ours": {}}
        self.events: list[Event] = []  # sent before: re-delivered by redeliver

    def run(self, side: str, call: Any) -> Any:
        return outcome(self.loop, call)

    def compare(self, calls: dict[str, Any], view: Any = session_view) -> dict[str, Any]:
        results = {}
        for side, call in calls.items():
            got = self.run(side, call)
            results[side] = got
        shown = {side: {"ok": view(r["ok"])} if "ok" in r else r for side, r in results.items()}
        same(shown["ours"], shown["theirs"])
        return results

    @rule(
        session_id=st.sampled_from(ADK_IDS),
        state=st.dictionaries(state_keys, json_values, max_size=3),
    )
    def create(self, session_id: str, state: dict[str, Any]) -> None:
        results = self.compare(
            {
                side: s.create_session(
                    app_name=self.app, user_id=self.user, session_id=session_id, state=state
                )
                for side, s in self.services.items()
            },
            view=lambda s: (
                {**session_view(s), "id": None} if not session_id.strip() else session_view(s)
            ),
        )
        for side, result in results.items():
            if "ok" in result:
                self.sessions[side][result["ok"].id] = result["ok"]

    @rule(
        session_id=st.sampled_from(ADK_IDS),
        n=st.integers(0, 5),
        timestamp=timestamps,
        delta=st.dictionaries(state_keys, json_values, max_size=2),
    )
    def append(self, session_id: str, n: int, timestamp: float, delta: dict[str, Any]) -> None:
        key = session_id.strip()
        if key not in self.sessions["theirs"] or key not in self.sessions["ours"]:
            return
        event = Event(
            id=f"ev-{n}",
            invocation_id="inv",
            author="user",
            timestamp=timestamp,
            content=types.Content(role="user", parts=[types.Part(text=f"message {n}")]),
            actions=EventActions(state_delta=delta),
        )
        self.events.append(event)
        self.append_both(key, event)

    def append_both(self, key: str, event: Event) -> None:
        results = self.compare(
            {
                side: s.append_event(self.sessions[side][key], event.model_copy(deep=True))
                for side, s in self.services.items()
            },
            view=lambda e: e.model_dump(mode="json", exclude_none=True),
        )
        # Both session objects, as the append left them.
        same(session_view(self.sessions["ours"][key]), session_view(self.sessions["theirs"][key]))
        del results

    @rule(session_id=st.sampled_from(["s1", "s2"]), data=st.data())
    def redeliver(self, session_id: str, data: st.DataObject) -> None:
        """The same event again (a retried call): idempotent on both."""
        if not self.events or session_id not in self.sessions["theirs"]:
            return
        if session_id not in self.sessions["ours"]:
            return
        self.append_both(session_id, data.draw(st.sampled_from(self.events)))

    @rule(
        session_id=st.sampled_from(ADK_IDS),
        recent=st.sampled_from([None, 0, 1, 2, 5]),
        after=st.sampled_from([None, T0, T0 + 1, T0 + 2, T0 + 3, T0 + 10]),
    )
    def get(self, session_id: str, recent: int | None, after: float | None) -> None:
        config = GetSessionConfig(num_recent_events=recent, after_timestamp=after)
        results = self.compare(
            {
                side: s.get_session(
                    app_name=self.app, user_id=self.user, session_id=session_id, config=config
                )
                for side, s in self.services.items()
            }
        )
        if recent is None and after is None:
            for side, result in results.items():
                if result.get("ok") is not None:
                    self.sessions[side][result["ok"].id] = result["ok"]

    @rule(session_id=st.sampled_from(ADK_IDS))
    def delete(self, session_id: str) -> None:
        self.compare(
            {
                side: s.delete_session(app_name=self.app, user_id=self.user, session_id=session_id)
                for side, s in self.services.items()
            },
            view=lambda r: r,
        )

    @rule()
    def listed(self) -> None:
        def view(response: Any) -> Any:
            return sorted(json.dumps(session_view(s), sort_keys=True) for s in response.sessions)

        self.compare(
            {
                side: s.list_sessions(app_name=self.app, user_id=self.user)
                for side, s in self.services.items()
            },
            view=view,
        )

    @rule()
    def user_state(self) -> None:
        self.compare(
            {
                side: s.get_user_state(app_name=self.app, user_id=self.user)
                for side, s in self.services.items()
            },
            view=lambda r: r,
        )

    def teardown(self) -> None:
        if hasattr(self, "loop"):
            self.loop.run_until_complete(self.client.close())
            self.loop.close()


def test_adk_service_matches_in_memory_session_service(state_process_address: str) -> None:
    ADDRESS["state"] = state_process_address
    run_state_machine_as_test(ADKSessions, settings=RUNS)


# --------------------------------------------------------------------- LangGraph


class Chat(TypedDict):
    messages: Annotated[list[AnyMessage], add_messages]
    notes: list[Any]


def answer(state: Chat) -> dict[str, Any]:
    return {
        "messages": [
            AIMessage(f"reply to {state['messages'][-1].content}", id=str(len(state["messages"])))
        ]
    }


def chat_graph(saver: Any) -> Any:
    builder = StateGraph(Chat)
    builder.add_node("answer", answer)
    builder.add_edge(START, "answer")
    return builder.compile(checkpointer=saver, interrupt_before=None)


def snapshot_view(snapshot: Any) -> Any:
    """What a caller sees of a state snapshot, ids and timestamps aside."""
    metadata = {k: v for k, v in (snapshot.metadata or {}).items() if k != "run_id"}
    return {
        "values": {
            "messages": [
                (type(m).__name__, m.content) for m in snapshot.values.get("messages", [])
            ],
            "notes": snapshot.values.get("notes"),
        },
        "next": list(snapshot.next),
        "metadata": metadata,
        "has_parent": snapshot.parent_config is not None,
        "tasks": [(t.name, t.error is not None) for t in snapshot.tasks],
    }


class LangGraphThreads(RuleBasedStateMachine):
    """InMemorySaver against AgentStateSaver, through the same graph."""

    @initialize()
    def start(self) -> None:
        self.ours_saver = AgentStateSaver(ADDRESS["state"], user_id=f"diff-lg-{uuid.uuid4()}")
        self.graphs = {"theirs": chat_graph(InMemorySaver()), "ours": chat_graph(self.ours_saver)}
        self.turn = 0

    def both(self, call: Any, view: Any) -> None:
        results = {}
        for side, graph in self.graphs.items():
            try:
                results[side] = {"ok": view(call(graph))}
            except Exception as exc:  # compared: each side's exception type
                results[side] = {"raised": type(exc).__name__}
        same(results["ours"], results["theirs"])

    @rule(thread=st.sampled_from(["t1", "t2"]), sync=st.booleans())
    def invoke(self, thread: str, sync: bool) -> None:
        self.turn += 1
        text = f"message {self.turn}"
        config = {"configurable": {"thread_id": thread}}
        start = {"messages": [HumanMessage(text, id=f"h{self.turn}")], "notes": []}

        def call(graph: Any) -> Any:
            if sync:
                return graph.invoke(start, config)
            return asyncio.run(graph.ainvoke(start, config))  # a new loop each time

        self.both(call, lambda out: [(type(m).__name__, m.content) for m in out["messages"]])

    @rule(thread=st.sampled_from(["t1", "t2"]), note=json_values)
    def update_state(self, thread: str, note: Any) -> None:
        config = {"configurable": {"thread_id": thread}}
        self.both(
            lambda g: g.update_state(config, {"notes": [note]}), lambda c: sorted(c["configurable"])
        )

    @rule(thread=st.sampled_from(["t1", "t2", "never"]))
    def get_state(self, thread: str) -> None:
        config = {"configurable": {"thread_id": thread}}
        self.both(lambda g: g.get_state(config), snapshot_view)

    @rule(thread=st.sampled_from(["t1", "t2", "never"]), limit=st.sampled_from([None, 1, 3]))
    def history(self, thread: str, limit: int | None) -> None:
        config = {"configurable": {"thread_id": thread}}
        self.both(
            lambda g: list(g.get_state_history(config, limit=limit)),
            lambda snapshots: [snapshot_view(s) for s in snapshots],
        )

    @rule(thread=st.sampled_from(["t1", "t2"]))
    def delete(self, thread: str) -> None:
        self.both(lambda g: g.checkpointer.delete_thread(thread), lambda r: r)

    def teardown(self) -> None:
        if hasattr(self, "ours_saver"):
            self.ours_saver.close()


def test_langgraph_saver_matches_in_memory_saver(state_process_address: str) -> None:
    ADDRESS["state"] = state_process_address
    run_state_machine_as_test(LangGraphThreads, settings=RUNS)


# ------------------------------------------------------ payload fidelity (item 1)


@pytest.mark.parametrize("value", FIDELITY_VALUES, ids=FIDELITY_IDS)
def test_fidelity_openai(state_process_address: str, value: Any, tmp_path: Path) -> None:
    item: Any = {"role": "user", "content": value}

    async def both() -> tuple[Any, Any]:
        async with AsyncStateClient.connect(state_process_address) as client:
            ours = AgentStateSession("f", client=client, user_id=f"fid-{uuid.uuid4()}")
            theirs = SQLiteSession("f", tmp_path / "f.db")
            await ours.add_items([item])
            await theirs.add_items([item])
            got = (await ours.get_items(), await theirs.get_items())
            theirs.close()
            return got

    ours, theirs = asyncio.run(both())
    assert json.dumps(ours) == json.dumps(theirs)  # key order counts here


@pytest.mark.parametrize("value", FIDELITY_VALUES, ids=FIDELITY_IDS)
def test_fidelity_adk(state_process_address: str, value: Any) -> None:
    async def both() -> tuple[Any, Any]:
        async with AsyncStateClient.connect(state_process_address) as client:
            user = f"fid-{uuid.uuid4()}"
            seen = []
            for service in (AgentStateSessionService(client), InMemorySessionService()):
                session = await service.create_session(
                    app_name="a", user_id=user, session_id="s", state={"v": value}
                )
                event = Event(
                    author="user", invocation_id="i", actions=EventActions(state_delta={"w": value})
                )
                event.id = "e1"
                event.timestamp = T0
                await service.append_event(session, event)
                got = await service.get_session(app_name="a", user_id=user, session_id="s")
                assert got is not None
                delta = got.events[0].actions.state_delta
                seen.append((json.dumps(got.state), json.dumps(delta)))
            return seen[0], seen[1]

    ours, theirs = asyncio.run(both())
    assert ours[0] == theirs[0]  # the session's state: exactly, NaN too
    if isinstance(value, float) and value != value:
        # The documented difference: ADK's own event JSON (model_dump_json) writes NaN as
        # null; the event is kept as ADK serialised it.
        assert (ours[1], theirs[1]) == ('{"w": null}', '{"w": NaN}')
    else:
        assert ours[1] == theirs[1]
