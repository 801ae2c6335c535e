"""LangGraph's checkpointer on the state service.

`AgentStateSaver` is a `BaseCheckpointSaver` whose every method is one or two calls of the
state service's checkpoint RPCs (through `agentstate.client`): a LangGraph thread is a
conversation of the saver's user, found by the thread id as the conversation's external
key; checkpoints, their channel values and pending writes are that conversation's agent
state, deleted with it in one transaction.

What it adds to LangGraph's own savers:
- A history never forks by accident: a put names the head it extends (its parent, or
  "none yet" for a thread's first checkpoint) and the service refuses it, in the same
  transaction, when another writer got there first (`CheckpointConflict`). Branches a
  caller makes on purpose (time travel: metadata source "fork" or "update") are not checked.
- `put_writes` is idempotent per (checkpoint, task, idx) and atomic per call.
- A checkpoint's pending writes are stored only once the checkpoint is (the service
  refuses others): writes that arrive while its put is on the way wait for it, and fail
  with it when it is refused, so a refused run leaves not even pending writes behind.
- One call per step: a task's ordinary writes are held (`writes_delay_seconds`) for the
  put of the checkpoint's child, which stores them in its own transaction, and the run
  lease is taken, renewed and released by the puts themselves; errors and interrupts go
  at once (docs/frameworks/langgraph.md).
- `delete_thread` deletes the conversation and everything of it in one transaction; a
  write that arrives later from a run that was using the thread is refused, never
  resurrecting it (`ThreadDeleted`).
- `delete_for_runs`, `copy_thread` and `prune` are implemented, each one transaction.
"""

from __future__ import annotations

from agentstate.integrations.langgraph.saver_async import AsyncSaverMethods
from agentstate.integrations.langgraph.saver_base import (
    DEFAULT_USER_ID,
    CheckpointConflict,
    ThreadDeleted,
)
from agentstate.integrations.langgraph.saver_sync import SyncSaverMethods

__all__ = ["DEFAULT_USER_ID", "AgentStateSaver", "CheckpointConflict", "ThreadDeleted"]


class AgentStateSaver(AsyncSaverMethods, SyncSaverMethods):
    """A LangGraph checkpointer that stores threads on the agentstate state service.

    >>> saver = AgentStateSaver("127.0.0.1:50051")          # doctest: +SKIP
    >>> graph = builder.compile(checkpointer=saver)         # doctest: +SKIP

    `user_id` owns the threads (a conversation belongs to one user); a run may name
    another one with config["configurable"]["user_id"]. Give an address (the saver opens
    its connections, `close()` / `aclose()` close them) or clients of your own.
    """

    def close(self) -> None:
        """Send the pending writes still held for a put, then close what the saver opened."""
        self._flush_thread()
        super().close()

    async def aclose(self) -> None:
        """Send the pending writes still held for a put, then close what the saver opened."""
        await self._aflush_thread()
        await super().aclose()
