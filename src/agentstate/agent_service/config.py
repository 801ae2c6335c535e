"""Agent service settings: one declaration each, read from environment variables
(docs/reference/settings.md).

The OpenAI-compatible model's own settings (OPENAI_*) are OpenAISettings, in
agent_service/model/openai_compat.py: they are read only when AGENT_MODEL=openai.
"""

from __future__ import annotations

import os
import socket
from typing import Annotated, Literal, Self

from pydantic import AfterValidator, BeforeValidator, Field, SecretStr, model_validator
from pydantic_settings import NoDecode

from agentstate.common.config import EnvSettings, casefold_choice

MIB = 1024 * 1024

ModelKind = Annotated[Literal["scripted", "openai"], BeforeValidator(casefold_choice)]
TokenizerKind = Annotated[
    Literal["auto", "o200k_base", "cl100k_base", "estimate"], BeforeValidator(casefold_choice)
]
TraceUserId = Annotated[Literal["hash", "plain", "omit"], BeforeValidator(casefold_choice)]
AuthMode = Annotated[Literal["jwt", "proxy", "dev-header"], BeforeValidator(casefold_choice)]
# Public-key algorithms only: with HS* a verifier holding a public key could be fooled by a
# token MAC'ed with that public key (algorithm confusion); `none` is no signature at all.
JWT_ALGORITHMS = frozenset(
    {"RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "ES512", "EdDSA"}
)
# The shortest AGENT_PROXY_SECRET accepted: a guessable shared secret is no check at all.
MIN_PROXY_SECRET_CHARS = 32


def _algorithm_list(value: object) -> object:
    if isinstance(value, str):
        return tuple(part.strip() for part in value.split(",") if part.strip())
    return value


def _check_algorithms(value: tuple[str, ...]) -> tuple[str, ...]:
    bad = [name for name in value if name not in JWT_ALGORITHMS]
    if bad or not value:
        raise ValueError(
            f"allows {', '.join(bad) or 'nothing'}; use public-key algorithms among "
            f"{', '.join(sorted(JWT_ALGORITHMS))} (never none or HS*)"
        )
    return value


# NoDecode: a comma-separated list, not JSON.
JwtAlgorithms = Annotated[
    tuple[str, ...], NoDecode, BeforeValidator(_algorithm_list), AfterValidator(_check_algorithms)
]
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

    # ---- identity of the end user (agent_service/auth.py; docs/authentication.md)
    auth_mode: AuthMode = Field(
        default="jwt",
        validation_alias="AGENT_AUTH_MODE",
        description=(
            "how the end user is identified: jwt (a signed token), proxy (the header from "
            "an authenticating proxy) or dev-header (the bare header: development only)"
        ),
    )
    jwt_issuer: str = Field(
        default="",
        validation_alias="AGENT_JWT_ISSUER",
        description="jwt: the required `iss` claim",
    )
    jwt_audience: str = Field(
        default="",
        validation_alias="AGENT_JWT_AUDIENCE",
        description="jwt: the `aud` value the token must carry",
    )
    jwt_jwks_url: str = Field(
        default="",
        validation_alias="AGENT_JWT_JWKS_URL",
        description="jwt: the issuer's JWKS URL (fetched and cached); or AGENT_JWT_KEY_FILE",
    )
    jwt_key_file: str = Field(
        default="",
        validation_alias="AGENT_JWT_KEY_FILE",
        description="jwt: a JWKS JSON file or a PEM public key; or AGENT_JWT_JWKS_URL",
    )
    jwt_algorithms: JwtAlgorithms = Field(
        default=("RS256", "ES256"),
        validation_alias="AGENT_JWT_ALGORITHMS",
        description="jwt: accepted signature algorithms, comma-separated (public-key only)",
        json_schema_extra={"shown_default": "RS256,ES256"},
    )
    jwt_leeway_seconds: float = Field(
        default=30.0,
        validation_alias="AGENT_JWT_LEEWAY_SECONDS",
        ge=0,
        le=300,
        description="jwt: clock skew allowed on exp, nbf and iat",
    )
    jwt_user_claim: str = Field(
        default="sub",
        validation_alias="AGENT_JWT_USER_CLAIM",
        description="jwt: the claim that holds the user id",
    )
    jwt_jwks_cache_seconds: float = Field(
        default=300.0,
        validation_alias="AGENT_JWT_JWKS_CACHE_SECONDS",
        ge=1,
        description="jwt: how long fetched keys are kept (an unknown `kid` refetches sooner)",
    )
    proxy_secret: SecretStr = Field(
        default=SecretStr(""),
        validation_alias="AGENT_PROXY_SECRET",
        description=(
            f"proxy: the value the proxy sends in agentstate-proxy-secret "
            f"(at least {MIN_PROXY_SECRET_CHARS} characters)"
        ),
        json_schema_extra={"shown_default": "empty"},
    )

    # ---- transport security (docs/security.md)
    tls_cert_file: str = Field(
        default="",
        validation_alias="AGENT_TLS_CERT_FILE",
        description="PEM certificate chain to serve TLS (1.2+) with, reloaded when the file "
        "changes; empty: plaintext",
    )
    tls_key_file: str = Field(
        default="",
        validation_alias="AGENT_TLS_KEY_FILE",
        description="PEM private key of AGENT_TLS_CERT_FILE",
    )
    tls_client_ca_file: str = Field(
        default="",
        validation_alias="AGENT_TLS_CLIENT_CA_FILE",
        description="PEM CA bundle: every client (the proxy, the console) must present a "
        "certificate it signed (mTLS); empty: no client certificates",
    )
    state_tls_ca_file: str = Field(
        default="",
        validation_alias="AGENT_STATE_TLS_CA_FILE",
        description="TLS to the state service, its certificate checked against this PEM CA "
        "bundle; empty (and no other AGENT_STATE_TLS_* set): plaintext (the sidecar)",
    )
    state_tls_cert_file: str = Field(
        default="",
        validation_alias="AGENT_STATE_TLS_CERT_FILE",
        description="PEM client certificate the agent presents to a state service with mTLS",
    )
    state_tls_key_file: str = Field(
        default="",
        validation_alias="AGENT_STATE_TLS_KEY_FILE",
        description="PEM private key of AGENT_STATE_TLS_CERT_FILE",
    )
    state_tls_server_name: str = Field(
        default="",
        validation_alias="AGENT_STATE_TLS_SERVER_NAME",
        description="the name the state service's certificate must carry when it is not "
        "the address's host",
    )
    state_token_file: str = Field(
        default="",
        validation_alias="AGENT_STATE_TOKEN_FILE",
        description="file holding a service token sent to the state service as "
        "authorization: Bearer (read again when it changes; needs TLS)",
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
