"""Agent service settings. Every one comes from an environment variable (see README)."""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass, field

from agentstate.common.config import ConfigError, env_choice, env_float, env_int, env_str

MIB = 1024 * 1024


def _default_replica_name() -> str:
    return f"{socket.gethostname()}-{os.getpid()}"


@dataclass(frozen=True)
class AgentServiceSettings:
    # AGENT_LISTEN_ADDRESS: host:port, or unix:///absolute/path.sock.
    listen_address: str = "127.0.0.1:50061"
    # AGENT_STATE_ADDRESS: where the state service listens (the sidecar).
    state_address: str = "127.0.0.1:50051"
    # AGENT_STATE_TIMEOUT_SECONDS: deadline of each state service call.
    state_timeout_seconds: float = 10.0
    # AGENT_PROFILE: empty (no business tools), a registered name such as order_demo, or
    # MODULE:ATTRIBUTE; see agent_service/profile.py.
    profile: str = ""
    # AGENT_MODEL: scripted (offline default) or openai (OPENAI_* variables).
    model: str = "scripted"
    # AGENT_SCRIPTED_STEP_DELAY_SECONDS: simulated latency of each scripted model call.
    scripted_step_delay_seconds: float = 0.0
    # AGENT_REPLICA_NAME: recorded on run leases; default hostname-pid.
    replica_name: str = field(default_factory=_default_replica_name)
    # AGENT_LEASE_TTL_SECONDS / AGENT_LEASE_RENEW_SECONDS: run lease lifetime and heartbeat.
    lease_ttl_seconds: float = 15.0
    lease_renew_seconds: float = 2.0
    # AGENT_MAX_TURNS_PER_USER: concurrent turns per user (RESOURCE_EXHAUSTED above).
    max_turns_per_user: int = 5
    # AGENT_CARD_TTL_SECONDS: how long a confirmation card can be answered.
    card_ttl_seconds: float = 900.0
    # AGENT_MAX_STEPS: model calls per turn at most.
    max_steps: int = 8
    # AGENT_SHUTDOWN_GRACE_SECONDS: time running turns get after SIGTERM before interruption.
    shutdown_grace_seconds: float = 10.0
    # AGENT_GRPC_MAX_MESSAGE_BYTES: gRPC message limit (server and state client).
    grpc_max_message_bytes: int = 16 * MIB
    # AGENT_CONTEXT_BUDGET_TOKENS: the model's context budget.
    context_budget_tokens: int = 32_000
    # AGENT_TOKENIZER: auto (by model family), o200k_base, cl100k_base or estimate.
    tokenizer: str = "auto"
    # AGENT_TRIM_AT / AGENT_COMPACT_AT: shares of the budget that start trimming / compaction.
    trim_at: float = 0.5
    compact_at: float = 0.8
    # AGENT_KEEP_TOOL_CYCLES: finished tool cycles never trimmed, besides the current turn.
    keep_tool_cycles: int = 3
    # AGENT_STATE_MAX_BYTES: largest state the agent saves (keep <= STATE_MAX_PAYLOAD_BYTES).
    state_max_bytes: int = 8 * MIB
    # AGENT_TRACE_USER_ID: how spans carry the end user: hash (default), plain or omit.
    trace_user_id: str = "hash"

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> AgentServiceSettings:
        env = os.environ if env is None else env
        d = cls()
        settings = cls(
            listen_address=env_str(env, "AGENT_LISTEN_ADDRESS", d.listen_address),
            state_address=env_str(env, "AGENT_STATE_ADDRESS", d.state_address),
            state_timeout_seconds=env_float(
                env, "AGENT_STATE_TIMEOUT_SECONDS", d.state_timeout_seconds, minimum=0.1
            ),
            profile=env_str(env, "AGENT_PROFILE", d.profile),
            model=env_choice(env, "AGENT_MODEL", d.model, ("scripted", "openai")),
            scripted_step_delay_seconds=env_float(
                env, "AGENT_SCRIPTED_STEP_DELAY_SECONDS", d.scripted_step_delay_seconds
            ),
            replica_name=env_str(env, "AGENT_REPLICA_NAME", d.replica_name)[:200],
            lease_ttl_seconds=env_float(
                env, "AGENT_LEASE_TTL_SECONDS", d.lease_ttl_seconds, minimum=1.0
            ),
            lease_renew_seconds=env_float(
                env, "AGENT_LEASE_RENEW_SECONDS", d.lease_renew_seconds, minimum=0.05
            ),
            max_turns_per_user=env_int(
                env, "AGENT_MAX_TURNS_PER_USER", d.max_turns_per_user, minimum=1
            ),
            card_ttl_seconds=env_float(
                env, "AGENT_CARD_TTL_SECONDS", d.card_ttl_seconds, minimum=0.1
            ),
            max_steps=env_int(env, "AGENT_MAX_STEPS", d.max_steps, minimum=1),
            shutdown_grace_seconds=env_float(
                env, "AGENT_SHUTDOWN_GRACE_SECONDS", d.shutdown_grace_seconds
            ),
            grpc_max_message_bytes=env_int(
                env, "AGENT_GRPC_MAX_MESSAGE_BYTES", d.grpc_max_message_bytes, minimum=1024
            ),
            context_budget_tokens=env_int(
                env, "AGENT_CONTEXT_BUDGET_TOKENS", d.context_budget_tokens, minimum=1000
            ),
            tokenizer=env_choice(
                env,
                "AGENT_TOKENIZER",
                d.tokenizer,
                ("auto", "o200k_base", "cl100k_base", "estimate"),
            ),
            trim_at=env_float(env, "AGENT_TRIM_AT", d.trim_at, minimum=0.05),
            compact_at=env_float(env, "AGENT_COMPACT_AT", d.compact_at, minimum=0.1),
            keep_tool_cycles=env_int(env, "AGENT_KEEP_TOOL_CYCLES", d.keep_tool_cycles),
            trace_user_id=env_choice(
                env, "AGENT_TRACE_USER_ID", d.trace_user_id, ("hash", "plain", "omit")
            ),
            state_max_bytes=env_int(env, "AGENT_STATE_MAX_BYTES", d.state_max_bytes, minimum=4096),
        )
        if not settings.trim_at < settings.compact_at <= 1.0:
            raise ConfigError("need AGENT_TRIM_AT < AGENT_COMPACT_AT <= 1")
        if settings.lease_renew_seconds >= settings.lease_ttl_seconds:
            raise ConfigError(
                "AGENT_LEASE_RENEW_SECONDS must be shorter than AGENT_LEASE_TTL_SECONDS"
            )
        return settings
