"""Run leases in memory."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

from agentstate.state_service import domain as d
from agentstate.state_service.domain import (
    AcquiredLease,
    Lease,
    NotFound,
)
from agentstate.state_service.storage.base.leases import LeaseStore
from agentstate.state_service.storage.memory.tables import (
    MemoryTables,
    utc_now,
)


class MemoryLeases(MemoryTables, LeaseStore):
    async def get_lease(self, *, user_id: str, conversation_id: int) -> Lease | None:
        async with self._lock:
            self._conversation(user_id, conversation_id)
            return self._leases.get(conversation_id)

    async def acquire_lease(
        self,
        *,
        user_id: str,
        conversation_id: int,
        holder: str,
        ttl_ms: int,
        max_user_leases: int,
    ) -> AcquiredLease:
        async with self._lock:
            self._conversation(user_id, conversation_id)
            held = self._check_lease(user_id, conversation_id, max_user_leases)
            lease = self._new_lease(user_id, conversation_id, holder, ttl_ms)
            return AcquiredLease(lease, held.task_id if held is not None else None)

    async def renew_lease(self, *, user_id: str, task_id: int, ttl_ms: int) -> Lease:
        async with self._lock:
            lease = self._lease_of_task(user_id, task_id)
            if lease is None:
                raise d.LeaseLost(f"lease of task {task_id} was lost (released or taken over)")
            renewed = replace(lease, expire_time=utc_now() + timedelta(milliseconds=ttl_ms))
            self._leases[lease.conversation_id] = renewed
            return renewed

    async def release_lease(self, *, user_id: str, task_id: int) -> bool:
        async with self._lock:
            lease = self._lease_of_task(user_id, task_id)
            if lease is None:
                return False
            del self._leases[lease.conversation_id]
            return True

    async def request_stop(self, *, user_id: str, task_id: int) -> Lease:
        async with self._lock:
            lease = self._lease_of_task(user_id, task_id)
            if lease is None or lease.expire_time <= utc_now():
                raise NotFound(f"no running task {task_id}", "task")
            stopped = replace(lease, stop_requested=True)
            self._leases[lease.conversation_id] = stopped
            return stopped
