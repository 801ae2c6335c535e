"""The data lifecycle's interface: labels and time to live, searching conversations,
expiry, and the erasure of a user (issue 23)."""

from __future__ import annotations

import abc
from collections.abc import Mapping
from dataclasses import dataclass, field

from agentstate.state_service.domain import (
    Conversation,
    ConversationFilter,
    DeleteCounts,
    ErasureReceipt,
    LabelChange,
    Page,
    TimeToLive,
)


@dataclass(frozen=True)
class ConversationSearch:
    page: Page[Conversation]
    # With include_total: the matches, counted up to MAX_COUNTED_TOTAL + 1 (past it,
    # MAX_COUNTED_TOTAL + 1 means "more").
    total: int | None = None
    states: Mapping[int, bytes] = field(default_factory=dict)  # conversation -> state


@dataclass(frozen=True)
class TtlChange:
    """None: unchanged; `clear`: removed; else the new one, counted from now."""

    ttl: TimeToLive | None = None
    clear: bool = False


@dataclass(frozen=True)
class EraseSettings:
    batch_conversations: int = 100  # conversations per transaction, at most
    pause_seconds: float = 0.005  # between batches, at least: other users get the database
    # Rows per transaction, about: the next batch's conversations are sized from the rows
    # the last batch's conversations held (PostgreSQL; at most batch_conversations).
    batch_rows: int = 500
    # The share of the erase's time spent in batches: after a batch of t seconds in the
    # database, a pause of t * (1 - duty_cycle) / duty_cycle (PostgreSQL; at most a
    # quarter of stale_seconds). 1: only pause_seconds.
    duty_cycle: float = 0.33
    stop_grace_seconds: float = 5.0  # how long running turns get to end after Stop
    stale_seconds: float = 30.0  # a running erasure silent this long was interrupted


class LifecycleStore(abc.ABC):
    @abc.abstractmethod
    async def set_conversation_facts(
        self,
        *,
        user_id: str,
        conversation_id: int,
        labels: LabelChange,
        ttl: TtlChange,
    ) -> Conversation:
        """Change labels and time to live; NotFound when absent."""

    @abc.abstractmethod
    async def search_conversations(
        self,
        *,
        where: ConversationFilter,
        page_size: int,
        before_id: int | None,
        include_total: bool = False,
        include_state_key: str = "",
    ) -> ConversationSearch:
        """Newest first (by id); `before_id` is the last id of the previous page."""

    @abc.abstractmethod
    async def purge_expired(self, *, batch_size: int = 500) -> DeleteCounts:
        """Delete conversations past their time to live, except those running a turn
        (as retention). Each batch is one transaction."""

    @abc.abstractmethod
    async def erase_user(self, *, user_id: str, settings: EraseSettings) -> ErasureReceipt:
        """Remove every row of the user (see EraseUser in the contract): resumable,
        idempotent, in batches. NotFound (user) when the user has no data and was never
        erased; ErasureRunning when another call's erase of the user is alive."""

    @abc.abstractmethod
    async def get_erasure_receipt(self, *, erasure_id: int) -> ErasureReceipt: ...
