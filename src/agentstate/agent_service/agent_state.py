"""AgentState and its message/block model, with the JSON codec.

Pure domain: no gRPC, no SQL. The JSON shape is the source's (AgentScope's):
11 snake_case top-level fields; a message is {id, name, role, content: [blocks],
metadata, usage, timestamp}; blocks are text, thinking, tool_use and tool_result.
Unknown fields inside the state's sub-contexts are kept as they are, so a state
written by a newer runtime survives a round trip through an older one.
"""

from __future__ import annotations

import enum
import uuid
from datetime import UTC, datetime
from typing import Any, TypeVar

import msgspec

JSON = dict[str, Any]
B = TypeVar("B")


class Role(enum.StrEnum):
    USER = "USER"
    ASSISTANT = "ASSISTANT"
    TOOL = "TOOL"


class ToolUseState(enum.StrEnum):
    PENDING = "pending"
    ASKING = "asking"
    ALLOWED = "allowed"
    SUBMITTED = "submitted"
    FINISHED = "finished"


class ToolResultState(enum.StrEnum):
    SUCCESS = "success"
    ERROR = "error"
    INTERRUPTED = "interrupted"
    DENIED = "denied"
    RUNNING = "running"


# The framework's stored text for a call the user declined on a confirmation card.
PERMISSION_DENIED_TEXT = "Permission denied by user"


class TextBlock(msgspec.Struct, tag="text", tag_field="type"):
    text: str = ""

    def to_json(self) -> JSON:
        return _builtins(self)


class ThinkingBlock(msgspec.Struct, tag="thinking", tag_field="type"):
    thinking: str = ""

    def to_json(self) -> JSON:
        return _builtins(self)


class ToolUseBlock(msgspec.Struct, tag="tool_use", tag_field="type"):
    id: str
    name: str
    input: JSON = {}
    state: ToolUseState = ToolUseState.PENDING

    def to_json(self) -> JSON:
        return _builtins(self)


class ToolResultBlock(msgspec.Struct, tag="tool_result", tag_field="type"):
    id: str
    name: str
    state: ToolResultState = ToolResultState.SUCCESS
    output: list[JSON] = []  # [{"type": "text", "text": ...}]

    @property
    def text(self) -> str:
        return "".join(part.get("text", "") for part in self.output if part.get("type") == "text")

    @classmethod
    def of_text(cls, id: str, name: str, state: ToolResultState, text: str) -> ToolResultBlock:
        return cls(id=id, name=name, state=state, output=[{"type": "text", "text": text}])

    def to_json(self) -> JSON:
        return _builtins(self)


Block = TextBlock | ThinkingBlock | ToolUseBlock | ToolResultBlock


def _builtins(value: msgspec.Struct) -> JSON:
    data: JSON = msgspec.to_builtins(value)
    return data


def now_timestamp() -> str:
    """The source's timestamp format: 2026-09-28 12:00:35.842 (UTC here)."""
    return datetime.now(UTC).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]


def _new_id() -> str:
    return str(uuid.uuid4())


class Msg(msgspec.Struct):
    role: Role
    content: list[Block] = []
    name: str = "RagentAI"
    id: str = msgspec.field(default_factory=_new_id)
    metadata: JSON = {}
    usage: JSON | None = None
    timestamp: str = msgspec.field(default_factory=now_timestamp)

    @property
    def text(self) -> str:
        return "".join(b.text for b in self.content if isinstance(b, TextBlock))

    def blocks_of(self, kind: type[B]) -> list[B]:
        return [b for b in self.content if isinstance(b, kind)]

    def to_json(self) -> JSON:
        return _builtins(self)

    @classmethod
    def from_json(cls, data: JSON) -> Msg:
        return msgspec.convert(data, cls)


def default_permission_context() -> JSON:
    return {"mode": "default", "allow_rules": [], "ask_rules": [], "deny_rules": []}


def default_tool_context() -> JSON:
    return {
        "activated_groups": [],
        "sub_agents": {},
        "read_cache": {"enabled": True, "max_entries": 64},
    }


class AgentState(msgspec.Struct):
    """The framework's working data for one conversation (the source's 11 fields).

    A msgspec Struct: the whole state is encoded and decoded in C, typed on the way in
    (a malformed stored state is refused, not half-read), and unknown keys inside the
    free-form sub-contexts survive a round trip.
    """

    session_id: str
    user_id: str
    context: list[Msg] = []
    summary: str = ""
    reply_id: str = ""
    cur_iter: int = 0
    shutdown_interrupted: bool = False
    permission_context: JSON = msgspec.field(default_factory=default_permission_context)
    tool_context: JSON = msgspec.field(default_factory=default_tool_context)
    tasks_context: JSON = msgspec.field(default_factory=lambda: {"tasks": []})
    plan_mode_context: JSON = msgspec.field(
        default_factory=lambda: {"enabled": False, "plan": None}
    )

    def to_json(self) -> JSON:
        return _builtins(self)

    @classmethod
    def from_json(cls, data: JSON) -> AgentState:
        return msgspec.convert(data, cls)

    def encode(self) -> bytes:
        return _ENCODER.encode(self)

    @classmethod
    def decode(cls, payload: bytes) -> AgentState:
        """Raise ValueError when the payload is not an AgentState."""
        try:
            return _DECODER.decode(payload)
        except msgspec.DecodeError as exc:  # ValidationError included
            raise ValueError(f"not an AgentState: {exc}") from exc

    def copy(self) -> AgentState:
        return _DECODER.decode(_ENCODER.encode(self))

    # ----------------------------------------------------------- tool cycles

    def results_by_call_id(self) -> dict[str, ToolResultBlock]:
        return {
            block.id: block
            for msg in self.context
            for block in msg.content
            if isinstance(block, ToolResultBlock)
        }

    def pending_calls(self) -> list[tuple[Msg, ToolUseBlock]]:
        """Calls still waiting: a tool_use with no tool_result of the same id."""
        answered = self.results_by_call_id()
        return [
            (msg, block)
            for msg in self.context
            for block in msg.content
            if isinstance(block, ToolUseBlock) and block.id not in answered
        ]


_ENCODER = msgspec.json.Encoder()
_DECODER = msgspec.json.Decoder(AgentState)
