"""The profile seam: what turns the generic agent into a particular one.

The agent service has no business of its own: its runtime runs turns with the
system prompt, tools and model it is given. A profile supplies them: the
system prompt, the business tools (each with its permission: allow, or ask on
a confirmation card), the handbooks that `load_skill` serves, the scripted
model used with AGENT_MODEL=scripted, and open/close for the resources its
tools use (a business system's database, say). A profile reads its own
settings from the environment it is created with.

A tool runs as `run(arguments, context)`: give any side effect it causes
`context.idempotency_key`, which the runtime makes unique for this call of this
conversation and the same for a retry of it (ToolContext, tools/registry.py).

AGENT_PROFILE selects one at start-up:

- empty (the default): no profile. No tools at all, and a scripted model that
  answers generically (`Profile` itself).
- NAME: the profile registered under NAME in the entry-point group
  `agentstate.profiles` (this project registers `order_demo`, examples/order_demo).
- MODULE:ATTRIBUTE: a profile factory in any importable module, for example
  `examples.order_demo:create_profile`.

A factory is called with the environment and returns a Profile. Anything else
is a ConfigError: the service exits with status 2 before it starts.
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Callable, Mapping, Sequence
from importlib import metadata

from agentstate.agent_service.model.base import ChatModel
from agentstate.agent_service.model.scripted import ScriptedModel
from agentstate.agent_service.tools.registry import Tool
from agentstate.common.config import ConfigError

ENTRY_POINT_GROUP = "agentstate.profiles"

GENERIC_SYSTEM_PROMPT = (
    "你是一个助手。只根据对话里已有的信息和工具返回回答，不编造；"
    "会产生影响的操作需要用户在确认卡片上确认。"
)

_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*")
_TARGET = re.compile(r"[A-Za-z_][\w.]*:[A-Za-z_][\w.]*")


class Profile:
    """A profile. This base class, used as is, is the product with no profile."""

    name: str = ""  # "" for no profile; shown in the start-up log
    system_prompt: str = GENERIC_SYSTEM_PROMPT

    def tools(self) -> Sequence[Tool]:
        """The business tools. A tool bound to a skill needs that skill's handbook."""
        return ()

    def skills(self) -> Mapping[str, str]:
        """Handbooks by name, served by `load_skill` (offered only when there are some)."""
        return {}

    def scripted_model(self, step_delay_seconds: float = 0.0) -> ChatModel:
        """The offline model of AGENT_MODEL=scripted."""
        return ScriptedModel(step_delay_seconds)

    async def open(self) -> None:
        """Acquire what the tools use; called before the service takes turns."""

    async def close(self) -> None:
        """Release it; called after the last turn has ended."""


ProfileFactory = Callable[[Mapping[str, str]], Profile]


def load_profile(spec: str, env: Mapping[str, str]) -> Profile:
    """The profile AGENT_PROFILE names, created with `env`. ConfigError when it cannot be."""
    spec = spec.strip()
    if not spec:
        return Profile()
    if ":" in spec:
        factory = _import_target(spec)
    elif _NAME.fullmatch(spec):
        factory = _registered(spec)
    else:
        raise ConfigError(f"AGENT_PROFILE={spec!r}: expected a registered name or MODULE:ATTRIBUTE")
    if not callable(factory):
        raise ConfigError(f"AGENT_PROFILE={spec!r}: {factory!r} is not a profile factory")
    profile = factory(env)
    if not isinstance(profile, Profile):
        raise ConfigError(
            f"AGENT_PROFILE={spec!r}: the factory returned {profile!r}, not a Profile"
        )
    return profile


def registered_profiles() -> dict[str, metadata.EntryPoint]:
    return {ep.name: ep for ep in metadata.entry_points(group=ENTRY_POINT_GROUP)}


def _registered(name: str) -> object:
    registered = registered_profiles()
    entry_point = registered.get(name)
    if entry_point is None:
        known = ", ".join(sorted(registered)) or "none"
        raise ConfigError(
            f"AGENT_PROFILE={name!r}: no profile registered under that name "
            f"(registered: {known}; or give MODULE:ATTRIBUTE)"
        )
    try:
        return entry_point.load()
    except (ImportError, AttributeError) as exc:
        raise ConfigError(
            f"AGENT_PROFILE={name!r}: cannot load {entry_point.value}: {exc}"
        ) from exc


def _import_target(spec: str) -> object:
    if not _TARGET.fullmatch(spec):
        raise ConfigError(f"AGENT_PROFILE={spec!r}: expected MODULE:ATTRIBUTE")
    module_name, _, attribute = spec.partition(":")
    try:
        target: object = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(f"AGENT_PROFILE={spec!r}: cannot import {module_name}: {exc}") from exc
    for part in attribute.split("."):
        try:
            target = getattr(target, part)
        except AttributeError:
            raise ConfigError(f"AGENT_PROFILE={spec!r}: {module_name} has no {attribute}") from None
    return target
