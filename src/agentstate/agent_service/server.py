"""Assemble and run the agent service: state client, profile, model, tools, runtime, gRPC."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Sequence
from typing import Any

import grpc
from grpc_health.v1 import health_pb2

from agentstate.agent.v1 import agent_service_pb2 as pb
from agentstate.agent.v1 import agent_service_pb2_grpc as pb_grpc
from agentstate.agent_service.auth import MAX_METADATA_BYTES, build_authenticator
from agentstate.agent_service.client_state_port import ClientStatePort
from agentstate.agent_service.config import AgentServiceSettings
from agentstate.agent_service.context.manager import ContextManager, ContextSettings
from agentstate.agent_service.context.tokens import make_counter
from agentstate.agent_service.middleware import DEFAULT_MIDDLEWARES, ContextMiddleware
from agentstate.agent_service.model.base import ChatModel
from agentstate.agent_service.profile import Profile
from agentstate.agent_service.runtime import LeaseSettings, RuntimeSettings, TurnRunner
from agentstate.agent_service.servicer import AgentServicer
from agentstate.agent_service.state_health import LIVENESS_SERVICE, StateHealthWatch
from agentstate.agent_service.tools.registry import Tool, ToolRegistry
from agentstate.agent_service.tools.skills import load_skill_tool
from agentstate.agent_service.turns import TurnRegistry
from agentstate.client import service_config
from agentstate.client.tls import ChannelSecurity
from agentstate.common import telemetry
from agentstate.common.config import ConfigError
from agentstate.common.grpc_server import (
    add_health_and_reflection,
    bind,
    create_server,
    install_stop_signals,
    set_serving,
)
from agentstate.common.listen import check_listen_address
from agentstate.common.tls import server_tls

log = logging.getLogger(__name__)

SERVICE_NAME = pb.DESCRIPTOR.services_by_name["AgentService"].full_name
LISTEN_SETTING = "AGENT_LISTEN_ADDRESS"
# After the grace period, interrupted turns get this long to save before being cancelled.
_INTERRUPT_SAVE_SECONDS = 5.0


def build_model(settings: AgentServiceSettings, profile: Profile) -> ChatModel:
    if settings.model == "openai":
        from agentstate.agent_service.model.openai_compat import OpenAICompatModel

        return OpenAICompatModel.from_env(os.environ)
    return profile.scripted_model(settings.scripted_step_delay_seconds)


def build_tools(profile: Profile, extra: Sequence[Tool] = ()) -> ToolRegistry:
    """The profile's tools, and load_skill over its handbooks when it has any."""
    skills = profile.skills()
    tools = [*profile.tools(), *extra]
    for tool in tools:
        # Such a tool is offered only once its handbook is loaded: without one, never.
        if tool.skill is not None and tool.skill not in skills:
            raise ConfigError(
                f"profile {profile.name!r}: tool {tool.name!r} needs the handbook "
                f"{tool.skill!r}, which the profile does not have"
            )
    return ToolRegistry([load_skill_tool(skills), *tools] if skills else tools)


def state_security(settings: AgentServiceSettings) -> ChannelSecurity:
    """TLS to the state service as AGENT_STATE_TLS_* say (plaintext when none is set);
    ConfigError naming the variables when they do not go together."""
    try:
        security = ChannelSecurity(
            ca_file=settings.state_tls_ca_file,
            cert_file=settings.state_tls_cert_file,
            key_file=settings.state_tls_key_file,
            server_name=settings.state_tls_server_name,
            token_file=settings.state_token_file,
        )
        security.credentials()  # the files are read now: a missing one fails the start
    except ValueError as exc:
        raise ConfigError(f"AGENT_STATE_TLS_* / AGENT_STATE_TOKEN_FILE: {exc}") from None
    return security


def state_channel(
    address: str, max_message_bytes: int, security: ChannelSecurity | None = None
) -> grpc.aio.Channel:
    """The agent's channel to the state service: the sidecar (127.0.0.1:port, unix:///...)
    or central replicas behind a name (dns:///state.NAMESPACE.svc:port), over which the
    service config's round_robin spreads the calls; TLS when `security` says so."""
    credentials = security.credentials() if security is not None else None
    options = [
        *(security.options() if security is not None else []),
        ("grpc.max_receive_message_length", max_message_bytes),
        ("grpc.max_send_message_length", max_message_bytes),
        # The sidecar restarting is routine: reconnect quickly, not after gRPC's
        # default backoff of up to two minutes.
        ("grpc.initial_reconnect_backoff_ms", 100),
        ("grpc.min_reconnect_backoff_ms", 100),
        ("grpc.max_reconnect_backoff_ms", 2000),
        # A dns:/// name is resolved again when a connection ends (a replica gone, or
        # recycled by STATE_GRPC_MAX_CONNECTION_AGE_SECONDS): at most every 2 s, not
        # gRPC's default 30 s, so new replicas are found soon after.
        ("grpc.dns_min_time_between_resolutions_ms", 2000),
        # Reads are retried on UNAVAILABLE; round_robin (agentstate/client/service_config.json).
        *service_config.channel_options(),
    ]
    interceptors = telemetry.grpc_client_interceptors()
    if credentials is not None:
        return grpc.aio.secure_channel(
            address, credentials, options=options, interceptors=interceptors
        )
    return grpc.aio.insecure_channel(address, options=options, interceptors=interceptors)


class AgentServiceApp:
    def __init__(
        self,
        settings: AgentServiceSettings,
        profile: Profile,
        model: ChatModel | None = None,
        middlewares: tuple[ContextMiddleware, ...] | None = None,
        extra_tools: Sequence[Tool] = (),
    ) -> None:
        self.settings = settings
        self.profile = profile
        self._extra_tools = extra_tools
        self._model = model
        self._middlewares = DEFAULT_MIDDLEWARES if middlewares is None else middlewares
        self.registry = TurnRegistry()
        self._profile_open = False
        self._channel: grpc.aio.Channel | None = None
        self._server: grpc.aio.Server | None = None
        self._health: Any = None
        self._state_watch: asyncio.Task[None] | None = None
        self.runner: TurnRunner | None = None

    async def start(self) -> str:
        settings = self.settings
        profile = self.profile
        tools = build_tools(profile, self._extra_tools)  # a bad profile fails before any I/O
        check_listen_address(settings.listen_address, LISTEN_SETTING)  # so does a port in use
        auth = build_authenticator(settings)  # so does incomplete authentication
        tls = server_tls(
            "AGENT", settings.tls_cert_file, settings.tls_key_file, settings.tls_client_ca_file
        )
        security = state_security(settings)  # and TLS files that do not go together
        limit = settings.grpc_max_message_bytes
        self._channel = state_channel(settings.state_address, limit, security)
        state = ClientStatePort.on_channel(
            self._channel, timeout_seconds=settings.state_timeout_seconds
        )
        await profile.open()
        self._profile_open = True
        model = self._model or build_model(settings, profile)
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
                profile.system_prompt,
            ),
            tools=tools,
            settings=RuntimeSettings(
                lease=LeaseSettings(
                    holder=settings.replica_name,
                    ttl_ms=int(settings.lease_ttl_seconds * 1000),
                    renew_seconds=settings.lease_renew_seconds,
                    max_turns_per_user=settings.max_turns_per_user,
                ),
                card_ttl_seconds=settings.card_ttl_seconds,
                max_steps=settings.max_steps,
                trace_user_id=settings.trace_user_id,
            ),
            registry=self.registry,
            middlewares=self._middlewares,
            system_prompt=profile.system_prompt,
        )
        server = create_server(
            max_message_bytes=limit,
            interceptors=telemetry.grpc_server_interceptors(),
            max_metadata_bytes=MAX_METADATA_BYTES,
        )
        pb_grpc.add_AgentServiceServicer_to_server(AgentServicer(runner, state, auth), server)
        self._health = add_health_and_reflection(server, [SERVICE_NAME])
        address = bind(server, settings.listen_address, LISTEN_SETTING, tls)
        await server.start()
        self._server = server
        await self._health.set(LIVENESS_SERVICE, health_pb2.HealthCheckResponse.SERVING)
        # Readiness (overall and AgentService) follows the state service's health.
        watch = StateHealthWatch(self._channel, settings.state_address, self._state_changed)
        await watch.first(settings.state_timeout_seconds)
        self._state_watch = asyncio.create_task(watch.run())
        log.info(
            "agent service listening on %s (state service %s, profile %s, model %s, auth %s)",
            address,
            settings.state_address,
            profile.name or "none",
            model.name,
            auth.mode,
        )
        return address

    async def _state_changed(self, serving: bool) -> None:
        await set_serving(self._health, [SERVICE_NAME], serving=serving)

    async def stop(self) -> None:
        """Stop taking turns; let running ones finish within the grace period;
        interrupt the rest (they save their state with shutdown_interrupted=true)."""
        self.registry.draining = True
        if self._state_watch is not None:
            self._state_watch.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._state_watch
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
        if self._profile_open:
            self._profile_open = False
            await self.profile.close()
        if self._channel is not None:
            await self._channel.close(None)
        if self._server is not None:  # not after a start that failed
            log.info("agent service stopped")


async def serve(settings: AgentServiceSettings, profile: Profile) -> None:
    stop = asyncio.Event()
    install_stop_signals(stop)
    app = AgentServiceApp(settings, profile)
    try:
        await app.start()
    except BaseException:
        await app.stop()  # whatever it had opened (the profile's resources, say)
        raise
    await stop.wait()
    await app.stop()
