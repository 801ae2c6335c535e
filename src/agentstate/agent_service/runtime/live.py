"""A running turn's events, kept on its reply record while it runs, so that any page on
any replica can attach to the turn (a reload, a second tab) and follow it.

The turn's reply record is STREAMING until the turn is saved. While it is, the journal
writes the events seen so far into the record's metadata (`live`: the task id, for Stop,
and an append-only list of events) with UpdateMessage, at most every FLUSH_SECONDS and
only when something happened. Consecutive text of one kind is joined into one event per
flush, so the list stays short; an event, once written, never changes, so a reader that
has seen N events asks for the ones after N (the console's resumable stream). Every
write is conditional on the record still being STREAMING: a write that arrives after
the turn was saved changes nothing. The final save replaces the metadata, so a finished
record carries no journal. These are plain unary calls on the state service, so this
works on every replica and behind a transaction pooler.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

from agentstate.agent_service.events import (
    Delta,
    Emit,
    Hint,
    Progress,
    ToolStatus,
    TurnEvent,
)
from agentstate.agent_service.runtime.port import StatePort
from agentstate.client.types import MessageStatus, MessageUpdate

log = logging.getLogger(__name__)

LIVE_METADATA_KEY = "live"
FLUSH_SECONDS = 0.3
# The first write waits this long: a quick turn (most) costs no call beyond BeginTurn and
# EndTurn; one a person could reload in the middle of is journaled from then on.
FIRST_FLUSH_SECONDS = 0.4
# A journal longer than this stops growing (the record's final save has it all anyway).
MAX_EVENTS = 2000


def event_json(event: TurnEvent) -> dict[str, Any] | None:
    """An event as the journal keeps it; None for the ones it does not (the end events
    are told by the record's own status once it is saved)."""
    if isinstance(event, Delta):
        return {"type": "message", "kind": event.kind.value, "delta": event.text}
    if isinstance(event, ToolStatus):
        return {
            "type": "block",
            "call_id": event.call_id,
            "tool_name": event.name,
            "status": event.status.value,
            "arguments": event.arguments,
            "summary": event.summary,
        }
    if isinstance(event, Hint):
        return {"type": "hint", "text": event.text}
    if isinstance(event, Progress):
        return {
            "type": "progress",
            "attempt": event.attempt,
            "attempts": event.attempts,
            "elapsed_ms": int(event.elapsed_seconds * 1000),
            "note": event.note,
        }
    return None


class LiveJournal:
    """Writes one turn's events onto its STREAMING reply record (see the module doc)."""

    def __init__(
        self,
        state: StatePort,
        user_id: str,
        conversation_id: str,
        record_id: str,
        task_id: str,
        *,
        flush_seconds: float = FLUSH_SECONDS,
    ) -> None:
        self._state = state
        self._where = (user_id, conversation_id)
        self._record_id = record_id
        self._task_id = task_id
        self._flush_seconds = flush_seconds
        self._written: list[dict[str, Any]] = []
        self._pending: list[dict[str, Any]] = []
        self._changed = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._inflight: asyncio.Future[None] | None = None
        self._closed = False

    def wrap(self, emit: Emit) -> Emit:
        """`emit`, with every event also kept for the journal."""

        async def both(event: TurnEvent) -> None:
            self.add(event)
            await emit(event)

        return both

    def start(self) -> None:
        self._task = asyncio.ensure_future(self._run())
        self._changed.set()  # the first write names the task even before any event (Stop)

    def add(self, event: TurnEvent) -> None:
        data = event_json(event)
        if data is None or self._closed:
            return
        last = self._pending[-1] if self._pending else None
        if (
            last is not None
            and data["type"] == "message"
            and last["type"] == "message"
            and last["kind"] == data["kind"]
        ):
            last["delta"] += data["delta"]
        elif len(self._written) + len(self._pending) < MAX_EVENTS:
            self._pending.append(data)
        self._changed.set()

    async def close(self) -> None:
        """Stop writing; waits for a write in flight, so none lands after the final save."""
        self._closed = True
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self._inflight is not None:
            with contextlib.suppress(BaseException):
                await self._inflight

    async def _run(self) -> None:
        await asyncio.sleep(FIRST_FLUSH_SECONDS)
        while True:
            await self._changed.wait()
            self._changed.clear()
            # Shielded: a close waits for the write in flight instead of cutting it.
            self._inflight = asyncio.ensure_future(self._flush())
            await asyncio.shield(self._inflight)
            await asyncio.sleep(self._flush_seconds)

    async def _flush(self) -> None:
        self._written += self._pending
        self._pending = []
        update = MessageUpdate(
            message_id=self._record_id,
            metadata={LIVE_METADATA_KEY: {"task_id": self._task_id, "events": list(self._written)}},
            expected_status=MessageStatus.STREAMING,
        )
        try:
            await self._state.update_message(*self._where, update)
        except Exception as exc:  # the journal is a view: the turn goes on without it
            log.info("turn %s: its live events were not written: %s", self._task_id, exc)
