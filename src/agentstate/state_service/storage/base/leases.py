"""The run leases aggregate's interface."""

from __future__ import annotations

import abc

from agentstate.state_service.domain import (
    AcquiredLease,
    Lease,
)


class LeaseStore(abc.ABC):
    """One running turn per conversation, fenced by task id."""

    @abc.abstractmethod
    async def get_lease(self, *, user_id: str, conversation_id: int) -> Lease | None:
        """The conversation's lease row as it is (lapsed ones too), None when there is none;
        NotFound when the conversation is absent."""

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
