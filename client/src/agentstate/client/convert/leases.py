"""Leases: AcquireLease, GetLease, RenewLease, ReleaseLease, RequestStop."""

from __future__ import annotations

from agentstate.client.convert._common import Op, time_of
from agentstate.client.types import AcquiredLease, LeaseInfo
from agentstate.state.v1 import state_service_pb2 as pb


def lease_of(message: pb.Lease) -> LeaseInfo:
    return LeaseInfo(
        task_id=message.task_id,
        conversation_id=message.conversation_id,
        stop_requested=message.stop_requested,
        expire_time=time_of(message.expire_time),
        holder=message.holder,
        acquire_time=time_of(message.acquire_time) if message.HasField("acquire_time") else None,
    )


def acquire_lease(
    user_id: str, conversation_id: str, holder: str, ttl_ms: int, max_user_leases: int
) -> Op[AcquiredLease]:
    return Op(
        "AcquireLease",
        pb.AcquireLeaseRequest(
            user_id=user_id,
            conversation_id=conversation_id,
            holder=holder,
            ttl_ms=ttl_ms,
            max_user_leases=max_user_leases,
        ),
        lambda r: AcquiredLease(lease_of(r.lease), r.lapsed_task_id),
    )


def get_lease(user_id: str, conversation_id: str) -> Op[LeaseInfo | None]:
    return Op(
        "GetLease",
        pb.GetLeaseRequest(user_id=user_id, conversation_id=conversation_id),
        lambda r: lease_of(r.lease) if r.HasField("lease") else None,
    )


def renew_lease(user_id: str, task_id: str, ttl_ms: int) -> Op[LeaseInfo]:
    return Op(
        "RenewLease",
        pb.RenewLeaseRequest(user_id=user_id, task_id=task_id, ttl_ms=ttl_ms),
        lambda r: lease_of(r.lease),
    )


def release_lease(user_id: str, task_id: str) -> Op[bool]:
    return Op(
        "ReleaseLease",
        pb.ReleaseLeaseRequest(user_id=user_id, task_id=task_id),
        lambda r: bool(r.released),
    )


def request_stop(user_id: str, task_id: str) -> Op[LeaseInfo]:
    return Op(
        "RequestStop",
        pb.RequestStopRequest(user_id=user_id, task_id=task_id),
        lambda r: lease_of(r.lease),
    )
