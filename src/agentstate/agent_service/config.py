"""Agent service settings: one declaration each, read from environment variables (README).

The OpenAI-compatible model's own settings (OPENAI_*) are OpenAISettings, in
agent_service/model/openai_compat.py: they are read only when AGENT_MODEL=openai.
"""

from __future__ import annotations

import os
import socket
from typing import Annotated, Literal, Self

from pydantic import AfterValidator, BeforeValidator, Field, model_validator

from agentstate.common.config import EnvSettings, casefold_choice

MIB = 1024 * 1024

ModelKind = Annotated[Literal["scripted", "openai"], BeforeValidator(casefold_choice)]
TokenizerKind = Annotated[
    Literal["auto", "o200k_base", "cl100k_base", "estimate"], BeforeValidator(casefold_choice)
]
TraceUserId = Annotated[Literal["hash", "plain", "omit"], BeforeValidator(casefold_choice)]
# Recorded on run leases; a pod name can be longer than the column is useful.
ReplicaName = Annotated[str, AfterValidator(lambda name: name[:200])]


def _default_replica_name() -> str:
    return f"{socket.gethostname()}-{os.getpid()}"


class AgentServiceSettings(EnvSettings):
    listen_address: str = Field(
        default="127.0.0.1:50061",
        validation_alias="AGENT_LISTEN_ADDRESS",
        description="host:port, or unix:///absolute/path.sock",
    )
    state_address: str = Field(
        default="127.0.0.1:50051",
        validation_alias="AGENT_STATE_ADDRESS",
        description="where the state service listens (the sidecar)",
    )
    state_timeout_seconds: float = Field(
        default=10.0,
        validation_alias="AGENT_STATE_TIMEOUT_SECONDS",
        ge=0.1,
        description="deadline of each state service call",
    )
    profile: str = Field(
        default="",
        validation_alias="AGENT_PROFILE",
        description=(
            "empty (no business tools), a registered profile name such as order_demo, "
            "or MODULE:ATTRIBUTE (agent_service/profile.py)"
        ),
    )
    model: ModelKind = Field(
        default="scripted",
        validation_alias="AGENT_MODEL",
        description="scripted (offline, deterministic) or openai (OPENAI_* variables)",
    )
    scripted_step_delay_seconds: float = Field(
        default=0.0,
        validation_alias="AGENT_SCRIPTED_STEP_DELAY_SECONDS",
        ge=0,
        description="simulated latency of each scripted model call",
    )
    replica_name: ReplicaName = Field(
        default_factory=_default_replica_name,
        validation_alias="AGENT_REPLICA_NAME",
        description="recorded on run leases",
        json_schema_extra={"shown_default": "hostname-pid"},
    )
    lease_ttl_seconds: float = Field(
        default=15.0,
        validation_alias="AGENT_LEASE_TTL_SECONDS",
        ge=1.0,
        description="run lease lifetime",
    )
    lease_renew_seconds: float = Field(
        default=2.0,
        validation_alias="AGENT_LEASE_RENEW_SECONDS",
        ge=0.05,
        description="run lease heartbeat (also how fast a Stop from another replica lands)",
    )
    max_turns_per_user: int = Field(
        default=5,
        validation_alias="AGENT_MAX_TURNS_PER_USER",
        ge=1,
        description="concurrent turns per user (RESOURCE_EXHAUSTED above)",
    )
    card_ttl_seconds: float = Field(
        default=900.0,
        validation_alias="AGENT_CARD_TTL_SECONDS",
        ge=0.1,
        description="how long a confirmation card can be answered",
    )
    max_steps: int = Field(
        default=8,
        validation_alias="AGENT_MAX_STEPS",
        ge=1,
        description="model calls per turn at most",
    )
    shutdown_grace_seconds: float = Field(
        default=10.0,
        validation_alias="AGENT_SHUTDOWN_GRACE_SECONDS",
        ge=0,
        description="time running turns get after SIGTERM before they are interrupted",
    )
    grpc_max_message_bytes: int = Field(
        default=16 * MIB,
        validation_alias="AGENT_GRPC_MAX_MESSAGE_BYTES",
        ge=1024,
        description="gRPC message limit (server and state client)",
    )
    context_budget_tokens: int = Field(
        default=32_000,
        validation_alias="AGENT_CONTEXT_BUDGET_TOKENS",
        ge=1000,
        description="the model's context budget",
    )
    tokenizer: TokenizerKind = Field(
        default="auto",
        validation_alias="AGENT_TOKENIZER",
        description="auto (by model family), o200k_base, cl100k_base or estimate",
    )
    trim_at: float = Field(
        default=0.5,
        validation_alias="AGENT_TRIM_AT",
        ge=0.05,
        description="share of the budget that starts trimming old tool output",
    )
    compact_at: float = Field(
        default=0.8,
        validation_alias="AGENT_COMPACT_AT",
        ge=0.1,
        description="share of the budget that starts compaction",
    )
    keep_tool_cycles: int = Field(
        default=3,
        validation_alias="AGENT_KEEP_TOOL_CYCLES",
        ge=0,
        description="finished tool cycles never trimmed, besides the current turn",
    )
    state_max_bytes: int = Field(
        default=8 * MIB,
        validation_alias="AGENT_STATE_MAX_BYTES",
        ge=4096,
        description="largest state the agent saves (keep <= STATE_MAX_PAYLOAD_BYTES)",
    )
    trace_user_id: TraceUserId = Field(
        default="hash",
        validation_alias="AGENT_TRACE_USER_ID",
        description="how spans carry the end user: hash, plain or omit",
    )

    @model_validator(mode="after")
    def _consistent(self) -> Self:
        if not self.trim_at < self.compact_at <= 1.0:
            raise ValueError("need AGENT_TRIM_AT < AGENT_COMPACT_AT <= 1")
        if self.lease_renew_seconds >= self.lease_ttl_seconds:
            raise ValueError(
                "AGENT_LEASE_RENEW_SECONDS must be shorter than AGENT_LEASE_TTL_SECONDS"
            )
        return self
