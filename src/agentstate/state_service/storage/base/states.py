"""The agent states aggregate's interface: states and turns."""

from __future__ import annotations

import abc
from collections.abc import Sequence

from agentstate.state_service.domain import (
    BegunTurn,
    Compaction,
    MessageWrite,
    StateDelta,
    StoredState,
    TurnStart,
    UpsertResult,
)


class AgentStateStore(abc.ABC):
    """Whole AgentState blobs under compare-and-set, and the turn's start."""

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
