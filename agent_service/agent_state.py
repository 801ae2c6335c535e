"""AgentState and its message/block model, with the JSON codec.

Pure domain: no gRPC, no SQL. The JSON shape is the source's (AgentScope's):
11 snake_case top-level fields; a message is {id, name, role, content: [blocks],
metadata, usage, timestamp}; blocks are text, thinking, tool_use and tool_result.
Unknown fields inside the state's sub-contexts are kept as they are, so a state
written by a newer runtime survives a round trip through an older one.
"""

from __future__ import annotations

import copy
import enum
import json
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, TypeVar

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


@dataclass
class TextBlock:
    text: str

    def to_json(self) -> JSON:
        return {"type": "text", "text": self.text}


@dataclass
class ThinkingBlock:
    thinking: str

    def to_json(self) -> JSON:
        return {"type": "thinking", "thinking": self.thinking}


@dataclass
class ToolUseBlock:
    id: str
    name: str
    input: JSON
    state: ToolUseState = ToolUseState.PENDING

    def to_json(self) -> JSON:
        return {
            "type": "tool_use",
            "id": self.id,
            "name": self.name,
            "input": self.input,
            "state": self.state.value,
        }


@dataclass
class ToolResultBlock:
    id: str
    name: str
    state: ToolResultState
    output: list[JSON]  # [{"type": "text", "text": ...}]

    @property
    def text(self) -> str:
        return "".join(part.get("text", "") for part in self.output if part.get("type") == "text")

    @classmethod
    def of_text(cls, id: str, name: str, state: ToolResultState, text: str) -> ToolResultBlock:
        return cls(id=id, name=name, state=state, output=[{"type": "text", "text": text}])

    def to_json(self) -> JSON:
        return {
            "type": "tool_result",
            "id": self.id,
            "name": self.name,
            "state": self.state.value,
            "output": self.output,
        }


Block = TextBlock | ThinkingBlock | ToolUseBlock | ToolResultBlock


def block_from_json(data: JSON) -> Block:
    kind = data.get("type")
    if kind == "text":
        return TextBlock(str(data.get("text", "")))
    if kind == "thinking":
        return ThinkingBlock(str(data.get("thinking", "")))
    if kind == "tool_use":
        return ToolUseBlock(
            id=str(data["id"]),
            name=str(data["name"]),
            input=dict(data.get("input") or {}),
            state=ToolUseState(data.get("state", "pending")),
        )
    if kind == "tool_result":
        return ToolResultBlock(
            id=str(data["id"]),
            name=str(data["name"]),
            state=ToolResultState(data.get("state", "success")),
            output=list(data.get("output") or []),
        )
    raise ValueError(f"unknown block type {kind!r}")


def now_timestamp() -> str:
    """The source's timestamp format: 2026-09-28 12:00:35.842 (UTC here)."""
    return datetime.now(UTC).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]


@dataclass
class Msg:
    role: Role
    content: list[Block]
    name: str = "RagentAI"
    id: str = field(default_factory=lambda: str(uuid.uuid4()))
    metadata: JSON = field(default_factory=dict)
    usage: JSON | None = None
    timestamp: str = field(default_factory=now_timestamp)

    @property
    def text(self) -> str:
        return "".join(b.text for b in self.content if isinstance(b, TextBlock))

    def blocks_of(self, kind: type[B]) -> list[B]:
        return [b for b in self.content if isinstance(b, kind)]

    def to_json(self) -> JSON:
        return {
            "id": self.id,
            "name": self.name,
            "role": self.role.value,
            "content": [b.to_json() for b in self.content],
            "metadata": self.metadata,
            "usage": self.usage,
            "timestamp": self.timestamp,
        }

    @classmethod
    def from_json(cls, data: JSON) -> Msg:
        return cls(
            id=str(data.get("id") or uuid.uuid4()),
            name=str(data.get("name") or ""),
            role=Role(data["role"]),
            content=[block_from_json(b) for b in data.get("content") or []],
            metadata=dict(data.get("metadata") or {}),
            usage=data.get("usage"),
            timestamp=str(data.get("timestamp") or ""),
        )


def default_permission_context() -> JSON:
    return {"mode": "default", "allow_rules": [], "ask_rules": [], "deny_rules": []}


def default_tool_context() -> JSON:
    return {
        "activated_groups": [],
        "sub_agents": {},
        "read_cache": {"enabled": True, "max_entries": 64},
    }


@dataclass
class AgentState:
    """The framework's working data for one conversation (the source's 11 fields)."""

    session_id: str
    user_id: str
    context: list[Msg] = field(default_factory=list)
    summary: str = ""
    reply_id: str = ""
    cur_iter: int = 0
    shutdown_interrupted: bool = False
    permission_context: JSON = field(default_factory=default_permission_context)
    tool_context: JSON = field(default_factory=default_tool_context)
    tasks_context: JSON = field(default_factory=lambda: {"tasks": []})
    plan_mode_context: JSON = field(default_factory=lambda: {"enabled": False, "plan": None})

    def to_json(self) -> JSON:
        return {
            "session_id": self.session_id,
            "user_id": self.user_id,
            "context": [m.to_json() for m in self.context],
            "summary": self.summary,
            "reply_id": self.reply_id,
            "cur_iter": self.cur_iter,
            "shutdown_interrupted": self.shutdown_interrupted,
            "permission_context": self.permission_context,
            "tool_context": self.tool_context,
            "tasks_context": self.tasks_context,
            "plan_mode_context": self.plan_mode_context,
        }

    @classmethod
    def from_json(cls, data: JSON) -> AgentState:
        defaults = cls(session_id="", user_id="")
        return cls(
            session_id=str(data.get("session_id", "")),
            user_id=str(data.get("user_id", "")),
            context=[Msg.from_json(m) for m in data.get("context") or []],
            summary=str(data.get("summary") or ""),
            reply_id=str(data.get("reply_id") or ""),
            cur_iter=int(data.get("cur_iter") or 0),
            shutdown_interrupted=bool(data.get("shutdown_interrupted", False)),
            permission_context=dict(data.get("permission_context") or defaults.permission_context),
            tool_context=dict(data.get("tool_context") or defaults.tool_context),
            tasks_context=dict(data.get("tasks_context") or defaults.tasks_context),
            plan_mode_context=dict(data.get("plan_mode_context") or defaults.plan_mode_context),
        )

    def encode(self) -> bytes:
        return json.dumps(self.to_json(), ensure_ascii=False, separators=(",", ":")).encode()

    @classmethod
    def decode(cls, payload: bytes) -> AgentState:
        data = json.loads(payload)
        if not isinstance(data, dict):
            raise ValueError("an AgentState must be a JSON object")
        return cls.from_json(data)

    def copy(self) -> AgentState:
        return copy.deepcopy(self)

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
