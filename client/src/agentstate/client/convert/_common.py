"""What every aggregate's conversions share: the Op, JSON bytes, the two time conversions."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Generic, TypeVar

from google.protobuf.message import Message
from google.protobuf.timestamp_pb2 import Timestamp

R = TypeVar("R")


Payload = bytes | Mapping[str, Any]


@dataclass(frozen=True)
class Op(Generic[R]):
    method: str  # the StateService RPC
    request: Message
    parse: Callable[[Any], R]


def json_bytes(value: Any) -> bytes:
    """Compact UTF-8 JSON; NaN and infinities are refused (they are not JSON)."""
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode()


def payload_bytes(payload: Payload) -> bytes:
    """A state payload as UTF-8 JSON bytes (a mapping is serialised)."""
    return payload if isinstance(payload, bytes) else json_bytes(payload)


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def time_of(value: Timestamp) -> datetime:
    # As value.ToDatetime(tzinfo=UTC) (microseconds, nanos truncated), at half its cost:
    # a page of items holds two times per item.
    return _EPOCH + timedelta(seconds=value.seconds, microseconds=value.nanos // 1000)


def timestamp_of(value: datetime) -> Timestamp:
    # As Timestamp.FromDatetime (a naive time is UTC), built from integers.
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    since = value - _EPOCH
    return Timestamp(seconds=since.days * 86400 + since.seconds, nanos=since.microseconds * 1000)
