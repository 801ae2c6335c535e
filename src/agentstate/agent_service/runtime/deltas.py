"""Delta saves on the runtime's side: what a turn changed in the state since the
version it loaded, and the states this replica saved last (so the next turn on the
same conversation needs neither the payload nor a decode).

A `Baseline` is the loaded version's message encodings (one per context message) and
the encoding of the other fields. At the end of a turn each message is encoded once;
the first one that differs from the baseline (after the messages a compaction
dropped from the front) is where the change starts. What follows goes to the state
service as a StateChange, so a turn sends what it added, not the conversation.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import msgspec

from agentstate.agent_service.agent_state import AgentState
from agentstate.client.types import StateChange

_ENCODER = msgspec.json.Encoder()


@dataclass(frozen=True)
class Baseline:
    """A saved version of a state, as its parts were encoded."""

    version: int
    message_ids: list[str]
    messages: list[bytes]
    fields: bytes

    @property
    def size(self) -> int:
        return len(self.fields) + sum(map(len, self.messages))


@dataclass(frozen=True)
class Encoded:
    """A state's parts, each encoded once: what a delta or a size check needs."""

    messages: list[bytes]
    fields: bytes

    @property
    def size(self) -> int:
        """The length of AgentState.encode() of the same state, without encoding it."""
        count = len(self.messages)
        array = 2 + sum(map(len, self.messages)) + max(count - 1, 0)
        return len(self.fields) + len(b',"context":') + array


def encode_parts(state: AgentState) -> Encoded:
    fields = msgspec.structs.asdict(state)
    del fields["context"]
    return Encoded([_ENCODER.encode(m) for m in state.context], _ENCODER.encode(fields))


def baseline_of(state: AgentState, version: int, encoded: Encoded | None = None) -> Baseline:
    parts = encoded or encode_parts(state)
    return Baseline(version, [m.id for m in state.context], parts.messages, parts.fields)


def change_since(baseline: Baseline, state: AgentState, encoded: Encoded) -> StateChange:
    """The StateChange that turns `baseline` into `state` (whose parts are `encoded`)."""
    drop = 0
    if state.context and baseline.message_ids and state.context[0].id != baseline.message_ids[0]:
        # A compaction dropped messages from the front: the first kept one is further on.
        try:
            drop = baseline.message_ids.index(state.context[0].id)
        except ValueError:
            drop = len(baseline.messages)  # nothing kept: everything is replaced
    kept = baseline.messages[drop:]
    same = 0
    for old, new in zip(kept, encoded.messages, strict=False):
        if old != new:
            break
        same += 1
    return StateChange(
        base_version=baseline.version,
        drop_head=drop,
        replace_from=None if same == len(kept) else same,
        messages=tuple(encoded.messages[same:]),
        fields_json=None if encoded.fields == baseline.fields else encoded.fields,
    )


@dataclass(frozen=True)
class CachedState:
    """A state this replica saved, with the version the state service gave it."""

    state: AgentState
    baseline: Baseline


class StateCache:
    """The states this replica saved last, by conversation, least recently used out
    first, bounded by count and by encoded bytes. A turn takes its conversation's
    entry out (it changes the state in place) and puts the saved one back; a turn
    that fails leaves none, so the next one loads the stored state."""

    def __init__(self, max_entries: int = 512, max_bytes: int = 128 * 1024 * 1024) -> None:
        self._entries: OrderedDict[tuple[str, str], CachedState] = OrderedDict()
        self._bytes = 0
        self.max_entries = max_entries
        self.max_bytes = max_bytes

    def take(self, user_id: str, conversation_id: str) -> CachedState | None:
        entry = self._entries.pop((user_id, conversation_id), None)
        if entry is not None:
            self._bytes -= entry.baseline.size
        return entry

    def put(self, user_id: str, conversation_id: str, entry: CachedState) -> None:
        self.take(user_id, conversation_id)
        if self.max_entries <= 0 or entry.baseline.size > self.max_bytes:
            return
        self._entries[(user_id, conversation_id)] = entry
        self._bytes += entry.baseline.size
        while len(self._entries) > self.max_entries or self._bytes > self.max_bytes:
            _, dropped = self._entries.popitem(last=False)
            self._bytes -= dropped.baseline.size

    def __len__(self) -> int:
        return len(self._entries)
