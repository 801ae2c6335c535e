"""The runtime's port to session state: what a turn needs, in the runtime's own types.

ClientStatePort (agent_service/client_state_port.py) implements it over gRPC and is the one
place that speaks the StateService contract; tests and other deployments may plug
in anything with these methods.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from agentstate.agent_service.records import EndedTurn, LoadedState, LoadedTurn
from agentstate.client.types import (
    CompactionNote,
    LeaseInfo,
    MessageRecord,
    MessageUpdate,
    MessageWrite,
    StateChange,
    TurnRequest,
)


class StatePort(Protocol):
    async def begin_turn(self, request: TurnRequest) -> LoadedTurn:
        """Start a turn in one call: (create the conversation,) take the lease, check the
        card guard, append the turn's records, load the state. Raises and changes
        nothing on failure; errors.CardPending names an open card."""
        ...

    async def end_turn(
        self,
        user_id: str,
        conversation_id: str,
        task_id: str,
        *,
        payload: bytes | None,
        message_count: int,
        expected_version: int,
        writes: Sequence[MessageWrite] = (),
        compactions: Sequence[CompactionNote] = (),
        change: StateChange | None = None,
    ) -> EndedTurn:
        """Save the turn and release its lease in one call; nothing saved on failure.
        The state goes whole (`payload`) or as what changed since `expected_version`
        (`change`, whose base_version is that version)."""
        ...

    async def load(self, user_id: str, conversation_id: str) -> LoadedState:
        """The stored state (None when there is none yet); any failure raises."""
        ...

    async def update_message(
        self, user_id: str, conversation_id: str, update: MessageUpdate
    ) -> None: ...

    async def get_message(
        self, user_id: str, conversation_id: str, message_id: str
    ) -> MessageRecord: ...

    async def renew_lease(self, user_id: str, task_id: str, ttl_ms: int) -> LeaseInfo:
        """errors.Conflict when the lease was lost."""
        ...

    async def release_lease(self, user_id: str, task_id: str) -> bool: ...

    async def request_stop(self, user_id: str, task_id: str) -> LeaseInfo: ...
