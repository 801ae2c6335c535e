"""Assemble and run the agent service: state client, model, tools, runtime, gRPC."""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Sequence
from typing import Any

import grpc

from agent_service.config import AgentServiceSettings
from agent_service.context.manager import ContextManager, ContextSettings
from agent_service.context.tokens import make_counter
from agent_service.middleware import DEFAULT_MIDDLEWARES, ContextMiddleware
from agent_service.model.base import ChatModel
from agent_service.model.scripted import ScriptedOrderModel
from agent_service.orders.base import OrderSystem
from agent_service.orders.memory import MemoryOrderSystem
from agent_service.orders.postgres import PostgresOrderSystem
from agent_service.runtime import SYSTEM_PROMPT, RuntimeSettings, TurnRunner
from agent_service.servicer import AgentServicer
from agent_service.state_client import StateClient
from agent_service.tools.orders import cancel_order_tool, query_order_tool
from agent_service.tools.registry import Tool, ToolRegistry
from agent_service.tools.skills import load_skill_tool
from agent_service.turns import TurnRegistry
from agentstate.agent.v1 import agent_service_pb2 as pb
from agentstate.agent.v1 import agent_service_pb2_grpc as pb_grpc
from agentstate.common import service_config, telemetry
from agentstate.common.grpc_server import (
    add_health_and_reflection,
    bind,
    create_server,
    install_stop_signals,
    set_serving,
)

log = logging.getLogger(__name__)

SERVICE_NAME = pb.DESCRIPTOR.services_by_name["AgentService"].full_name
# After the grace period, interrupted turns get this long to save before being cancelled.
_INTERRUPT_SAVE_SECONDS = 5.0


def build_model(settings: AgentServiceSettings) -> ChatModel:
    if settings.model == "openai":
        from agent_service.model.openai_compat import OpenAICompatModel

        return OpenAICompatModel.from_env(os.environ)
    return ScriptedOrderModel(settings.scripted_step_delay_seconds)


def build_tools(orders: OrderSystem, extra: Sequence[Tool] = ()) -> ToolRegistry:
    return ToolRegistry(
        [load_skill_tool(), query_order_tool(orders), cancel_order_tool(orders), *extra]
    )


class AgentServiceApp:
    def __init__(
        self,
        settings: AgentServiceSettings,
        model: ChatModel | None = None,
        middlewares: tuple[ContextMiddleware, ...] | None = None,
        extra_tools: Sequence[Tool] = (),
    ) -> None:
        self.settings = settings
        self._extra_tools = extra_tools
        self._model = model
        self._middlewares = DEFAULT_MIDDLEWARES if middlewares is None else middlewares
        self.registry = TurnRegistry()
        self.orders: OrderSystem | None = None
        self._channel: grpc.aio.Channel | None = None
        self._server: grpc.aio.Server | None = None
        self._health: Any = None
        self.runner: TurnRunner | None = None

    async def start(self) -> str:
        settings = self.settings
        limit = settings.grpc_max_message_bytes
        self._channel = grpc.aio.insecure_channel(
            settings.state_address,
            interceptors=telemetry.grpc_client_interceptors(),
            options=[
                ("grpc.max_receive_message_length", limit),
                ("grpc.max_send_message_length", limit),
                # The sidecar restarting is routine: reconnect quickly, not after gRPC's
                # default backoff of up to two minutes.
                ("grpc.initial_reconnect_backoff_ms", 100),
                ("grpc.min_reconnect_backoff_ms", 100),
                ("grpc.max_reconnect_backoff_ms", 2000),
                # Reads are retried on UNAVAILABLE (agentstate/service_config.json).
                *service_config.channel_options(),
            ],
        )
        state = StateClient(self._channel, timeout_seconds=settings.state_timeout_seconds)
        if settings.orders_database_url:
            self.orders = PostgresOrderSystem(settings.orders_database_url)
        else:
            self.orders = MemoryOrderSystem()
        await self.orders.open()
        model = self._model or build_model(settings)
        self.runner = runner = TurnRunner(
            state=state,
            model=model,
            context=ContextManager(
                ContextSettings(
                    budget_tokens=settings.context_budget_tokens,
                    trim_at=settings.trim_at,
                    compact_at=settings.compact_at,
                    keep_cycles=settings.keep_tool_cycles,
                    max_state_bytes=settings.state_max_bytes,
                ),
                make_counter(settings.tokenizer, model.name),  # its family picks the table
                model.summarize,
                SYSTEM_PROMPT,
            ),
            tools=build_tools(self.orders, self._extra_tools),
            settings=RuntimeSettings(
                holder=settings.replica_name,
                lease_ttl_ms=int(settings.lease_ttl_seconds * 1000),
                lease_renew_seconds=settings.lease_renew_seconds,
                max_turns_per_user=settings.max_turns_per_user,
                card_ttl_seconds=settings.card_ttl_seconds,
                max_steps=settings.max_steps,
                trace_user_id=settings.trace_user_id,
            ),
            registry=self.registry,
            middlewares=self._middlewares,
        )
        server = create_server(
            max_message_bytes=limit, interceptors=telemetry.grpc_server_interceptors()
        )
        pb_grpc.add_AgentServiceServicer_to_server(AgentServicer(runner, state), server)
        self._health = add_health_and_reflection(server, [SERVICE_NAME])
        address = bind(server, settings.listen_address)
        await server.start()
        self._server = server
        await set_serving(self._health, [SERVICE_NAME])
        log.info(
            "agent service listening on %s (state service %s, model %s)",
            address,
            settings.state_address,
            settings.model,
        )
        return address

    async def stop(self) -> None:
        """Stop taking turns; let running ones finish within the grace period;
        interrupt the rest (they save their state with shutdown_interrupted=true)."""
        self.registry.draining = True
        if self._health is not None:
            await self._health.enter_graceful_shutdown()
        tasks = [task for _, task in self.registry.running()]
        if tasks:
            log.info(
                "waiting up to %ss for %d running turns",
                self.settings.shutdown_grace_seconds,
                len(tasks),
            )
            _, pending = await asyncio.wait(tasks, timeout=self.settings.shutdown_grace_seconds)
            if pending:
                for control, _ in self.registry.running():
                    control.request_stop("the service is shutting down", shutdown=True)
                _, pending = await asyncio.wait(pending, timeout=_INTERRUPT_SAVE_SECONDS)
            for task in pending:  # stuck in a model or tool call: cancel; it still saves
                task.cancel()
            if pending:
                await asyncio.wait(pending, timeout=_INTERRUPT_SAVE_SECONDS)
        if self._server is not None:
            await self._server.stop(2.0)  # lets the last events of interrupted turns go out
        if self.orders is not None:
            await self.orders.close()
        if self._channel is not None:
            await self._channel.close(None)
        log.info("agent service stopped")


async def serve(settings: AgentServiceSettings) -> None:
    stop = asyncio.Event()
    install_stop_signals(stop)
    app = AgentServiceApp(settings)
    await app.start()
    await stop.wait()
    await app.stop()
