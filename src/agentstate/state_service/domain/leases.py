"""Run leases: one turn per conversation."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from agentstate.state_service.domain.errors import InvalidArgument, LeaseHeld

MIN_LEASE_TTL_MS = 100


MAX_LEASE_TTL_MS = 3_600_000


MAX_HOLDER_CHARS = 200


@dataclass(frozen=True)
class Lease:
    task_id: int
    conversation_id: int
    user_id: str
    holder: str
    expire_time: datetime
    stop_requested: bool
    acquire_time: datetime | None = None  # filled by get_lease (the row's create_time)


@dataclass(frozen=True)
class AcquiredLease:
    lease: Lease
    lapsed_task_id: int | None = None  # the unreleased lease this one replaced


def validate_ttl_ms(ttl_ms: int) -> int:
    if not MIN_LEASE_TTL_MS <= ttl_ms <= MAX_LEASE_TTL_MS:
        raise InvalidArgument(
            f"ttl_ms must be between {MIN_LEASE_TTL_MS} and {MAX_LEASE_TTL_MS}, got {ttl_ms}"
        )
    return ttl_ms


def validate_holder(holder: str) -> str:
    if not holder or len(holder) > MAX_HOLDER_CHARS or not holder.isprintable():
        raise InvalidArgument(f"holder must be 1..{MAX_HOLDER_CHARS} printable characters")
    return holder


def lease_conflict_message(lease: Lease) -> str:
    return (
        f"conversation {lease.conversation_id} has a running turn "
        f"(task {lease.task_id}, until {lease.expire_time.isoformat()}); retry when it ends"
    )


def lease_held(lease: Lease) -> LeaseHeld:
    return LeaseHeld(lease_conflict_message(lease), lease.holder)
