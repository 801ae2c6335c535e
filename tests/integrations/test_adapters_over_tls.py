"""The framework adapters over TLS: LangGraph's checkpointer (sync and async, connecting
by address with a ChannelSecurity), the OpenAI Agents SDK session and the ADK session
service (on an AsyncStateClient over TLS), against a state service that requires client
certificates (mTLS) and applies a policy. The adapters' certificate is the agent's; a
caller the policy does not know gets PERMISSION_DENIED, even through an adapter."""

from __future__ import annotations

import asyncio
import json
import operator
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Annotated, TypedDict

import pytest
from google.adk.events.event import Event
from google.adk.events.event_actions import EventActions
from google.genai import types
from langgraph.graph import END, START, StateGraph

from agentstate.client import AsyncStateClient, ChannelSecurity, PermissionDenied
from agentstate.integrations.adk import AgentStateSessionService
from agentstate.integrations.langgraph import AgentStateSaver
from agentstate.integrations.openai_agents import AgentStateSession
from agentstate.state_service.config import StateServiceSettings
from agentstate.state_service.server import StateServiceApp
from tests.support.certs import CertificateAuthority

AGENT_ID = "spiffe://cluster.local/ns/agentstate/sa/agentstate-agent"


class Tls:
    def __init__(self, root: Path) -> None:
        self.ca = CertificateAuthority(root / "ca")
        self.server = self.ca.issue("server", "state", server=True)
        self.agent = self.ca.issue("agent", "agentstate-agent", spiffe=AGENT_ID)
        self.stranger = self.ca.issue("stranger", "not-in-the-policy")
        self.policy = root / "policy.json"
        self.policy.write_text(json.dumps({"rules": [{"caller": AGENT_ID, "rpcs": ["*"]}]}))

    def security(self, who: str = "agent") -> ChannelSecurity:
        pair = self.agent if who == "agent" else self.stranger
        return ChannelSecurity(
            ca_file=str(self.ca.file), cert_file=str(pair.cert), key_file=str(pair.key)
        )


@pytest.fixture
async def tls_state(tmp_path: Path) -> AsyncIterator[tuple[str, Tls]]:
    tls = Tls(tmp_path)
    app = StateServiceApp(
        StateServiceSettings(
            store="memory",
            listen_address="127.0.0.1:0",
            tls_cert_file=str(tls.server.cert),
            tls_key_file=str(tls.server.key),
            tls_client_ca_file=str(tls.ca.file),
            policy_file=str(tls.policy),
        )
    )
    address = await app.start()
    yield address, tls
    await app.stop()


class Counter(TypedDict):
    steps: Annotated[list[str], operator.add]


def _graph(saver: AgentStateSaver) -> object:
    builder = StateGraph(Counter)
    builder.add_node("step", lambda state: {"steps": [f"step {len(state['steps'])}"]})
    builder.add_edge(START, "step")
    builder.add_edge("step", END)
    return builder.compile(checkpointer=saver)


async def test_langgraph_checkpointer_over_mtls(tls_state: tuple[str, Tls]) -> None:
    address, tls = tls_state
    saver = AgentStateSaver(address, user_id="lg-user", security=tls.security())
    try:
        graph: object = _graph(saver)
        config = {"configurable": {"thread_id": "thread-1"}}
        # The sync path off the event loop: the in-process server serves on this loop.
        first = await asyncio.to_thread(graph.invoke, {"steps": []}, config)  # type: ignore[attr-defined]
        second = await graph.ainvoke({"steps": []}, config)  # type: ignore[attr-defined]
        assert first == {"steps": ["step 0"]}
        assert second == {"steps": ["step 0", "step 1"]}  # the history came back over TLS
        stored = await asyncio.to_thread(saver.get_tuple, config)  # type: ignore[arg-type]
        assert stored is not None and stored.checkpoint["channel_values"]["steps"] == [
            "step 0",
            "step 1",
        ]
    finally:
        await saver.aclose()
    stranger = AgentStateSaver(address, user_id="lg-user", security=tls.security("stranger"))
    try:
        with pytest.raises(PermissionDenied, match="not-in-the-policy"):
            await stranger.aget_tuple({"configurable": {"thread_id": "thread-1"}})
    finally:
        await stranger.aclose()


async def test_openai_agents_session_over_mtls(tls_state: tuple[str, Tls]) -> None:
    address, tls = tls_state
    async with AsyncStateClient.connect(address, security=tls.security()) as client:
        session = AgentStateSession("chat-1", client=client, user_id="oa-user")
        await session.add_items([{"role": "user", "content": "你好"}])
        assert await session.get_items() == [{"role": "user", "content": "你好"}]


async def test_adk_session_service_over_mtls(tls_state: tuple[str, Tls]) -> None:
    address, tls = tls_state
    async with AsyncStateClient.connect(address, security=tls.security()) as client:
        service = AgentStateSessionService(client)
        session = await service.create_session(app_name="app", user_id="adk-user", state={"k": 1})
        event = Event(
            id="e1",
            invocation_id="inv-1",
            author="user",
            content=types.Content(role="user", parts=[types.Part(text="hello")]),
            actions=EventActions(state_delta={"k": 2}),
        )
        await service.append_event(session, event)
        got = await service.get_session(app_name="app", user_id="adk-user", session_id=session.id)
        assert got is not None and got.state["k"] == 2 and [e.id for e in got.events] == ["e1"]
