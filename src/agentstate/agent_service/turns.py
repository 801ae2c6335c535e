"""Running turns: what the outside world (Stop, shutdown) can do to them."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from dataclasses import dataclass, field
from typing import TypeVar

T = TypeVar("T")


class TurnStopped(Exception):
    """Raised at a checkpoint when the turn was asked to stop."""


@dataclass
class TurnControl:
    """What the outside world can do to a running turn."""

    user_id: str
    conversation_id: str
    task_id: str
    stop_reason: str | None = None
    shutdown: bool = False
    # Records of an earlier turn that died without finishing were marked INTERRUPTED.
    repaired_records: int = 0
    # The turn's save released its lease (nothing left to release at the end).
    released: bool = False
    _stopped: asyncio.Event = field(default_factory=asyncio.Event, repr=False, compare=False)

    def request_stop(self, reason: str, *, shutdown: bool = False) -> None:
        if self.stop_reason is None:
            self.stop_reason = reason
        self.shutdown = self.shutdown or shutdown
        self._stopped.set()

    def checkpoint(self) -> None:
        if self.stop_reason is not None:
            raise TurnStopped(self.stop_reason)

    async def interruptible(self, work: Awaitable[T]) -> T:
        """Await `work` (a model call) unless the turn is asked to stop first: a Stop,
        shutdown or lost lease cancels it at once, closing its HTTP request, instead of
        waiting for the next checkpoint (a hung endpoint may send none for minutes)."""
        task = asyncio.ensure_future(work)
        if self.stop_reason is not None:
            task.cancel()
        stop = asyncio.ensure_future(self._stopped.wait())
        try:
            await asyncio.wait({task, stop}, return_when=asyncio.FIRST_COMPLETED)
        finally:  # also when the turn's own task is cancelled
            stop.cancel()
            if not task.done():
                task.cancel()
                await asyncio.wait({task})
        if task.cancelled():
            raise TurnStopped(self.stop_reason or "interrupted")
        return task.result()


class TurnRegistry:
    """The turns running in this replica; draining refuses new ones (shutdown)."""

    def __init__(self) -> None:
        self._turns: dict[str, tuple[TurnControl, asyncio.Task[None]]] = {}
        self.draining = False

    def add(self, control: TurnControl, task: asyncio.Task[None]) -> None:
        self._turns[control.task_id] = (control, task)
        task.add_done_callback(lambda _: self._turns.pop(control.task_id, None))

    def get(self, task_id: str) -> TurnControl | None:
        entry = self._turns.get(task_id)
        return entry[0] if entry else None

    def running(self) -> list[tuple[TurnControl, asyncio.Task[None]]]:
        return list(self._turns.values())
