"""Run leases: acquire, renew, release, stop, read."""

from __future__ import annotations

from typing import Any

import grpc

from agentstate.state.v1 import state_service_pb2 as pb
from agentstate.state_service import domain as d
from agentstate.state_service.servicer.base import ServicerBase
from agentstate.state_service.servicer.translate import grpc_errors, timestamp


def lease_to_pb(lease: d.Lease) -> pb.Lease:
    return pb.Lease(
        task_id=str(lease.task_id),
        conversation_id=str(lease.conversation_id),
        user_id=lease.user_id,
        holder=lease.holder,
        expire_time=timestamp(lease.expire_time),
        stop_requested=lease.stop_requested,
        acquire_time=timestamp(lease.acquire_time) if lease.acquire_time else None,
    )


class LeaseRpcs(ServicerBase):
    @grpc_errors
    async def AcquireLease(
        self, request: pb.AcquireLeaseRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.AcquireLeaseResponse:
        if request.max_user_leases < 0:
            raise d.InvalidArgument("max_user_leases must not be negative")
        acquired = await self._store.acquire_lease(
            user_id=d.validate_user_id(request.user_id),
            conversation_id=d.parse_id(request.conversation_id, "conversation_id"),
            holder=d.validate_holder(request.holder),
            ttl_ms=d.validate_ttl_ms(request.ttl_ms),
            max_user_leases=request.max_user_leases,
        )
        lapsed = acquired.lapsed_task_id
        return pb.AcquireLeaseResponse(
            lease=lease_to_pb(acquired.lease), lapsed_task_id=str(lapsed) if lapsed else ""
        )

    @grpc_errors
    async def RenewLease(
        self, request: pb.RenewLeaseRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.RenewLeaseResponse:
        lease = await self._store.renew_lease(
            user_id=d.validate_user_id(request.user_id),
            task_id=d.parse_id(request.task_id, "task_id"),
            ttl_ms=d.validate_ttl_ms(request.ttl_ms),
        )
        return pb.RenewLeaseResponse(lease=lease_to_pb(lease))

    @grpc_errors
    async def ReleaseLease(
        self, request: pb.ReleaseLeaseRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.ReleaseLeaseResponse:
        released = await self._store.release_lease(
            user_id=d.validate_user_id(request.user_id),
            task_id=d.parse_id(request.task_id, "task_id"),
        )
        return pb.ReleaseLeaseResponse(released=released)

    @grpc_errors
    async def RequestStop(
        self, request: pb.RequestStopRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.RequestStopResponse:
        lease = await self._store.request_stop(
            user_id=d.validate_user_id(request.user_id),
            task_id=d.parse_id(request.task_id, "task_id"),
        )
        return pb.RequestStopResponse(lease=lease_to_pb(lease))

    @grpc_errors
    async def GetLease(
        self, request: pb.GetLeaseRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.GetLeaseResponse:
        lease = await self._store.get_lease(
            user_id=d.validate_user_id(request.user_id),
            conversation_id=d.parse_id(request.conversation_id, "conversation_id"),
        )
        return pb.GetLeaseResponse(lease=lease_to_pb(lease) if lease is not None else None)
