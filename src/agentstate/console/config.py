"""Console settings: one declaration each, read from environment variables
(docs/reference/settings.md)."""

from __future__ import annotations

from typing import Self

from pydantic import Field, SecretStr, model_validator

from agentstate.common.config import EnvSettings


class ConsoleSettings(EnvSettings):
    listen_address: str = Field(
        default="127.0.0.1:8080",
        validation_alias="CONSOLE_LISTEN_ADDRESS",
        description="host:port of the web server (port 0 picks one)",
    )
    agent_address: str = Field(
        default="127.0.0.1:50061",
        validation_alias="CONSOLE_AGENT_ADDRESS",
        description="the agent service",
    )
    state_address: str = Field(
        default="127.0.0.1:50051",
        validation_alias="CONSOLE_STATE_ADDRESS",
        description="the state service (read-only: the inspector)",
    )
    user_header: str = Field(
        default="",
        validation_alias="CONSOLE_USER_HEADER",
        description=(
            "the request header in which a trusted authenticating proxy puts the user "
            "(e.g. X-Forwarded-User); empty when there is no such proxy"
        ),
    )
    dev_user: str = Field(
        default="",
        validation_alias="CONSOLE_DEV_USER",
        description="development only: the user of requests without the proxy's header",
    )
    agent_proxy_secret: SecretStr = Field(
        default=SecretStr(""),
        validation_alias="CONSOLE_AGENT_PROXY_SECRET",
        description=(
            "sent as agentstate-proxy-secret on every agent call when set: the agent's "
            "AGENT_PROXY_SECRET, for an agent in AGENT_AUTH_MODE=proxy (the console is then "
            "its trusted proxy)"
        ),
        json_schema_extra={"shown_default": "empty"},
    )
    rpc_timeout_seconds: float = Field(
        default=10.0,
        validation_alias="CONSOLE_RPC_TIMEOUT_SECONDS",
        ge=0.1,
        description="deadline of each unary gRPC call (streams have none)",
    )
    trace_url_template: str = Field(
        default="",
        validation_alias="CONSOLE_TRACE_URL_TEMPLATE",
        description=(
            "a link to a turn's trace in your tracing UI, {trace_id} replaced by the turn's "
            "trace id (e.g. http://jaeger:16686/trace/{trace_id}); empty shows the id only"
        ),
        json_schema_extra={"shown_default": "empty"},
    )
    history_page_size: int = Field(
        default=20,
        validation_alias="CONSOLE_HISTORY_PAGE_SIZE",
        ge=1,
        le=200,
        description="message records per history page",
    )

    # ---- transport security (docs/security.md)
    tls_cert_file: str = Field(
        default="",
        validation_alias="CONSOLE_TLS_CERT_FILE",
        description="PEM certificate chain to serve HTTPS (TLS 1.2+) with, reloaded when "
        "the file changes; empty: HTTP",
    )
    tls_key_file: str = Field(
        default="",
        validation_alias="CONSOLE_TLS_KEY_FILE",
        description="PEM private key of CONSOLE_TLS_CERT_FILE",
    )
    tls_client_ca_file: str = Field(
        default="",
        validation_alias="CONSOLE_TLS_CLIENT_CA_FILE",
        description="PEM CA bundle: every browser or proxy must present a certificate it "
        "signed (mTLS); empty: no client certificates",
    )
    grpc_tls_ca_file: str = Field(
        default="",
        validation_alias="CONSOLE_GRPC_TLS_CA_FILE",
        description="TLS to the agent and state services, their certificates checked "
        "against this PEM CA bundle; empty: plaintext",
    )
    grpc_tls_cert_file: str = Field(
        default="",
        validation_alias="CONSOLE_GRPC_TLS_CERT_FILE",
        description="PEM client certificate the console presents to services with mTLS",
    )
    grpc_tls_key_file: str = Field(
        default="",
        validation_alias="CONSOLE_GRPC_TLS_KEY_FILE",
        description="PEM private key of CONSOLE_GRPC_TLS_CERT_FILE",
    )

    @model_validator(mode="after")
    def _someone(self) -> Self:
        if not self.user_header and not self.dev_user:
            raise ValueError(
                "set CONSOLE_USER_HEADER (behind an authenticating proxy) or CONSOLE_DEV_USER"
            )
        for prefix, cert, key in (
            ("CONSOLE_TLS", self.tls_cert_file, self.tls_key_file),
            ("CONSOLE_GRPC_TLS", self.grpc_tls_cert_file, self.grpc_tls_key_file),
        ):
            if bool(cert) != bool(key):
                raise ValueError(
                    f"{prefix}_CERT_FILE and {prefix}_KEY_FILE go together: set both, or neither"
                )
        if self.tls_client_ca_file and not self.tls_cert_file:
            raise ValueError(
                "CONSOLE_TLS_CLIENT_CA_FILE needs CONSOLE_TLS_CERT_FILE and CONSOLE_TLS_KEY_FILE "
                "(client certificates are asked for over HTTPS only)"
            )
        return self

    def host_port(self) -> tuple[str, int]:
        host, _, port = self.listen_address.rpartition(":")
        if not host or not port.isdigit():
            raise ValueError(f"CONSOLE_LISTEN_ADDRESS={self.listen_address!r} is not host:port")
        return host, int(port)
