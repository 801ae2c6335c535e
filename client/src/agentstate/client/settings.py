"""Where the state service is and how long a call may take, from the environment.

The client distribution needs no settings library, so ClientSettings is a frozen dataclass
with the conventions of the servers' settings (agentstate.common.config): each field names
its environment variable and description, `from_env` reads exactly those variables (an
empty one means the default), and a bad value is a ConfigError whose one-line message names
the variable. Keyword arguments read no environment and are checked the same way.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Mapping
from dataclasses import MISSING, dataclass, field, fields
from typing import TYPE_CHECKING, Any, Self

if TYPE_CHECKING:
    # Only for the annotation: loading the settings must not import grpc (a test checks).
    from agentstate.client.tls import ChannelSecurity

DEFAULT_ADDRESS = "127.0.0.1:50051"
DEFAULT_TIMEOUT_SECONDS = 10.0
DEFAULT_MAX_MESSAGE_BYTES = 16 * 1024 * 1024


class ConfigError(ValueError):
    """A setting's environment variable holds a value that cannot be used."""


@dataclass(frozen=True)
class Setting:
    """What a field declares: its variable, its description, the check of its value."""

    variable: str
    description: str
    check: Callable[[Any], str | None] = lambda value: None  # the complaint, or None


def _setting(default: Any, variable: str, description: str, **check: Any) -> Any:
    return field(default=default, metadata={"setting": Setting(variable, description, **check)})


def _number_above(bound: float) -> Callable[[Any], str | None]:
    def check(value: Any) -> str | None:
        if not math.isfinite(value):
            return "is not a finite number"
        return None if value > bound else f"must be greater than {bound:g}"

    return check


def _integer_from(bound: int) -> Callable[[Any], str | None]:
    return lambda value: None if value >= bound else f"must be at least {bound}"


def _on_off(value: Any) -> str | None:
    return None if value in ("on", "off") else "must be one of on, off"


@dataclass(frozen=True, kw_only=True)
class ClientSettings:
    """`ClientSettings.from_env()` reads the AGENTSTATE_* variables; keyword arguments
    read none."""

    state_address: str = _setting(
        DEFAULT_ADDRESS,
        "AGENTSTATE_STATE_ADDRESS",
        "the state service: host:port, or unix:///absolute/path.sock",
    )
    state_timeout_seconds: float = _setting(
        DEFAULT_TIMEOUT_SECONDS,
        "AGENTSTATE_STATE_TIMEOUT_SECONDS",
        "deadline of each call unless the call passes its own timeout",
        check=_number_above(0),
    )
    max_message_bytes: int = _setting(
        DEFAULT_MAX_MESSAGE_BYTES,
        "AGENTSTATE_STATE_MAX_MESSAGE_BYTES",
        "gRPC message size limit of the client's channel, both directions",
        check=_integer_from(1024),
    )
    state_tls: str = _setting(
        "off",
        "AGENTSTATE_STATE_TLS",
        "on: TLS to the state service, checked against the system's CAs unless "
        "AGENTSTATE_STATE_TLS_CA_FILE is set (any AGENTSTATE_STATE_TLS_* file also turns it on)",
        check=_on_off,
    )
    state_tls_ca_file: str = _setting(
        "",
        "AGENTSTATE_STATE_TLS_CA_FILE",
        "PEM CA bundle the state service's certificate must chain to",
    )
    state_tls_cert_file: str = _setting(
        "",
        "AGENTSTATE_STATE_TLS_CERT_FILE",
        "PEM client certificate, for a state service with mTLS",
    )
    state_tls_key_file: str = _setting(
        "", "AGENTSTATE_STATE_TLS_KEY_FILE", "PEM private key of AGENTSTATE_STATE_TLS_CERT_FILE"
    )
    state_tls_server_name: str = _setting(
        "",
        "AGENTSTATE_STATE_TLS_SERVER_NAME",
        "the name the state service's certificate must carry, when it is not the address's host",
    )
    state_token_file: str = _setting(
        "",
        "AGENTSTATE_STATE_TOKEN_FILE",
        "file holding a service token sent as authorization: Bearer (read again when it "
        "changes; needs TLS)",
    )

    def security(self) -> ChannelSecurity:
        """The channel security these settings describe (plaintext unless a TLS setting
        is set); ValueError when they do not go together."""
        from agentstate.client.tls import ChannelSecurity

        return ChannelSecurity(
            tls=self.state_tls == "on",
            ca_file=self.state_tls_ca_file,
            cert_file=self.state_tls_cert_file,
            key_file=self.state_tls_key_file,
            server_name=self.state_tls_server_name,
            token_file=self.state_token_file,
        )

    def __post_init__(self) -> None:
        problems = []
        for f in fields(self):
            setting: Setting = f.metadata["setting"]
            value = getattr(self, f.name)
            kind = _parser(f.type)
            if kind is float and isinstance(value, int) and not isinstance(value, bool):
                value = float(value)  # timeout_seconds=5 means 5.0
                object.__setattr__(self, f.name, value)
            if not isinstance(value, kind) or isinstance(value, bool):
                problems.append(f"{f.name}={value!r} is not {_KINDS[kind]}")
            elif (complaint := setting.check(value)) is not None:
                problems.append(f"{f.name}={value!r} {complaint}")
        if problems:
            raise ValueError("; ".join(problems))

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Self:
        """The settings from `env` (default os.environ); ConfigError names a bad variable."""
        env = os.environ if env is None else env
        values: dict[str, Any] = {}
        problems = []
        for f in fields(cls):
            setting: Setting = f.metadata["setting"]
            raw = env.get(setting.variable, "").strip()
            if not raw:  # unset or empty: the default
                continue
            parse = _parser(f.type)
            try:
                value = parse(raw)
            except ValueError:
                problems.append(f"{setting.variable}={raw!r} is not {_KINDS[parse]}")
                continue
            complaint = setting.check(value)
            if complaint is not None:
                # A bad bound shows the number as given; anything else is quoted.
                number = isinstance(value, int | float)
                shown = raw if number and math.isfinite(value) else repr(raw)
                problems.append(f"{setting.variable}={shown} {complaint}")
                continue
            values[f.name] = value
        if problems:
            raise ConfigError("; ".join(problems))
        return cls(**values)

    @classmethod
    def variables(cls) -> dict[str, Setting]:
        """Environment variable name -> its declaration, in declaration order."""
        return {f.metadata["setting"].variable: f.metadata["setting"] for f in fields(cls)}

    @classmethod
    def documented_defaults(cls) -> dict[str, str]:
        """Environment variable name -> its default as docs/reference/settings.md writes it."""
        shown = {}
        for f in fields(cls):
            default = f.default
            assert default is not MISSING
            if isinstance(default, float) and default.is_integer():
                default = int(default)
            shown[f.metadata["setting"].variable] = str(default) if default != "" else "empty"
        return shown


_KINDS: dict[type, str] = {str: "a string", float: "a number", int: "an integer"}


def _parser(annotation: object) -> type:
    """The type a field's annotation names (annotations are strings here)."""
    return {"str": str, "float": float, "int": int}[str(annotation)]
