"""JSON text kept as the caller sent it: checks and spans, never a re-serialisation.

The fidelity rule (docs/architecture.md): a payload is stored as its text, so what a
caller reads back is what it wrote: `\\u0000` escapes, number spellings (`1e21`,
`-0.0`, integers above 2**53), key order, duplicate keys, non-BMP characters and
escapes. The text must be JSON as Python's `json` module reads it: RFC 8259 plus the
tokens `NaN`, `Infinity` and `-Infinity`, which `json.dumps` writes (SQLiteSession
stores them, so a drop-in backend must too). Where the service computes over JSON (a
top-level merge, a state's "context" array), it works on the spans of the members it
touches and copies every other byte as it came.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from functools import lru_cache
from json.decoder import scanstring  # type: ignore[attr-defined]
from typing import Any

from agentstate.state_service.domain.errors import InvalidArgument

_DECODER = json.JSONDecoder()
_WS = re.compile(r"[ \t\n\r]*")


class _Bad(ValueError):
    pass


def _decode(data: bytes, what: str) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InvalidArgument(
            f"{what} is not UTF-8 text: {exc.reason} at byte {exc.start}"
        ) from None


def _value_end(text: str, start: int) -> tuple[Any, int]:
    try:
        return _DECODER.raw_decode(text, start)
    except json.JSONDecodeError as exc:
        raise _Bad(f"{exc.msg} at character {exc.pos}") from None


def _ws(text: str, at: int) -> int:
    match = _WS.match(text, at)
    assert match is not None
    return match.end()


@dataclass(frozen=True)
class Member:
    """One member of an object: its key (decoded) and its value's exact text; for the
    key `members(split=...)` names, when its value is an array, each element's text."""

    key: str
    value: str
    parsed: Any
    elements: tuple[str, ...] | None = None


def _array(text: str, start: int) -> tuple[list[Any], tuple[str, ...], int]:
    """The array at `start` ('['): its elements parsed, their texts, and its end. One
    pass, so a state's context is parsed once (not as a value and then per element)."""
    at = _ws(text, start + 1)
    parsed: list[Any] = []
    spans: list[str] = []
    if text[at : at + 1] == "]":
        return parsed, (), at + 1
    while True:
        value, end = _value_end(text, at)
        parsed.append(value)
        spans.append(text[at:end])
        at = _ws(text, end)
        following = text[at : at + 1]
        if following == ",":
            at = _ws(text, at + 1)
            continue
        if following == "]":
            return parsed, tuple(spans), at + 1
        raise _Bad(f"expecting ',' or ']' at character {at}")


def check_json(data: bytes, expected: type, what: str) -> Any:
    """Refuse text that is not one JSON value of the expected type (dict, list, or
    object for any); return the value parsed. Nothing is normalised or stored from it."""
    text = _decode(data, what)
    try:
        start = _ws(text, 0)
        value, end = _value_end(text, start)
        if _ws(text, end) != len(text):
            raise _Bad(f"extra data at character {_ws(text, end)}")
    except _Bad as exc:
        raise InvalidArgument(f"{what} is not JSON: {exc}; nothing was stored") from None
    if expected is not object and not isinstance(value, expected):
        kind = "object" if expected is dict else "array"
        raise InvalidArgument(f"{what} must be a JSON {kind}")
    return value


def members(data: bytes, what: str, split: str | None = None) -> list[Member]:
    """The members of a JSON object in the order written (duplicates kept), each
    value's text exactly as written; the member named `split`, when an array, with
    its elements' texts too. Refuses what check_json refuses."""
    text = _decode(data, what)
    found: list[Member] = []
    try:
        at = _ws(text, 0)
        if text[at : at + 1] != "{":
            raise InvalidArgument(f"{what} must be a JSON object")
        at = _ws(text, at + 1)
        if text[at : at + 1] == "}":
            at += 1
        else:
            while True:
                if text[at : at + 1] != '"':
                    raise _Bad(f"expecting a key in double quotes at character {at}")
                try:
                    key, at = scanstring(text, at + 1)
                except json.JSONDecodeError as exc:
                    raise _Bad(f"{exc.msg} at character {exc.pos}") from None
                at = _ws(text, at)
                if text[at : at + 1] != ":":
                    raise _Bad(f"expecting ':' at character {at}")
                start = _ws(text, at + 1)
                if key == split and text[start : start + 1] == "[":
                    value, spans, end = _array(text, start)
                    found.append(Member(key, text[start:end], value, spans))
                else:
                    value, end = _value_end(text, start)
                    found.append(Member(key, text[start:end], value))
                at = _ws(text, end)
                if text[at : at + 1] == ",":
                    at = _ws(text, at + 1)
                    continue
                if text[at : at + 1] == "}":
                    at += 1
                    break
                raise _Bad(f"expecting ',' or '}}' at character {at}")
        if _ws(text, at) != len(text):
            raise _Bad(f"extra data at character {_ws(text, at)}")
    except _Bad as exc:
        raise InvalidArgument(f"{what} is not JSON: {exc}; nothing was stored") from None
    return found


def elements(text: str) -> list[str]:
    """The elements of a JSON array's text (already checked), each exactly as written."""
    at = _ws(text, 0)
    assert text[at] == "["
    at = _ws(text, at + 1)
    found: list[str] = []
    if text[at] == "]":
        return found
    while True:
        start = at
        _, end = _value_end(text, start)
        found.append(text[start:end])
        at = _ws(text, end)
        if text[at] == ",":
            at = _ws(text, at + 1)
            continue
        return found


@lru_cache(maxsize=4096)  # a state's keys are few and the same on every save
def key_text(key: str) -> str:
    """A key's JSON spelling where the service writes one itself (a merge): as
    json.dumps and PostgreSQL's escape_json both spell it."""
    try:
        key.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate: only its escape is UTF-8
        return json.dumps(key)
    return json.dumps(key, ensure_ascii=False)


def object_text(parts: list[tuple[str, str]]) -> str:
    """An object written from (key text, value text) pairs: ", " and ": " between them,
    as json.dumps and jsonb print."""
    return "{" + ", ".join(f"{k}: {v}" for k, v in parts) + "}"


def merge_text(old: bytes | None, delta: bytes, what: str) -> bytes:
    """The object `old` with `delta`'s members set at the top level, as dict.update
    does: a key already there keeps its place and takes the new value; a new key goes
    at the end. Every value is copied as written; only the separators between the
    top-level members are the service's own (", " and ": ")."""
    merged: dict[str, tuple[str, str]] = {}
    for source in (old, delta):
        if source is None:
            continue
        for member in members(source, what):
            merged[member.key] = (key_text(member.key), member.value)
    return object_text(list(merged.values())).encode()
