"""Run leases: one turn per conversation, fenced by task id."""

from __future__ import annotations

from agentstate.state_service import domain as d
from agentstate.state_service.domain import (
    AcquiredLease,
    Lease,
    NotFound,
)
from agentstate.state_service.storage.base.leases import LeaseStore
from agentstate.state_service.storage.postgres import sql
from agentstate.state_service.storage.postgres.codecs import (
    Row,
)
from agentstate.state_service.storage.postgres.connection import (
    PostgresConnection,
)


def lease_of(row: Row) -> Lease:
    return Lease(
        task_id=int(row["task_id"]),
        conversation_id=int(row["conversation_id"]),
        user_id=row["user_id"],
        holder=row["holder"],
        expire_time=row["expire_time"],
        stop_requested=bool(row["stop_requested"]),
        acquire_time=row.get("create_time"),
    )


class PostgresLeases(PostgresConnection, LeaseStore):
    async def get_lease(self, *, user_id: str, conversation_id: int) -> Lease | None:
        rows = await self._rows(
            sql.GET_LEASE, {"user_id": user_id, "conversation_id": conversation_id}
        )
        if not rows:
            raise d.conversation_not_found(conversation_id)
        return lease_of(rows[0]) if rows[0]["task_id"] is not None else None

    async def acquire_lease(
        self,
        *,
        user_id: str,
        conversation_id: int,
        holder: str,
        ttl_ms: int,
        max_user_leases: int,
    ) -> AcquiredLease:
        (row,) = await self._rows(
            sql.ACQUIRE_LEASE,
            {
                "user_id": user_id,
                "conversation_id": conversation_id,
                "holder": holder,
                "ttl_ms": ttl_ms,
                "max_user_leases": max_user_leases,
            },
        )
        lease = Lease(
            task_id=int(row["task_id"]),
            conversation_id=conversation_id,
            user_id=user_id,
            holder=holder,
            expire_time=row["expire_time"],
            stop_requested=bool(row["stop_requested"]),
        )
        lapsed = row["lapsed_task_id"]
        return AcquiredLease(lease, int(lapsed) if lapsed is not None else None)

    async def renew_lease(self, *, user_id: str, task_id: int, ttl_ms: int) -> Lease:
        rows = await self._rows(
            sql.RENEW_LEASE, {"user_id": user_id, "task_id": task_id, "ttl_ms": ttl_ms}
        )
        if not rows:
            raise d.LeaseLost(f"lease of task {task_id} was lost (released or taken over)")
        return lease_of(rows[0])

    async def release_lease(self, *, user_id: str, task_id: int) -> bool:
        async with self._connection() as conn:
            cur = await conn.execute(sql.RELEASE_LEASE, {"user_id": user_id, "task_id": task_id})
            return cur.rowcount > 0

    async def request_stop(self, *, user_id: str, task_id: int) -> Lease:
        rows = await self._rows(sql.REQUEST_STOP, {"user_id": user_id, "task_id": task_id})
        if not rows:
            raise NotFound(f"no running task {task_id}", "task")
        return lease_of(rows[0])
