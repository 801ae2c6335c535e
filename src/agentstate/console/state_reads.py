"""The console's read-only view of the state service: the one module that calls it.

The inspector shows what the agent keeps apart from the message records: the stored
AgentState (version, size, the context the model sees, the summary, the calls still
pending), the compaction audit trail and the run lease. Nothing here writes.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from agentstate.client import AsyncStateClient, ChannelSecurity
from agentstate.client.types import MessageStatus
from agentstate.console.frameworks import framework_session


@dataclass(frozen=True)
class Inspection:
    """What the inspector shows, as JSON-ready values."""

    state: dict[str, Any] | None  # None: the conversation has no state yet
    compactions: list[dict[str, Any]]
    lease: dict[str, Any] | None  # None: no turn holds it


def _iso(when: datetime | None) -> str | None:
    return when.isoformat() if when is not None else None


def _block_summary(block: dict[str, Any]) -> str:
    kind = str(block.get("type", "?"))
    if kind in ("tool_use", "tool_result"):
        return f"{kind} {block.get('name', '')} ({block.get('state', '')})"
    return kind


def _block_contents(block: dict[str, Any]) -> str:
    """What a block holds, as text: the words, a call's input, a result's output."""
    kind = block.get("type")
    if kind == "text":
        return str(block.get("text", ""))
    if kind == "thinking":
        return str(block.get("thinking", ""))
    if kind == "tool_use":
        return json.dumps(block.get("input", {}), ensure_ascii=False)
    if kind == "tool_result":
        output = block.get("output")
        if isinstance(output, list):
            return "".join(str(p.get("text", "")) for p in output if isinstance(p, dict))
        return str(output or "")
    return json.dumps(block, ensure_ascii=False)


def describe_state(payload: bytes, version: int, update_time: str | None) -> dict[str, Any]:
    """The parts of an AgentState a person looks at; the JSON codec's shape, read loosely
    (the console must not break on fields it does not know)."""
    data = json.loads(payload)
    context = data.get("context") or []
    results = {
        b.get("id")
        for m in context
        for b in m.get("content") or []
        if isinstance(b, dict) and b.get("type") == "tool_result"
    }
    pending = [
        {"call_id": b.get("id"), "name": b.get("name"), "input": b.get("input")}
        for m in context
        for b in m.get("content") or []
        if isinstance(b, dict) and b.get("type") == "tool_use" and b.get("id") not in results
    ]
    return {
        "version": version,
        "size_bytes": len(payload),
        "update_time": update_time,
        "summary": data.get("summary") or "",
        "messages": [
            {
                "id": str(m.get("id", "")),
                "role": m.get("role", "?"),
                "timestamp": m.get("timestamp"),
                "usage": m.get("usage"),
                "blocks": [
                    _block_summary(b) for b in m.get("content") or [] if isinstance(b, dict)
                ],
                "contents": [
                    {"label": _block_summary(b), "text": _block_contents(b)}
                    for b in m.get("content") or []
                    if isinstance(b, dict)
                ],
            }
            for m in context
        ],
        "pending_calls": pending,
        # The whole stored payload, for the raw view (the codec's JSON, pretty-printed).
        "raw": json.dumps(data, ensure_ascii=False, indent=2),
    }


class StateReader:
    """Read-only calls to the state service (through the public client), scoped to one
    user each."""

    def __init__(
        self, address: str, timeout: float, security: ChannelSecurity | None = None
    ) -> None:
        self._client = AsyncStateClient.connect(address, timeout_seconds=timeout, security=security)

    async def close(self) -> None:
        await self._client.close()

    async def framework(self, user_id: str, conversation_id: str) -> dict[str, Any]:
        """The framework session this conversation holds (console/frameworks.py)."""
        return await framework_session(self._client, user_id, conversation_id)

    async def live(
        self, user_id: str, conversation_id: str, message_id: str
    ) -> tuple[bool, str, list[Any]]:
        """A turn's reply record as it is being written: whether it still is, the task id
        (for Stop; "" until the agent has written it) and the events so far (the agent's
        journal, agent_service/runtime/live.py)."""
        record = await self._client.get_message(user_id, conversation_id, message_id)
        try:
            metadata = json.loads(record.metadata_json or b"{}")
        except ValueError:
            metadata = {}
        live = metadata.get("live") if isinstance(metadata, dict) else None
        live = live if isinstance(live, dict) else {}
        events = live.get("events")
        return (
            record.status == MessageStatus.STREAMING,
            str(live.get("task_id") or ""),
            events if isinstance(events, list) else [],
        )

    async def inspect(self, user_id: str, conversation_id: str) -> Inspection:
        """agentstate.client.NotFound when the conversation is not the user's."""
        lease = await self._client.get_lease(user_id, conversation_id)
        compactions = await self._client.list_compactions(user_id, conversation_id)
        # find_state: None when the conversation exists but has no state saved yet.
        stored = await self._client.find_state(user_id, conversation_id)
        state = (
            None
            if stored is None
            else describe_state(stored.payload, stored.version, _iso(stored.update_time))
        )
        now = datetime.now(UTC)
        return Inspection(
            state=state,
            compactions=[
                {
                    "messages_before": c.note.messages_before,
                    "messages_after": c.note.messages_after,
                    "tokens_before": c.note.tokens_before,
                    "tokens_after": c.note.tokens_after,
                    "summary_chars": c.note.summary_chars,
                    "reason": c.note.reason,
                    "create_time": _iso(c.create_time),
                }
                for c in compactions
            ],
            lease=None
            if lease is None
            else {
                "task_id": lease.task_id,
                "holder": lease.holder,
                "since": _iso(lease.acquire_time),
                "expires": _iso(lease.expire_time),
                "lapsed": lease.expire_time <= now,
                "stop_requested": lease.stop_requested,
            },
        )
