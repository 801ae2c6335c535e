"""LangGraph checkpoints: records, writes, channel values, pages and the metadata filter."""

from __future__ import annotations

import base64
import enum
import json
import math
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from agentstate.state_service.domain.errors import InvalidArgument
from agentstate.state_service.domain.leases import Lease

MAX_CHECKPOINT_ID_CHARS = 256


MAX_NAMESPACE_CHARS = 1024


MAX_SERIALIZER_TAG_CHARS = 64


MAX_TASK_PATH_CHARS = 1024


MAX_CHECKPOINT_WRITES = 1000


MAX_RUN_IDS = 1000


MAX_PRUNE_CONVERSATIONS = 1000


class PruneStrategy(enum.StrEnum):
    KEEP_LATEST = "KEEP_LATEST"
    DELETE_ALL = "DELETE_ALL"


@dataclass(frozen=True)
class ChannelValue:
    channel: str
    version: str
    value_type: str
    value: bytes


@dataclass(frozen=True)
class CheckpointWrite:
    task_id: str
    idx: int
    channel: str
    value_type: str
    value: bytes
    task_path: str = ""


@dataclass(frozen=True)
class NewCheckpoint:
    namespace: str
    checkpoint_id: str
    parent_checkpoint_id: str | None
    checkpoint_type: str
    checkpoint: bytes
    metadata_json: bytes
    channel_versions: dict[str, str]
    new_values: tuple[ChannelValue, ...] = ()

    def run_id(self) -> str | None:
        """The metadata's `run_id` when it is a string (what DeleteCheckpointsForRuns matches)."""
        value = json.loads(self.metadata_json).get("run_id")
        return value if isinstance(value, str) else None


@dataclass(frozen=True)
class CheckpointRunLease:
    """What a put does with the conversation's run lease: take it (`holder`, no
    `task_id`), renew the one `task_id` holds (`ttl_ms` > 0), release it after storing."""

    holder: str = ""
    task_id: int | None = None
    ttl_ms: int = 0
    release: bool = False


@dataclass(frozen=True)
class PutCheckpointResult:
    """A put's create time, and the run lease after it (taken or renewed, not released)."""

    create_time: datetime
    lease: Lease | None = None


def _searchable(value: Any) -> bool:
    if isinstance(value, str):
        return "\x00" not in value and not any("\ud800" <= c <= "\udfff" for c in value)
    if isinstance(value, float):
        return math.isfinite(value)
    return True


def _search_value(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _search_value(v) for k, v in value.items() if _searchable(k) and _searchable(v)}
    if isinstance(value, list):
        return [_search_value(v) for v in value if _searchable(v)]
    return value


def metadata_search_copy(metadata: bytes) -> bytes:
    """The copy of a checkpoint's metadata that PostgreSQL filters (@>) and reads run_id
    from: jsonb cannot hold strings with U+0000 or lone surrogates, nor NaN and the
    infinities, so those values are left out of it (a filter cannot name them either).
    The metadata itself is stored and returned as sent."""
    text = metadata.decode()
    if "\\u" not in text and "NaN" not in text and "Infinity" not in text:
        return metadata
    return json.dumps(_search_value(json.loads(text)), ensure_ascii=False).encode()


@dataclass(frozen=True)
class StoredCheckpoint:
    conversation_id: int
    namespace: str
    checkpoint_id: str
    parent_checkpoint_id: str | None
    checkpoint_type: str
    checkpoint: bytes
    metadata_json: bytes
    channel_versions: dict[str, str]
    channel_values: list[ChannelValue]
    pending_writes: list[CheckpointWrite]
    create_time: datetime


def checkpoint_page_token(checkpoint_id: str, namespace: str) -> str:
    """The cursor after a page of checkpoints (newest first by id, then namespace)."""
    raw = json.dumps([checkpoint_id, namespace]).encode()
    return base64.urlsafe_b64encode(raw).decode()


def parse_checkpoint_page_token(token: str) -> tuple[str, str] | None:
    if not token:
        return None
    try:
        value = json.loads(base64.urlsafe_b64decode(token.encode()))
        if isinstance(value, list) and len(value) == 2 and all(isinstance(v, str) for v in value):
            return value[0], value[1]
    except ValueError:
        pass
    raise InvalidArgument("page_token is malformed: pass back a next_page_token")


def json_contains(stored: object, wanted: object) -> bool:
    """PostgreSQL's jsonb @> for decoded JSON: objects by key, arrays by element."""
    if isinstance(wanted, dict):
        return isinstance(stored, dict) and all(
            k in stored and json_contains(stored[k], v) for k, v in wanted.items()
        )
    if isinstance(wanted, list):
        return isinstance(stored, list) and all(
            any(json_contains(s, w) for s in stored) for w in wanted
        )
    if isinstance(wanted, bool) or isinstance(stored, bool):
        return type(wanted) is type(stored) and wanted == stored
    return stored == wanted
