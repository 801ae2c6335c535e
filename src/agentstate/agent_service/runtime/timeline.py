"""A turn's timeline: what happened in it and when, saved on its reply record.

Kept in the record's metadata (`timeline`), so a page shows it from the stored records,
on any replica, long after the turn: the turn's start (lease taken, records appended,
state loaded, in one BeginTurn), each model call (duration, tokens, tool calls asked
for), each tool call (input, output, outcome, duration), compactions, and the save
(version, whole or delta, size). Times are milliseconds from the turn's start; the trace
id links the turn to its spans in a tracing UI. Small: outputs are cut to OUTPUT_CHARS.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from opentelemetry import trace

from agentstate.agent_service.events import CallStatus, ToolStatus, TurnEvent

TIMELINE_METADATA_KEY = "timeline"
OUTPUT_CHARS = 400
MAX_EVENTS = 200


def _ms(seconds: float) -> int:
    return round(seconds * 1000)


@dataclass
class Timeline:
    started: float = field(default_factory=time.monotonic)
    started_at: datetime = field(default_factory=lambda: datetime.now(UTC))
    events: list[dict[str, Any]] = field(default_factory=list)
    trace_id: str = ""
    _tools: dict[str, tuple[float, dict[str, Any]]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        context = trace.get_current_span().get_span_context()
        if context.is_valid:
            self.trace_id = format(context.trace_id, "032x")

    def add(self, kind: str, name: str, began: float | None = None, **fields: Any) -> None:
        if len(self.events) >= MAX_EVENTS:
            return
        now = time.monotonic()
        start = began if began is not None else now
        entry: dict[str, Any] = {"kind": kind, "name": name, "at_ms": _ms(start - self.started)}
        if began is not None:
            entry["ms"] = _ms(now - began)
        entry.update({k: v for k, v in fields.items() if v is not None})
        self.events.append(entry)

    def observe(self, event: TurnEvent) -> None:
        """Tool calls, from the turn's own events: started when RUNNING, ended by the
        status that follows (their inputs and outputs as the events carry them)."""
        if not isinstance(event, ToolStatus):
            return
        if event.status is CallStatus.RUNNING:
            self._tools[event.call_id] = (time.monotonic(), event.arguments)
            return
        began, arguments = self._tools.pop(event.call_id, (None, event.arguments))
        self.add(
            "tool",
            event.name,
            began,
            call_id=event.call_id,
            outcome=event.status.value,
            input=arguments,
            output=event.summary[:OUTPUT_CHARS],
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "started_at": self.started_at.isoformat(),
            "total_ms": _ms(time.monotonic() - self.started),
            "trace_id": self.trace_id,
            "events": list(self.events),
        }
