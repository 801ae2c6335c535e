"""The runtime's own views of what the state service returns, with the AgentState decoded.

Everything else the runtime exchanges with the state service (records, updates, compaction
notes, turn requests, leases, conversations, pages) is agentstate.client's types.
"""

from __future__ import annotations

from dataclasses import dataclass

from agentstate.agent_service.agent_state import AgentState


@dataclass(frozen=True)
class LoadedTurn:
    """A started turn (agentstate.client.BegunTurn) with its state decoded."""

    conversation_id: str
    conversation_created: bool
    task_id: str
    lapsed_task_id: str  # "" unless this lease replaced one that lapsed unreleased
    interrupted_records: int  # records of a dead turn now marked INTERRUPTED
    state: AgentState | None  # None: no state saved yet
    version: int  # 0 when there is no state
    record_ids: list[str]  # of the request's `new_records`, in order


@dataclass(frozen=True)
class EndedTurn:
    version: int
    lease_released: bool


@dataclass(frozen=True)
class LoadedState:
    state: AgentState | None  # None: the conversation has no state yet
    version: int  # 0 when there is no state
