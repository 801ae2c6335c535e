"""The tool registry: what a tool is, who may run it without asking, and argument checks."""

from __future__ import annotations

import enum
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from agent_service.model.base import ToolSpec


class Permission(enum.StrEnum):
    ALLOW = "allow"  # runs as soon as the model asks
    ASK = "ask"  # needs the user's approval on a confirmation card


@dataclass(frozen=True)
class ToolContext:
    user_id: str
    conversation_id: str
    call_id: str  # also the idempotency key of side effects


@dataclass(frozen=True)
class ToolOutput:
    text: str
    ok: bool = True


ToolHandler = Callable[[dict[str, Any], ToolContext], Awaitable[ToolOutput]]


@dataclass(frozen=True)
class Tool:
    spec: ToolSpec
    run: ToolHandler
    permission: Permission = Permission.ALLOW
    # For confirmation cards: a title and labelled fields built from the arguments.
    card_title: Callable[[dict[str, Any]], str] = field(default=lambda args: "")
    card_fields: Callable[[dict[str, Any]], list[tuple[str, str]]] = field(default=lambda args: [])
    # Offered to the model only while this skill's handbook (load_skill) is in the context.
    skill: str | None = None

    @property
    def name(self) -> str:
        return self.spec.name


class ArgumentError(ValueError):
    """The model passed arguments that do not fit the tool's schema."""


_JSON_TYPES: dict[str, tuple[type, ...]] = {
    "string": (str,),
    "integer": (int,),
    "number": (int, float),
    "boolean": (bool,),
    "object": (dict,),
    "array": (list,),
}


def check_arguments(spec: ToolSpec, arguments: dict[str, Any]) -> dict[str, Any]:
    """Check required properties, types and integer bounds; apply defaults."""
    schema = spec.parameters
    properties: dict[str, Any] = schema.get("properties", {})
    checked = dict(arguments)
    for name in schema.get("required", []):
        if name not in checked:
            raise ArgumentError(f"{spec.name}: missing required argument {name!r}")
    for name, rules in properties.items():
        if name not in checked:
            if "default" in rules:
                checked[name] = rules["default"]
            continue
        value = checked[name]
        expected = _JSON_TYPES.get(rules.get("type", ""), (object,))
        if isinstance(value, bool) and bool not in expected:
            raise ArgumentError(f"{spec.name}: argument {name!r} must be {rules['type']}")
        if not isinstance(value, expected):
            raise ArgumentError(f"{spec.name}: argument {name!r} must be {rules['type']}")
        if "minimum" in rules and value < rules["minimum"]:
            raise ArgumentError(f"{spec.name}: argument {name!r} must be >= {rules['minimum']}")
        if "maximum" in rules and value > rules["maximum"]:
            raise ArgumentError(f"{spec.name}: argument {name!r} must be <= {rules['maximum']}")
    if schema.get("additionalProperties") is False:
        unknown = sorted(set(checked) - set(properties))
        if unknown:
            raise ArgumentError(f"{spec.name}: unknown argument(s) {', '.join(unknown)}")
    return checked


class ToolRegistry:
    def __init__(self, tools: Iterable[Tool] = ()) -> None:
        self._tools: dict[str, Tool] = {}
        for tool in tools:
            self.register(tool)

    def register(self, tool: Tool) -> None:
        if tool.name in self._tools:
            raise ValueError(f"tool {tool.name!r} is registered twice")
        self._tools[tool.name] = tool

    def get(self, name: str) -> Tool | None:
        return self._tools.get(name)

    def specs(self, active_skills: set[str] | None = None) -> list[ToolSpec]:
        """The tools to offer: all unbound ones, and bound ones whose skill is active."""
        return [
            tool.spec
            for tool in self._tools.values()
            if tool.skill is None or active_skills is None or tool.skill in active_skills
        ]
