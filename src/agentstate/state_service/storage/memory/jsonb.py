"""What the in-memory store does in place of PostgreSQL's JSON functions: jsonb's text
rendering, imitated, and the state delta applied to it."""

from __future__ import annotations

import json
from decimal import Decimal
from typing import Any

from agentstate.state_service import domain as d
from agentstate.state_service.domain import (
    StateDelta,
)


def apply_delta(stored: bytes, delta: StateDelta, max_state_bytes: int | None) -> bytes:
    """The stored state (jsonb's text) after `delta`, refused as PostgreSQL's store
    refuses it (see migration 10's agentstate_save_state)."""
    state = d.parse_json(stored)
    context = state.pop("context", [])
    if not isinstance(context, list):
        raise d.context_not_array()
    if delta.drop_head > len(context):
        raise d.delta_out_of_range("drop_head", delta.drop_head, len(context))
    context = context[delta.drop_head :]
    keep = len(context) if delta.replace_from is None else delta.replace_from
    if keep > len(context):
        raise d.delta_out_of_range("replace_from", keep, len(context))
    added = []
    for index, message in enumerate(delta.messages):
        d.check_jsonb(message, object, f"delta.messages[{index}]")
        added.append(d.parse_json(message))
    if delta.fields_json is not None:
        d.check_jsonb(delta.fields_json, dict, "delta.fields_json")
        state = d.parse_json(delta.fields_json)
        if "context" in state:
            raise d.fields_name_context()
    state["context"] = context[:keep] + added
    text = jsonb_text(state)
    if max_state_bytes is not None and len(text) > max_state_bytes:
        raise d.state_too_large(len(text), max_state_bytes)
    return text


def jsonb_text(value: Any) -> bytes:
    """The text PostgreSQL prints for `value` stored as jsonb: object keys shortest
    first then bytewise (the last of duplicate keys kept, as json.loads does), ", "
    and ": " separators, numbers as numeric prints them. The in-memory store returns
    states in this form, so both stores answer GetState with the same bytes."""
    parts: list[str] = []
    _jsonb_text(value, parts)
    return "".join(parts).encode()


def _jsonb_key(key: str) -> tuple[int, bytes]:
    raw = key.encode()
    return (len(raw), raw)


def _jsonb_text(value: Any, out: list[str]) -> None:
    if value is None:
        out.append("null")
    elif value is True:
        out.append("true")
    elif value is False:
        out.append("false")
    elif isinstance(value, str):
        # json.dumps escapes exactly what PostgreSQL's escape_json does.
        out.append(json.dumps(value, ensure_ascii=False))
    elif isinstance(value, Decimal | int):
        number = Decimal(value)
        out.append(format(abs(number) if number.is_zero() else number, "f"))
    elif isinstance(value, float):
        _jsonb_text(Decimal(repr(value)), out)
    elif isinstance(value, list):
        out.append("[")
        for index, item in enumerate(value):
            if index:
                out.append(", ")
            _jsonb_text(item, out)
        out.append("]")
    elif isinstance(value, dict):
        out.append("{")
        for index, key in enumerate(sorted(value, key=_jsonb_key)):
            if index:
                out.append(", ")
            out.append(json.dumps(key, ensure_ascii=False))
            out.append(": ")
            _jsonb_text(value[key], out)
        out.append("}")
    else:
        raise TypeError(f"not a JSON value: {type(value).__name__}")
