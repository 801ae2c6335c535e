"""Settings: declared once (pydantic-settings), documented exactly, errors name the variable."""

from __future__ import annotations

import dataclasses
import os
import re

import pytest
from pydantic import ValidationError

from agentstate.agent_service.cli import CliSettings
from agentstate.agent_service.config import AgentServiceSettings
from agentstate.agent_service.model.openai_compat import OpenAISettings
from agentstate.client import ClientSettings
from agentstate.common.config import DATA_DIR_RULE, ConfigError, EnvSettings
from agentstate.common.telemetry import LoggingSettings
from agentstate.console.config import ConsoleSettings
from agentstate.examples.order_demo.profile import OrderDemoSettings
from agentstate.state_service.config import StateServiceSettings
from tests.support import paths
from tests.support.settings_doc import documented_settings

# The client distribution has no pydantic: ClientSettings is a dataclass with the same
# variables(), documented_defaults() and from_env() (agentstate.client.settings).
Declared = type[EnvSettings] | type[ClientSettings]

# The tables of docs/reference/settings.md, by heading, and what declares them.
TABLES: dict[str, list[Declared]] = {
    "State service": [StateServiceSettings],
    "Agent service": [AgentServiceSettings, OpenAISettings],
    "Both services": [LoggingSettings],
    "Command-line client": [CliSettings],
    "Order demo profile": [OrderDemoSettings],
    "Python client": [ClientSettings],
    "Web console": [ConsoleSettings],
}
SETTINGS_CLASSES = [cls for classes in TABLES.values() for cls in classes]


def test_the_reference_has_exactly_these_tables() -> None:
    assert sorted(documented_settings()) == sorted(TABLES)


@pytest.mark.parametrize("table", TABLES)
def test_the_reference_lists_exactly_the_declared_settings_with_their_defaults(
    table: str,
) -> None:
    documented = documented_settings()[table]
    declared: dict[str, str] = {}
    for cls in TABLES[table]:
        declared.update(cls.documented_defaults())
    assert sorted(documented) == sorted(declared), "docs and code list different variables"
    wrong = {
        name: (documented[name], declared[name])
        for name in declared
        if documented[name] != declared[name]
    }
    assert not wrong, f"documented default != declared default: {wrong}"


@pytest.mark.parametrize("cls", SETTINGS_CLASSES, ids=lambda cls: cls.__name__)
def test_every_setting_is_declared_with_a_variable_and_a_description(cls: Declared) -> None:
    variables = cls.variables()
    fields = cls.model_fields if issubclass(cls, EnvSettings) else dataclasses.fields(cls)
    assert len(variables) == len(fields)
    for name, info in variables.items():
        assert re.fullmatch(r"[A-Z][A-Z0-9_]*", name), name
        assert info.description, f"{name} has no description"


def test_from_env_reads_every_variable_and_keeps_defaults_for_empty_ones() -> None:
    settings = StateServiceSettings.from_env(
        {
            "STATE_LISTEN_ADDRESS": " unix:///run/state.sock ",
            "STATE_STORE": "Memory",  # choices are case-insensitive
            "STATE_DB_POOL_MAX_SIZE": "3",
            "STATE_DB_POOL_TIMEOUT_SECONDS": "0.5",
            "STATE_MIGRATE_ON_START": "off",
            "STATE_RETENTION_DAYS": "",  # empty: the default
            "UNRELATED": "ignored",
        }
    )
    assert settings.listen_address == "unix:///run/state.sock"
    assert settings.store == "memory"
    assert settings.pool_max_size == 3
    assert settings.pool_timeout_seconds == 0.5
    assert settings.migrate_on_start is False
    assert settings.retention_days == 0.0
    agent = AgentServiceSettings.from_env(
        {"AGENT_REPLICA_NAME": "r" * 300, "AGENT_TOKENIZER": "ESTIMATE", "AGENT_TRIM_AT": "0.3"}
    )
    assert agent.replica_name == "r" * 200  # a lease holder name is cut, not refused
    assert agent.tokenizer == "estimate"
    assert agent.trim_at == 0.3


@pytest.mark.parametrize(
    ("cls", "env", "message"),
    [
        (
            StateServiceSettings,
            {"STATE_DB_POOL_MAX_SIZE": "many"},
            "STATE_DB_POOL_MAX_SIZE='many' is not an integer",
        ),
        (
            StateServiceSettings,
            {"STATE_DB_POOL_MAX_SIZE": "0"},
            "STATE_DB_POOL_MAX_SIZE=0 must be at least 1",
        ),
        (
            StateServiceSettings,
            {"STATE_DB_CONNECT_TIMEOUT_SECONDS": "soon"},
            "STATE_DB_CONNECT_TIMEOUT_SECONDS='soon' is not a number",
        ),
        (
            StateServiceSettings,
            {"STATE_RETENTION_DAYS": "inf"},
            "STATE_RETENTION_DAYS='inf' is not a finite number",
        ),
        (
            StateServiceSettings,
            {"STATE_MIGRATE_ON_START": "maybe"},
            "STATE_MIGRATE_ON_START='maybe' is not a boolean (use true or false)",
        ),
        (
            StateServiceSettings,
            {"STATE_EMBEDDED_PG_ENGINE": "docker"},
            "STATE_EMBEDDED_PG_ENGINE='docker' must be one of auto, system, pgserver",
        ),
        (
            AgentServiceSettings,
            {"AGENT_TRIM_AT": "0.9"},
            "need AGENT_TRIM_AT < AGENT_COMPACT_AT <= 1",
        ),
        (
            AgentServiceSettings,
            {"AGENT_LEASE_RENEW_SECONDS": "15"},
            "AGENT_LEASE_RENEW_SECONDS must be shorter than AGENT_LEASE_TTL_SECONDS",
        ),
        (
            AgentServiceSettings,
            {"AGENT_MODEL": "gpt"},
            "AGENT_MODEL='gpt' must be one of scripted, openai",
        ),
        (OpenAISettings, {"OPENAI_API_KEY": " "}, "OPENAI_API_KEY is not set"),
        (
            LoggingSettings,
            {"AGENTSTATE_LOG_LEVEL": "LOUD"},
            "AGENTSTATE_LOG_LEVEL='LOUD' must be one of DEBUG, INFO, WARNING, ERROR, CRITICAL",
        ),
        (
            OpenAISettings,
            {"OPENAI_API_KEY": "k", "OPENAI_TIMEOUT_SECONDS": "0"},
            "OPENAI_TIMEOUT_SECONDS=0 must be greater than 0",
        ),
    ],
)
def test_a_bad_value_is_one_line_naming_the_variable(
    cls: type[EnvSettings], env: dict[str, str], message: str
) -> None:
    with pytest.raises(ConfigError) as raised:
        cls.from_env(env)
    assert message in str(raised.value)
    assert "\n" not in str(raised.value)


def test_the_store_is_explicit() -> None:
    assert StateServiceSettings.from_env({}).store == "embedded"  # the demo's default
    url = "postgresql://agentstate@db/agentstate"
    chosen = StateServiceSettings.from_env({"STATE_STORE": "postgres", "DATABASE_URL": url})
    assert (chosen.store, chosen.database_url) == ("postgres", url)
    with pytest.raises(ConfigError, match="STATE_STORE=postgres needs DATABASE_URL"):
        StateServiceSettings.from_env({"STATE_STORE": "postgres", "DATABASE_URL": "  "})
    for store in ("embedded", "memory"):
        with pytest.raises(ConfigError, match=f"DATABASE_URL is set but STATE_STORE={store}"):
            StateServiceSettings.from_env({"STATE_STORE": store, "DATABASE_URL": url})
    with pytest.raises(ValidationError):  # keyword construction follows the same rule
        StateServiceSettings(database_url=url)


def test_keyword_construction_reads_no_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tests and in-process services pass values; the runner's environment never leaks in."""
    monkeypatch.setenv("AGENT_MAX_STEPS", "3")
    monkeypatch.setenv("STATE_STORE", "memory")
    assert AgentServiceSettings(listen_address="127.0.0.1:0").max_steps == 8
    assert StateServiceSettings().store == StateServiceSettings.from_env({}).store
    assert AgentServiceSettings.from_env().max_steps == 3  # from_env() reads os.environ


def test_settings_are_frozen_and_copied_with_changes() -> None:
    settings = AgentServiceSettings(max_steps=4)
    with pytest.raises(ValidationError):
        settings.max_steps = 5
    changed = settings.model_copy(update={"max_steps": 6})
    assert (settings.max_steps, changed.max_steps) == (4, 6)
    with pytest.raises(ValidationError):
        AgentServiceSettings(max_stpes=4)  # type: ignore[call-arg]  # a typo is an error, not a silent default


@pytest.mark.parametrize("user", [None, "", "alice"])
def test_the_embedded_data_directory_follows_the_rule_the_docs_state(
    user: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    if user is None:
        monkeypatch.delenv("USER", raising=False)
    else:
        monkeypatch.setenv("USER", user)
    owner = user or str(os.getuid())
    assert StateServiceSettings().embedded_pg_dir == f"/var/tmp/agentstate-{owner}/pgdata"
    running = paths.REPO / "docs" / "running.md"
    section = running.read_text().split("\n## Embedded PostgreSQL", 1)[1].split("\n## ", 1)[0]
    stated = " ".join(section.split())
    assert f"The default data directory is `pgdata` in {DATA_DIR_RULE}." in stated
