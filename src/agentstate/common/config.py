"""Settings read from environment variables, declared once with pydantic-settings.

Each setting is one field: its name, type, default, environment variable (the field's
`validation_alias`), constraints (ge, gt, Literal, ...) and description. `from_env` reads
exactly the declared variables from a mapping (os.environ by default); a bad value is a
ConfigError whose one-line message names the variable. Constructing a settings class with
keyword arguments reads no environment at all (tests and in-process services do that).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any, Self

from pydantic import ValidationError
from pydantic.fields import FieldInfo
from pydantic_core import ErrorDetails, PydanticUndefined
from pydantic_settings import (
    BaseSettings,
    EnvSettingsSource,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
)

# One ConfigError for every settings class, the client's (which has no pydantic) included.
from agentstate.client.settings import ConfigError as ConfigError

# The settings reference's way of writing a setting without a default value.
NO_DEFAULT = "—"


def casefold_choice(value: object) -> object:
    """Choices are matched case-insensitively (`STATE_STORE=Memory` works)."""
    return value.lower() if isinstance(value, str) else value


# Where data lives by default, named once; docs/running.md ("Embedded PostgreSQL") quotes it.
DATA_DIR_RULE = (
    "`/var/tmp/agentstate-$USER/`, where `$USER` is the `USER` environment variable or, "
    "when it is unset or empty, the numeric user id (`/var/tmp/agentstate-0/` for root "
    "in a container)"
)


def default_data_dir(name: str) -> str:
    """`name` in the per-user directory of DATA_DIR_RULE: it survives process restarts
    (and, in /var/tmp, reboots), and two users never share it."""
    user = os.environ.get("USER") or str(os.getuid())
    return os.path.join("/var/tmp", f"agentstate-{user}", name)


class _MappingEnvSource(EnvSettingsSource):
    """pydantic-settings' environment source over a given mapping.

    Only the declared variables are looked up, one by one: the mapping need not be
    os.environ, and tests can record which variables a service reads.
    """

    def __init__(self, settings_cls: type[EnvSettings], env: Mapping[str, str]) -> None:
        self._env = env
        self._names = settings_cls.variables()
        super().__init__(settings_cls, case_sensitive=True, env_ignore_empty=True)

    def _load_env_vars(self) -> Mapping[str, str | None]:
        values: dict[str, str | None] = {}
        for name in self._names:
            if name in self._env:
                # Surrounding blanks are dropped; an empty value means "use the default".
                value = self._env[name].strip()
                if value:
                    values[name] = value
        return values


class EnvSettings(BaseSettings):
    """Base of every settings class: frozen, keyword-constructible, read by `from_env`."""

    model_config = SettingsConfigDict(
        frozen=True,
        extra="forbid",
        case_sensitive=True,
        validate_by_name=True,  # keyword arguments use the field names
        validate_by_alias=True,  # from_env passes the variable names
        str_strip_whitespace=True,
        allow_inf_nan=False,  # a NaN timeout or an infinite retention is never meant
    )

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # Keyword arguments only: the environment is read by from_env, from the mapping
        # it is given, so a test's settings never pick up the test runner's variables.
        return (init_settings,)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Self:
        """The settings from `env` (default os.environ); ConfigError names a bad variable."""
        values = _MappingEnvSource(cls, os.environ if env is None else env)()
        try:
            return cls(**values)
        except ValidationError as exc:
            raise ConfigError(describe_errors(cls, exc)) from None

    @classmethod
    def variables(cls) -> dict[str, FieldInfo]:
        """Environment variable name -> its field, in declaration order."""
        return {_variable(name, info): info for name, info in cls.model_fields.items()}

    @classmethod
    def documented_defaults(cls) -> dict[str, str]:
        """Environment variable name -> its default as docs/reference/settings.md writes it."""
        return {name: shown_default(info) for name, info in cls.variables().items()}


def _variable(field_name: str, info: FieldInfo) -> str:
    alias = info.validation_alias
    if not isinstance(alias, str):
        raise TypeError(f"setting {field_name!r} needs validation_alias='ITS_VARIABLE'")
    return alias


def shown_default(info: FieldInfo) -> str:
    """A default as docs/reference/settings.md shows it: `empty`, `true`, `10` (not 10.0),
    or the text declared in json_schema_extra["shown_default"] for a default computed at
    start-up."""
    extra = info.json_schema_extra
    if isinstance(extra, dict) and isinstance(extra.get("shown_default"), str):
        return str(extra["shown_default"])
    default = info.get_default(call_default_factory=False)
    if default is PydanticUndefined:
        return NO_DEFAULT
    if isinstance(default, bool):
        return str(default).lower()
    if isinstance(default, float) and default.is_integer():
        return str(int(default))
    if default == "":
        return "empty"
    return str(default)


def _constraint(error: ErrorDetails) -> str | None:
    ctx: dict[str, Any] = dict(error.get("ctx") or {})
    return {
        "int_parsing": "is not an integer",
        "int_from_float": "is not an integer",
        "float_parsing": "is not a number",
        "finite_number": "is not a finite number",
        "bool_parsing": "is not a boolean (use true or false)",
        "greater_than_equal": f"must be at least {ctx.get('ge')}",
        "greater_than": f"must be greater than {ctx.get('gt')}",
        "less_than_equal": f"must be at most {ctx.get('le')}",
        "less_than": f"must be less than {ctx.get('lt')}",
        "literal_error": "must be one of "
        + str(ctx.get("expected")).replace(" or ", ", ").replace("'", ""),
    }.get(error["type"])


def describe_errors(cls: type[EnvSettings], exc: ValidationError) -> str:
    """One line naming each bad variable and what is wrong with it."""
    by_field = {name: _variable(name, info) for name, info in cls.model_fields.items()}
    parts = []
    for error in exc.errors(include_url=False):
        loc = error["loc"]
        if not loc:  # a model validator: the message names its variables itself
            ctx = error.get("ctx") or {}
            parts.append(str(ctx.get("error", error["msg"])))
            continue
        name = by_field.get(str(loc[0]), str(loc[0]))
        if error["type"] == "missing":
            info = cls.variables().get(name)
            why = f" ({info.description})" if info is not None and info.description else ""
            parts.append(f"{name} is not set{why}")
            continue
        raw = error["input"]
        # A bad bound shows the number as given; anything else is quoted, blanks visible.
        shown = raw if error["type"].startswith(("greater_than", "less_than")) else repr(raw)
        parts.append(f"{name}={shown} {_constraint(error) or error['msg']}")
    return "; ".join(parts)
