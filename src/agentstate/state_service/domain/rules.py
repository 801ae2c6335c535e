"""Input rules every aggregate shares: ids, pages, text, and JSON's shape and depth."""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from decimal import Decimal
from itertools import accumulate
from typing import Any, Generic, TypeVar

from agentstate.state_service.domain.errors import InvalidArgument

MAX_USER_ID_CHARS = 128


MAX_ID = 2**63 - 1


_DECIMAL_ID_RE = re.compile(r"[1-9][0-9]{0,18}")


# A JSON text whose value is an object starts with "{" after optional whitespace.
JSON_OBJECT_START = re.compile(rb"[ \t\r\n]*\{")


JSON_ARRAY_START = re.compile(rb"[ \t\r\n]*\[")


T = TypeVar("T")


@dataclass(frozen=True)
class Page(Generic[T]):
    items: list[T]
    next_page_token: str


def validate_user_id(user_id: str) -> str:
    if not user_id:
        raise InvalidArgument("user_id is required")
    if len(user_id) > MAX_USER_ID_CHARS:
        raise InvalidArgument(f"user_id is longer than {MAX_USER_ID_CHARS} characters")
    if not user_id.isprintable():
        raise InvalidArgument("user_id must contain only printable characters")
    return user_id


def parse_id(value: str, what: str) -> int:
    """Parse a server-generated id written as a positive decimal 64-bit integer."""
    if not value:
        raise InvalidArgument(f"{what} is required")
    if not _DECIMAL_ID_RE.fullmatch(value) or int(value) > MAX_ID:
        raise InvalidArgument(f"{what} {value[:40]!r} is not a positive 64-bit decimal id")
    return int(value)


def check_no_nul(text: str, what: str) -> str:
    """PostgreSQL text cannot hold U+0000: refuse it rather than fail in the database."""
    if "\x00" in text:
        raise InvalidArgument(f"{what} must not contain NUL (U+0000) characters")
    return text


def check_json_bytes(data: bytes, what: str) -> None:
    # A raw NUL byte is never part of JSON text, and PostgreSQL's text protocol would
    # silently cut the value at it: refuse it instead of storing a truncated value.
    if b"\x00" in data:
        raise InvalidArgument(
            f"{what} contains a NUL byte (0x00), which JSON text cannot hold; nothing was stored"
        )


# Deeper JSON is refused (INVALID_ARGUMENT): a value may sit inside at most this many
# nested arrays and objects. Deep enough for any real state, and far below where
# PostgreSQL's parser runs out of stack (about 13,000 levels).
MAX_JSON_DEPTH = 512


_NOT_BRACKETS = bytes(c for c in range(256) if c not in b"[]{}")


_DEPTH_STEP = [0] * 256


for _opening in b"[{":
    _DEPTH_STEP[_opening] = 1


for _closing in b"]}":
    _DEPTH_STEP[_closing] = -1


def json_depth(data: bytes) -> int:
    """The deepest nesting of arrays and objects in JSON text (brackets inside strings
    do not count). Linear in the size, without decoding: strings are cut out with byte
    operations that run in C."""
    unescaped = data.replace(b"\\\\", b"").replace(b'\\"', b"")
    outside_strings = b"".join(unescaped.split(b'"')[0::2])
    brackets = outside_strings.translate(None, _NOT_BRACKETS)
    return max(accumulate(map(_DEPTH_STEP.__getitem__, brackets)), default=0)


def may_exceed_depth(data: bytes, limit: int = MAX_JSON_DEPTH) -> bool:
    """False when the text cannot nest deeper than `limit` (it has too few brackets)."""
    return data.count(b"[") + data.count(b"{") > limit


def check_json_depth(data: bytes, what: str, limit: int = MAX_JSON_DEPTH) -> None:
    if may_exceed_depth(data, limit) and json_depth(data) > limit:
        raise too_deep(what, limit)


def too_deep(what: str, limit: int = MAX_JSON_DEPTH) -> InvalidArgument:
    within = " (counted from the top of the state)" if limit < MAX_JSON_DEPTH else ""
    return InvalidArgument(
        f"{what} nests arrays and objects more than {limit} levels deep{within}; nothing was stored"
    )


def page_size(requested: int, *, default: int, maximum: int) -> int:
    if requested < 0:
        raise InvalidArgument("page_size must not be negative")
    if requested == 0:
        return default
    return min(requested, maximum)


def parse_page_token(token: str) -> int | None:
    if not token:
        return None
    try:
        return parse_id(token, "page_token")
    except InvalidArgument:
        raise InvalidArgument("page_token is malformed: pass back a next_page_token") from None


def check_text(value: str, what: str, max_chars: int, *, required: bool = False) -> str:
    """An id-like text field: bounded, no NUL (PostgreSQL text cannot hold it)."""
    if required and not value:
        raise InvalidArgument(f"{what} is required")
    if len(value) > max_chars:
        raise InvalidArgument(f"{what} is longer than {max_chars} characters")
    return check_no_nul(value, what)


def jsonb_problem(data: bytes, expected: type) -> str | None:
    """Why PostgreSQL would refuse this as a jsonb object (dict), array (list) or any
    value (object), if it would. Only for small JSON (records), the in-memory store
    and error paths: it decodes in Python."""
    try:
        value = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        return str(exc)
    if not isinstance(value, expected):
        return "it must be a JSON " + ("object" if expected is dict else "array")
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            if "\x00" in item:
                return "unsupported Unicode escape sequence: \\u0000 cannot be converted to text"
            try:
                item.encode("utf-8")
            except UnicodeEncodeError:
                return "invalid Unicode surrogate escape"
        elif isinstance(item, float) and not math.isfinite(item):
            return "NaN and Infinity are not JSON that jsonb can hold"
        elif isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return None


def check_jsonb(data: bytes, expected: type, what: str) -> None:
    problem = jsonb_problem(data, expected)
    if problem is not None:
        if problem.startswith("it must be"):
            kind = "object" if expected is dict else "array"
            raise InvalidArgument(f"{what} must be a JSON {kind}")
        raise InvalidArgument(f"{what} is not JSON that PostgreSQL can store: {problem}")


def parse_json(data: bytes) -> Any:
    """JSON text as Python values, numbers as Decimal (exactly as written)."""
    return json.loads(data, parse_float=Decimal, parse_int=Decimal)
