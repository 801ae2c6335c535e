"""Where the state service is and how long a call may take, from the environment."""

from __future__ import annotations

from pydantic import Field

from agentstate.common.config import EnvSettings

DEFAULT_ADDRESS = "127.0.0.1:50051"
DEFAULT_TIMEOUT_SECONDS = 10.0


class ClientSettings(EnvSettings):
    """`ClientSettings.from_env()` reads the AGENTSTATE_* variables; keyword arguments
    read none."""

    state_address: str = Field(
        default=DEFAULT_ADDRESS,
        validation_alias="AGENTSTATE_STATE_ADDRESS",
        description="the state service: host:port, or unix:///absolute/path.sock",
    )
    state_timeout_seconds: float = Field(
        default=DEFAULT_TIMEOUT_SECONDS,
        validation_alias="AGENTSTATE_STATE_TIMEOUT_SECONDS",
        gt=0,
        description="deadline of each call unless the call passes its own timeout",
    )
    max_message_bytes: int = Field(
        default=16 * 1024 * 1024,
        validation_alias="AGENTSTATE_STATE_MAX_MESSAGE_BYTES",
        ge=1024,
        description="gRPC message size limit of the client's channel, both directions",
    )
