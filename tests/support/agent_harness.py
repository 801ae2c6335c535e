"""Running the state service and agent replicas in-process on loopback, and driving turns.

The agent replicas run the order demo profile (examples/order_demo) unless told otherwise.
"""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import grpc

from agentstate.agent.v1 import agent_service_pb2 as pb
from agentstate.agent.v1 import agent_service_pb2_grpc as pb_grpc
from agentstate.agent_service.agent_state import AgentState, Msg
from agentstate.agent_service.config import AgentServiceSettings
from agentstate.agent_service.middleware import ContextMiddleware
from agentstate.agent_service.model.base import ChatModel, ModelEvent, ModelRequest
from agentstate.agent_service.profile import Profile
from agentstate.agent_service.server import AgentServiceApp
from agentstate.agent_service.tools.registry import Tool
from agentstate.client.metadata import USER_ID_METADATA_KEY
from agentstate.common import error_details
from agentstate.examples.order_demo import OrderDemoProfile, OrderDemoSettings
from agentstate.examples.order_demo.model import ScriptedOrderModel
from agentstate.state.v1 import state_service_pb2 as spb
from agentstate.state.v1 import state_service_pb2_grpc as spb_grpc
from agentstate.state_service.config import StateServiceSettings
from agentstate.state_service.server import StateServiceApp


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class RecordingModel(ChatModel):
    """Wraps a model; keeps every request it was sent (what the model really saw)."""

    def __init__(self, inner: ChatModel | None = None, delay: float = 0.0) -> None:
        self.inner = inner or ScriptedOrderModel()
        self.requests: list[ModelRequest] = []
        self.delay = delay
        self.name = self.inner.name

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelEvent]:
        self.requests.append(request)
        if self.delay:
            await asyncio.sleep(self.delay)
        async for event in self.inner.stream(request):
            yield event

    async def summarize(
        self, previous_summary: str, messages: Sequence[Msg], max_tokens: int
    ) -> str:
        return await self.inner.summarize(previous_summary, messages, max_tokens)


@dataclass
class Turn:
    """The events of one streamed turn, and its status."""

    events: list[pb.TurnEvent] = field(default_factory=list)
    code: grpc.StatusCode = grpc.StatusCode.OK
    details: str = ""
    error_info: Any = None  # the status's google.rpc.ErrorInfo, if any

    def kinds(self) -> list[str]:
        return [str(e.WhichOneof("event")) for e in self.events]

    def of(self, kind: str) -> list[Any]:
        return [getattr(e, kind) for e in self.events if e.WhichOneof("event") == kind]

    @property
    def meta(self) -> pb.MetaEvent:
        return self.of("meta")[0]  # type: ignore[no-any-return]

    @property
    def reply(self) -> str:
        return "".join(m.delta for m in self.of("message") if m.type == pb.MESSAGE_TYPE_RESPONSE)

    @property
    def card(self) -> pb.ConfirmEvent:
        return self.of("confirm")[0]  # type: ignore[no-any-return]


def metadata(user_id: str) -> tuple[tuple[str, str], ...]:
    return ((USER_ID_METADATA_KEY, user_id),)


async def collect(call: Any, turn: Turn | None = None) -> Turn:
    """Read a streaming call to its end (with read(), so it may already be partly read)."""
    turn = turn or Turn()
    try:
        while (response := await call.read()) is not grpc.aio.EOF:  # type: ignore[attr-defined]
            turn.events.append(response.event)
    except grpc.aio.AioRpcError as exc:
        turn.code = exc.code()
        turn.details = exc.details() or ""
        turn.error_info = error_details.error_info(exc)
    return turn


class AgentClient:
    def __init__(self, address: str) -> None:
        self.address = address
        self.channel = grpc.aio.insecure_channel(address)
        self.stub: Any = pb_grpc.AgentServiceStub(self.channel)

    async def chat(self, user_id: str, question: str, conversation_id: str = "") -> Turn:
        return await collect(
            self.stub.Chat(
                pb.ChatRequest(conversation_id=conversation_id, question=question),
                metadata=metadata(user_id),
            )
        )

    async def confirm(
        self, user_id: str, conversation_id: str, message_id: str, approved: bool
    ) -> Turn:
        return await collect(
            self.stub.Confirm(
                pb.ConfirmRequest(
                    conversation_id=conversation_id, message_id=message_id, approved=approved
                ),
                metadata=metadata(user_id),
            )
        )

    async def close(self) -> None:
        await self.channel.close(None)


class StateReader:
    """Reads what the state service stored (the tests' view of the truth)."""

    def __init__(self, address: str) -> None:
        self.channel = grpc.aio.insecure_channel(address)
        self.stub: Any = spb_grpc.StateServiceStub(self.channel)

    async def state(self, user_id: str, conversation_id: str) -> tuple[AgentState, int]:
        got = await self.stub.GetState(
            spb.GetStateRequest(user_id=user_id, conversation_id=conversation_id)
        )
        return AgentState.decode(got.payload), int(got.version)

    async def raw_state(self, user_id: str, conversation_id: str) -> dict[str, Any]:
        got = await self.stub.GetState(
            spb.GetStateRequest(user_id=user_id, conversation_id=conversation_id)
        )
        return json.loads(got.payload)  # type: ignore[no-any-return]

    async def records(self, user_id: str, conversation_id: str) -> list[spb.MessageRecord]:
        page = await self.stub.ListMessages(
            spb.ListMessagesRequest(user_id=user_id, conversation_id=conversation_id)
        )
        return list(page.messages)

    async def close(self) -> None:
        await self.channel.close(None)


class Stack:
    """A state service and any number of agent replicas, all in this process.

    Each replica gets its own order demo profile on `orders_url` (one shared order
    database, as replicas share it in production), unless given another profile."""

    def __init__(self, database_url: str, orders_url: str, **agent_overrides: Any) -> None:
        self.orders_url = orders_url
        self.state_address = f"127.0.0.1:{free_port()}"
        self.state_settings = StateServiceSettings(
            listen_address=self.state_address,
            store="postgres",
            database_url=database_url,
            pool_max_size=20,
            shutdown_grace_seconds=1,
        )
        defaults: dict[str, Any] = {
            "listen_address": "127.0.0.1:0",
            "state_address": self.state_address,
            "state_timeout_seconds": 5,
            "lease_renew_seconds": 0.2,
            "shutdown_grace_seconds": 1,
            "auth_mode": "dev-header",  # tests name their users in the bare header
        }
        self.agent_settings = AgentServiceSettings(**{**defaults, **agent_overrides})
        self.state_app: StateServiceApp | None = None
        self.agents: list[tuple[AgentServiceApp, AgentClient]] = []
        self.reader = StateReader(self.state_address)

    async def start_state(self) -> None:
        self.state_app = StateServiceApp(self.state_settings)
        await self.state_app.start()

    async def stop_state(self) -> None:
        assert self.state_app is not None
        await self.state_app.stop()
        self.state_app = None

    async def start_agent(
        self,
        model: ChatModel | None = None,
        middlewares: tuple[ContextMiddleware, ...] | None = None,
        extra_tools: Sequence[Tool] = (),
        profile: Profile | None = None,
        **overrides: Any,
    ) -> AgentClient:
        settings = self.agent_settings.model_copy(update=overrides)
        if profile is None:
            profile = OrderDemoProfile(OrderDemoSettings(database_url=self.orders_url))
        app = AgentServiceApp(
            settings, profile, model=model, middlewares=middlewares, extra_tools=extra_tools
        )
        client = AgentClient(await app.start())
        self.agents.append((app, client))
        return client

    async def stop_agent(self, client: AgentClient) -> None:
        for app, existing in list(self.agents):
            if existing is client:
                await client.close()
                await app.stop()
                self.agents.remove((app, existing))

    @property
    def orders(self) -> Any:
        """The first replica's order system (the order demo profile's)."""
        profile = self.agents[0][0].profile
        assert isinstance(profile, OrderDemoProfile), profile
        return profile.orders

    async def close(self) -> None:
        for _, client in list(self.agents):
            await self.stop_agent(client)
        await self.reader.close()
        if self.state_app is not None:
            await self.stop_state()


def block_summary(state: AgentState) -> list[tuple[str, list[str]]]:
    """Each context message as (role, [block type and state]) for comparisons."""
    summary = []
    for msg in state.context:
        blocks = []
        for block in msg.content:
            data = block.to_json()
            kind = data["type"]
            if kind in ("tool_use", "tool_result"):
                blocks.append(f"{kind} {data['name']} {data['state']}")
            else:
                blocks.append(kind)
        summary.append((msg.role.value, blocks))
    return summary


def first_of(items: Sequence[Any]) -> Any:
    assert items, "expected at least one item"
    return items[0]
