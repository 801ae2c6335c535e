"""The checkpoints capability's interface (LangGraph)."""

from __future__ import annotations

import abc
from collections.abc import Sequence

from agentstate.state_service.domain import (
    CheckpointRunLease,
    CheckpointWrite,
    NewCheckpoint,
    Page,
    PruneStrategy,
    PutCheckpointResult,
    StoredCheckpoint,
)


class CheckpointStore(abc.ABC):
    """Checkpoints, their pending writes and channel values."""

    @abc.abstractmethod
    async def put_checkpoint(
        self,
        *,
        user_id: str,
        conversation_id: int,
        checkpoint: NewCheckpoint,
        expected_head: str | None,
        parent_writes: Sequence[CheckpointWrite] = (),
        lease: CheckpointRunLease | None = None,
    ) -> PutCheckpointResult:
        """Store a checkpoint and its new channel values atomically, under the
        conversation's lock; return its create time (and the run lease after it).

        expected_head: None = no check, "" = the namespace must be empty, an id = the
        namespace's newest checkpoint must be that one (else CheckpointConflict). A put
        of an id the namespace already holds replaces it without the check. NotFound
        when the conversation is absent. `parent_writes`: pending writes of the parent
        checkpoint, stored in the same transaction as put_checkpoint_writes stores them
        (CheckpointNotStored when the parent is not stored). `lease`: the run lease taken
        (LeaseHeld), renewed (LeaseLost) or released with the put. Nothing changes on
        any error.
        """

    @abc.abstractmethod
    async def get_checkpoint(
        self, *, user_id: str, conversation_id: int, namespace: str, checkpoint_id: str | None
    ) -> StoredCheckpoint | None:
        """The named checkpoint, or the namespace's newest (None: no such checkpoint).
        NotFound when the conversation is absent."""

    @abc.abstractmethod
    async def list_checkpoints(
        self,
        *,
        user_id: str,
        conversation_id: int,
        namespace: str | None,
        metadata_filter: bytes | None,
        before_checkpoint_id: str | None,
        page_size: int,
        after: tuple[str, str] | None,
    ) -> Page[StoredCheckpoint]:
        """Newest first by (checkpoint id, namespace); `after` is the previous page's last
        (checkpoint id, namespace). NotFound when the conversation is absent."""

    @abc.abstractmethod
    async def put_checkpoint_writes(
        self,
        *,
        user_id: str,
        conversation_id: int,
        namespace: str,
        checkpoint_id: str,
        writes: Sequence[CheckpointWrite],
    ) -> int:
        """Store pending writes atomically: a stored (task_id, idx >= 0) is kept, idx < 0
        replaced. Returns how many were stored or replaced. NotFound when the
        conversation is absent, CheckpointNotStored (nothing stored) when the checkpoint
        is."""

    @abc.abstractmethod
    async def delete_checkpoints_for_runs(self, *, user_id: str, run_ids: Sequence[str]) -> int:
        """Delete the user's checkpoints whose metadata run_id is listed, with their
        writes and unused channel values, atomically; return how many."""

    @abc.abstractmethod
    async def copy_checkpoints(
        self, *, user_id: str, source_conversation_id: int, target_conversation_id: int
    ) -> int:
        """Copy every checkpoint, value and write atomically. NotFound (either absent),
        FailedPrecondition (the target has checkpoints)."""

    @abc.abstractmethod
    async def prune_checkpoints(
        self, *, user_id: str, conversation_ids: Sequence[int], strategy: PruneStrategy
    ) -> int:
        """Keep each namespace's newest (or nothing) atomically, with unused values and
        writes; return how many checkpoints went. NotFound naming an absent
        conversation, and nothing changes."""
