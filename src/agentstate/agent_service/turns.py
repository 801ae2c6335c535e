"""Running turns: what the outside world (Stop, shutdown) can do to them."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass


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

    def request_stop(self, reason: str, *, shutdown: bool = False) -> None:
        if self.stop_reason is None:
            self.stop_reason = reason
        self.shutdown = self.shutdown or shutdown

    def checkpoint(self) -> None:
        if self.stop_reason is not None:
            raise TurnStopped(self.stop_reason)


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
