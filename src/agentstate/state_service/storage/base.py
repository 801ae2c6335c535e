"""The store interface: the only way the state service reaches its data.

Implementations: `PostgresStore` (production) and `MemoryStore` (demos and
fast tests). Both pass the same behavioural test suite. Every method is
scoped by user_id; another user's rows behave as if they did not exist.
Arguments arrive already validated (see state_service.domain) and are passed
by keyword, so a call site says what each id is.
"""

from __future__ import annotations

import abc
from collections.abc import Sequence
from datetime import datetime

from agentstate.state_service.domain import (
    AcquiredLease,
    AppendedEvent,
    AppendedItems,
    BegunTurn,
    CheckpointWrite,
    ClearedItems,
    Compaction,
    Conversation,
    DeleteCounts,
    EventAppend,
    ItemsPage,
    Lease,
    MessageRecord,
    MessageUpdate,
    MessageWrite,
    NewCheckpoint,
    NewItem,
    NewMessage,
    Page,
    PoppedItem,
    PruneStrategy,
    ResolvedConversation,
    ScopedStates,
    StateDelta,
    StoredCheckpoint,
    StoredState,
    TurnStart,
    UpsertResult,
)


class StateStore(abc.ABC):
    # ------------------------------------------------------------------ state

    @abc.abstractmethod
    async def get_state(self, *, user_id: str, conversation_id: int, state_key: str) -> StoredState:
        """Raise NotFound when the conversation or the state is absent."""

    @abc.abstractmethod
    async def save_state(
        self,
        *,
        user_id: str,
        conversation_id: int,
        state_key: str,
        payload: bytes | None,
        expected_version: int | None,
        message_writes: Sequence[MessageWrite] = (),
        compactions: Sequence[Compaction] = (),
        task_id: int | None = None,
        delta: StateDelta | None = None,
        max_state_bytes: int | None = None,
    ) -> UpsertResult:
        """Replace the whole state (`payload`) or apply a `delta` to the stored one,
        apply message writes and record compactions atomically (UpsertState); with
        `task_id`, also release that turn's lease (EndTurn).

                expected_version (whole saves): None = unconditional, 0 = create only, N = only
        if the stored version is N (else VersionConflict); a delta's own base_version
        is the same compare-and-set. NotFound when the conversation does not exist;
        LeaseLost when `task_id` is given and another task holds the conversation's
        lease (that turn's lapsed and was taken over). For a delta: InvalidArgument
        for a part that is not JSON the database takes or a range beyond the stored
        context, FailedPrecondition when the stored "context" is not an array,
        PayloadTooLarge when the resulting state (as get_state would return it) is
        over `max_state_bytes`. Nothing changes on any error.
        """

    @abc.abstractmethod
    async def begin_turn(
        self, *, user_id: str, conversation_id: int | None, start: TurnStart
    ) -> BegunTurn:
        """Start a turn atomically: create (conversation_id None) or lock the
        conversation, take its lease (as acquire_lease), check the card guard, mark
        STREAMING records INTERRUPTED, append `start.new_messages`, read the state.

        Errors as acquire_lease, plus CardPending / FailedPrecondition / NotFound
        from the guard. Nothing changes on any error.
        """

    # ---------------------------------------------------------- conversations

    @abc.abstractmethod
    async def create_conversation(
        self, *, user_id: str, title: str, external_key: str = ""
    ) -> Conversation:
        """AlreadyExists when `external_key` ("" = none) is another conversation's."""

    @abc.abstractmethod
    async def resolve_conversation(
        self, *, user_id: str, external_key: str, create_if_missing: bool, title: str
    ) -> ResolvedConversation:
        """The user's conversation with `external_key`; created (atomically: concurrent
        callers get one conversation) when absent and `create_if_missing`, else NotFound."""

    @abc.abstractmethod
    async def get_conversation(self, *, user_id: str, conversation_id: int) -> Conversation: ...

    @abc.abstractmethod
    async def list_conversations(
        self, *, user_id: str, page_size: int, before_id: int | None
    ) -> Page[Conversation]:
        """Newest first; `before_id` is the last id of the previous page."""

    @abc.abstractmethod
    async def rename_conversation(
        self, *, user_id: str, conversation_id: int, title: str
    ) -> Conversation: ...

    @abc.abstractmethod
    async def delete_conversations(
        self, *, user_id: str, conversation_ids: Sequence[int]
    ) -> DeleteCounts:
        """Delete conversations, their messages and states in one transaction.

        All or nothing: NotFound naming the first absent id, and nothing deleted.
        """

    # --------------------------------------------------------------- messages

    @abc.abstractmethod
    async def write_message(
        self, *, user_id: str, conversation_id: int, write: MessageWrite
    ) -> MessageRecord:
        """Append a record (NewMessage) or change one (MessageUpdate; FailedPrecondition
        when its `expected_status` is set and differs), under the conversation's lock."""

    async def append_message(
        self, *, user_id: str, conversation_id: int, message: NewMessage
    ) -> MessageRecord:
        return await self.write_message(
            user_id=user_id, conversation_id=conversation_id, write=message
        )

    async def update_message(
        self, *, user_id: str, conversation_id: int, update: MessageUpdate
    ) -> MessageRecord:
        return await self.write_message(
            user_id=user_id, conversation_id=conversation_id, write=update
        )

    @abc.abstractmethod
    async def list_messages(
        self,
        *,
        user_id: str,
        conversation_id: int,
        page_size: int,
        after_id: int | None,
        newest_first: bool = False,
    ) -> Page[MessageRecord]:
        """Oldest first (or newest first); `after_id` is the previous page's last id.

        NotFound when the conversation is absent."""

    @abc.abstractmethod
    async def list_compactions(self, *, user_id: str, conversation_id: int) -> list[Compaction]:
        """Oldest first; NotFound when the conversation is absent."""

    @abc.abstractmethod
    async def get_lease(self, *, user_id: str, conversation_id: int) -> Lease | None:
        """The conversation's lease row as it is (lapsed ones too), None when there is none;
        NotFound when the conversation is absent."""

    @abc.abstractmethod
    async def get_message(
        self, *, user_id: str, conversation_id: int, message_id: int
    ) -> MessageRecord: ...

    # ------------------------------------------------------------ run leases

    @abc.abstractmethod
    async def acquire_lease(
        self,
        *,
        user_id: str,
        conversation_id: int,
        holder: str,
        ttl_ms: int,
        max_user_leases: int,
    ) -> AcquiredLease:
        """Take the conversation's run lease with a new task id.

        NotFound (conversation absent), LeaseHeld (another unexpired lease),
        ResourceExhausted (the user holds `max_user_leases` others; 0 = no limit).
        Reports the task id of a lapsed, never-released lease it replaced.
        """

    @abc.abstractmethod
    async def renew_lease(self, *, user_id: str, task_id: int, ttl_ms: int) -> Lease:
        """LeaseLost when the lease is gone (released or taken over)."""

    @abc.abstractmethod
    async def release_lease(self, *, user_id: str, task_id: int) -> bool: ...

    @abc.abstractmethod
    async def request_stop(self, *, user_id: str, task_id: int) -> Lease:
        """NotFound when no unexpired lease has this task id."""

    # ------------------------------------- conversation items, scoped state

    @abc.abstractmethod
    async def append_items(
        self,
        *,
        user_id: str,
        conversation_id: int,
        items: Sequence[NewItem],
        expected_revision: int | None,
    ) -> AppendedItems:
        """Append items in order, under the conversation's lock, in one transaction.

        NotFound (conversation absent), RevisionConflict (`expected_revision` set and
        not the current revision). Nothing changes on any error."""

    @abc.abstractmethod
    async def list_items(
        self,
        *,
        user_id: str,
        conversation_id: int,
        last_n: int | None,
        min_item_time: datetime | None,
        page_size: int,
        after_seq: int | None,
    ) -> ItemsPage:
        """Oldest first: the items at or after `min_item_time`, only the newest
        `last_n` of them when set, from after `after_seq`. NotFound when absent."""

    @abc.abstractmethod
    async def pop_item(
        self, *, user_id: str, conversation_id: int, expected_revision: int | None
    ) -> PoppedItem:
        """Remove and return the newest item (None when empty). Errors as append_items."""

    @abc.abstractmethod
    async def clear_items(self, *, user_id: str, conversation_id: int) -> ClearedItems:
        """Remove every item of the conversation. NotFound when absent."""

    @abc.abstractmethod
    async def get_scoped_state(self, *, user_id: str, app_name: str) -> ScopedStates:
        """The app-scoped and the user-scoped state (None where none was written)."""

    @abc.abstractmethod
    async def append_event(
        self, *, user_id: str, conversation_id: int, event: EventAppend
    ) -> AppendedEvent:
        """In one transaction: check the revision, append the item (if any), merge the
        deltas into the conversation state, the app- and the user-scoped state.
        Errors as append_items. Nothing changes on any error."""

    # -------------------------------------------------------------- retention

    @abc.abstractmethod
    async def purge_inactive(self, *, before: datetime, batch_size: int = 500) -> DeleteCounts:
        """Retention: delete every conversation (with its messages, states, leases and
        compaction records) untouched since `before`, except those running a turn.
        Each batch is one transaction."""

    # ---------------------------------------------------- checkpoints (issue 15)

    @abc.abstractmethod
    async def put_checkpoint(
        self,
        *,
        user_id: str,
        conversation_id: int,
        checkpoint: NewCheckpoint,
        expected_head: str | None,
    ) -> datetime:
        """Store a checkpoint and its new channel values atomically, under the
        conversation's lock; return its create time.

        expected_head: None = no check, "" = the namespace must be empty, an id = the
        namespace's newest checkpoint must be that one (else CheckpointConflict). A put
        of an id the namespace already holds replaces it without the check. NotFound
        when the conversation is absent. Nothing changes on any error.
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
        conversation is absent."""

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

    async def open(self) -> None:  # noqa: B027 - optional hook
        """Prepare resources (connections, schema). Default: nothing."""

    async def close(self) -> None:  # noqa: B027 - optional hook
        """Release resources. Default: nothing."""
