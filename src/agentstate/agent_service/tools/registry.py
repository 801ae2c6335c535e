"""The tool registry: what a tool is, who may run it without asking, and argument checks
(the tool's JSON Schema, Draft 2020-12, with jsonschema)."""

from __future__ import annotations

import enum
import functools
import re
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import orjson
from jsonschema import Draft202012Validator, TypeChecker, validators
from jsonschema.exceptions import SchemaError, best_match
from jsonschema.exceptions import ValidationError as JsonSchemaError
from jsonschema.protocols import Validator

from agentstate.agent_service.model.base import ToolSpec


class Permission(enum.StrEnum):
    ALLOW = "allow"  # runs as soon as the model asks
    ASK = "ask"  # needs the user's approval on a confirmation card


@dataclass(frozen=True)
class ToolContext:
    """What a tool is told about the call it runs.

    `idempotency_key` is the key to give any side effect (a cancellation, a payment):
    the runtime derives it from what the service owns, the conversation, the stored
    assistant message holding the call and the call's position in it
    (`idempotency_key_of`), never from the model provider's call id, which some
    providers repeat across responses. A retry of the same stored call (a Confirm
    answered again after a crash or a shutdown cut the call off) gets the same key and
    so replays; every other call gets a key of its own. `call_id` is the id the call is
    stored and shown under, for logs and messages only.
    """

    user_id: str
    conversation_id: str
    call_id: str
    idempotency_key: str


def idempotency_key_of(conversation_id: str, message_id: str, position: int) -> str:
    """The key of the tool_use block at `position` in the stored assistant message
    `message_id` of conversation `conversation_id` (see ToolContext)."""
    return f"{conversation_id}:{message_id}:{position}"


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


def _is_integer(checker: TypeChecker, value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


# Draft 2020-12, except that 5.0 is not an "integer": tools index and slice with these
# values, and JSON Schema's own rule would hand them a float.
ArgumentValidator: type[Validator] = validators.extend(  # type: ignore[no-untyped-call]
    Draft202012Validator,
    type_checker=Draft202012Validator.TYPE_CHECKER.redefine("integer", _is_integer),
)

# The problems reported in one tool result: enough to fix the call in one go.
MAX_PROBLEMS = 5

_TYPE_NAMES = {
    "string": "字符串",
    "integer": "整数",
    "number": "数字",
    "boolean": "布尔值",
    "object": "对象",
    "array": "数组",
    "null": "null",
}

# Keyword -> how its failure reads; {arg} is the argument, {rule} the keyword's value.
_MESSAGES = {
    "const": "{arg}只能是 {rule_json}",
    "pattern": "{arg}的格式不对，应匹配正则 {rule}",
    "minimum": "{arg}不能小于 {rule}",
    "maximum": "{arg}不能大于 {rule}",
    "exclusiveMinimum": "{arg}必须大于 {rule}",
    "exclusiveMaximum": "{arg}必须小于 {rule}",
    "multipleOf": "{arg}必须是 {rule} 的倍数",
    "minLength": "{arg}至少要 {rule} 个字符",
    "maxLength": "{arg}最多 {rule} 个字符",
    "minItems": "{arg}至少要有 {rule} 项",
    "maxItems": "{arg}最多只能有 {rule} 项",
    "uniqueItems": "{arg}里不能有重复项",
    "minProperties": "{arg}至少要有 {rule} 个字段",
    "maxProperties": "{arg}最多只能有 {rule} 个字段",
}


def check_tool_schema(spec: ToolSpec) -> None:
    """A tool's parameters must be a valid JSON Schema (Draft 2020-12): checked once, at
    registration, so a broken tool fails at start-up rather than on the model's first call."""
    try:
        ArgumentValidator.check_schema(spec.parameters)
    except SchemaError as exc:
        raise ValueError(f"tool {spec.name!r}: invalid parameters schema: {exc.message}") from None


@functools.lru_cache(maxsize=256)
def _validator(schema_json: bytes) -> Validator:
    return ArgumentValidator(orjson.loads(schema_json))


def check_arguments(spec: ToolSpec, arguments: dict[str, Any]) -> dict[str, Any]:
    """Validate the model's arguments against the tool's JSON Schema; apply top-level
    defaults. ArgumentError names each problem with its argument path, in Chinese, as the
    tool result the model reads."""
    schema = spec.parameters
    validator = _validator(orjson.dumps(schema, option=orjson.OPT_SORT_KEYS))
    errors = sorted(validator.iter_errors(arguments), key=lambda e: [str(p) for p in e.path])
    if errors:
        problems = list(dict.fromkeys(_describe(best_match([e])) for e in errors))
        more = f"（另有 {len(problems) - MAX_PROBLEMS} 处）" if len(problems) > MAX_PROBLEMS else ""
        raise ArgumentError(f"{spec.name}：{'；'.join(problems[:MAX_PROBLEMS])}{more}")
    checked = dict(arguments)
    for name, rules in schema.get("properties", {}).items():
        if name not in checked and isinstance(rules, dict) and "default" in rules:
            checked[name] = rules["default"]
    return checked


def _path(parts: Iterable[str | int]) -> str:
    """An argument path as the model wrote it: `items[0].sku`."""
    text = ""
    for part in parts:
        text += f"[{part}]" if isinstance(part, int) else f".{part}" if text else str(part)
    return text


def _json(value: object) -> str:
    return orjson.dumps(value).decode()


def _describe(error: JsonSchemaError) -> str:
    path = list(error.absolute_path)
    arg = f"参数 {_path(path)} " if path else "参数"
    rule: Any = error.validator_value
    value: Any = error.instance
    keyword = str(error.validator)
    if keyword == "required":
        missing = [name for name in rule if isinstance(value, dict) and name not in value]
        return "缺少必填参数 " + "、".join(_path([*path, name]) for name in missing)
    if keyword in ("additionalProperties", "unevaluatedProperties") and rule is False:
        schema = error.schema if isinstance(error.schema, dict) else {}
        known = schema.get("properties", {})
        patterns = schema.get("patternProperties", {})
        extra = [
            name
            for name in value
            if name not in known and not any(re.search(p, name) for p in patterns)
        ]
        return "不认识的参数 " + "、".join(_path([*path, name]) for name in extra)
    got = f"，收到 {_json(value)}" if not isinstance(value, dict | list) else ""
    if keyword == "type":
        kinds = [rule] if isinstance(rule, str) else list(rule)
        return f"{arg}应为{'或'.join(_TYPE_NAMES.get(k, k) for k in kinds)}{got}"
    if keyword == "enum":
        return f"{arg}只能是 {'、'.join(_json(v) for v in rule)} 之一{got}"
    template = _MESSAGES.get(keyword)
    if template is not None:
        return template.format(arg=arg, rule=rule, rule_json=_json(rule)) + got
    return f"{arg}不符合要求（{keyword}）：{error.message}"


class ToolRegistry:
    def __init__(self, tools: Iterable[Tool] = ()) -> None:
        self._tools: dict[str, Tool] = {}
        for tool in tools:
            self.register(tool)

    def register(self, tool: Tool) -> None:
        check_tool_schema(tool.spec)
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
