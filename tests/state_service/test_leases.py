"""Run leases and GetMessage through real gRPC, against both stores."""

from __future__ import annotations

import asyncio
from typing import TypeAlias

import grpc

from agentstate.common import error_details
from agentstate.state.v1 import state_service_pb2 as pb
from agentstate.state.v1 import state_service_pb2_grpc as pb_grpc
from tests.support.helpers import expect_rpc_error, new_conversation, user_text

Stub: TypeAlias = "pb_grpc.StateServiceAsyncStub"
HELD = grpc.StatusCode.FAILED_PRECONDITION


def _acquire(
    user_id: str, cid: str, ttl_ms: int = 30_000, limit: int = 0, holder: str = "replica-a"
) -> pb.AcquireLeaseRequest:
    return pb.AcquireLeaseRequest(
        user_id=user_id, conversation_id=cid, holder=holder, ttl_ms=ttl_ms, max_user_leases=limit
    )


async def test_one_lease_per_conversation(state_stub: Stub, user_id: str) -> None:
    cid = await new_conversation(state_stub, user_id)
    lease = (await state_stub.AcquireLease(_acquire(user_id, cid))).lease
    assert lease.task_id.isdigit() and lease.holder == "replica-a" and not lease.stop_requested
    held = await expect_rpc_error(
        state_stub.AcquireLease(_acquire(user_id, cid, holder="replica-b")),
        HELD,
        f"has a running turn (task {lease.task_id}, until ",
    )
    # Which replica runs it is for operators: ErrorInfo, not the message (issue 14).
    assert "replica-a" not in (held.details() or "")
    info = error_details.error_info(held)
    assert info is not None and (info.reason, info.metadata["holder"]) == (
        "LEASE_HELD",
        "replica-a",
    )
    released = await state_stub.ReleaseLease(
        pb.ReleaseLeaseRequest(user_id=user_id, task_id=lease.task_id)
    )
    assert released.released
    again = await state_stub.ReleaseLease(
        pb.ReleaseLeaseRequest(user_id=user_id, task_id=lease.task_id)
    )
    assert not again.released
    second = await state_stub.AcquireLease(_acquire(user_id, cid, holder="replica-b"))
    assert second.lease.task_id != lease.task_id
    assert second.lapsed_task_id == ""  # the previous one was released cleanly


async def test_expired_lease_can_be_taken_and_is_lost_to_its_holder(
    state_stub: Stub, user_id: str
) -> None:
    cid = await new_conversation(state_stub, user_id)
    acquired = await state_stub.AcquireLease(_acquire(user_id, cid, ttl_ms=100))
    first = acquired.lease
    assert acquired.lapsed_task_id == ""
    await asyncio.sleep(0.25)
    takeover = await state_stub.AcquireLease(_acquire(user_id, cid, holder="replica-b"))
    taken = takeover.lease
    assert taken.holder == "replica-b"
    assert takeover.lapsed_task_id == first.task_id  # it never released: report it
    await expect_rpc_error(
        state_stub.RenewLease(
            pb.RenewLeaseRequest(user_id=user_id, task_id=first.task_id, ttl_ms=1000)
        ),
        HELD,
        "was lost",
    )
    renewed = await state_stub.RenewLease(
        pb.RenewLeaseRequest(user_id=user_id, task_id=taken.task_id, ttl_ms=60_000)
    )
    assert renewed.lease.expire_time.ToDatetime() > taken.expire_time.ToDatetime()


async def test_concurrent_acquires_have_one_winner(state_stub: Stub, user_id: str) -> None:
    cid = await new_conversation(state_stub, user_id)
    results = await asyncio.gather(
        *(state_stub.AcquireLease(_acquire(user_id, cid, holder=f"r{i}")) for i in range(10)),
        return_exceptions=True,
    )
    winners = [r for r in results if isinstance(r, pb.AcquireLeaseResponse)]
    losers = [r for r in results if isinstance(r, grpc.aio.AioRpcError)]
    assert len(winners) == 1 and len(losers) == 9
    assert all(e.code() == HELD for e in losers)


async def test_per_user_limit(state_stub: Stub, user_id: str, other_user_id: str) -> None:
    cids = [await new_conversation(state_stub, user_id) for _ in range(3)]
    leases = [
        (await state_stub.AcquireLease(_acquire(user_id, c, limit=2))).lease for c in cids[:2]
    ]
    await expect_rpc_error(
        state_stub.AcquireLease(_acquire(user_id, cids[2], limit=2)),
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        "already has 2 running turns (limit 2)",
    )
    other = await new_conversation(state_stub, other_user_id)
    await state_stub.AcquireLease(_acquire(other_user_id, other, limit=2))
    await state_stub.ReleaseLease(
        pb.ReleaseLeaseRequest(user_id=user_id, task_id=leases[0].task_id)
    )
    await state_stub.AcquireLease(_acquire(user_id, cids[2], limit=2))


async def test_request_stop_reaches_the_holder(
    state_stub: Stub, user_id: str, other_user_id: str
) -> None:
    cid = await new_conversation(state_stub, user_id)
    lease = (await state_stub.AcquireLease(_acquire(user_id, cid))).lease
    await expect_rpc_error(
        state_stub.RequestStop(pb.RequestStopRequest(user_id=other_user_id, task_id=lease.task_id)),
        grpc.StatusCode.NOT_FOUND,
        "no running task",
    )
    stopped = await state_stub.RequestStop(
        pb.RequestStopRequest(user_id=user_id, task_id=lease.task_id)
    )
    assert stopped.lease.stop_requested
    renewed = await state_stub.RenewLease(
        pb.RenewLeaseRequest(user_id=user_id, task_id=lease.task_id, ttl_ms=5000)
    )
    assert renewed.lease.stop_requested
    await expect_rpc_error(
        state_stub.RequestStop(pb.RequestStopRequest(user_id=user_id, task_id="12345")),
        grpc.StatusCode.NOT_FOUND,
    )


async def test_lease_errors(state_stub: Stub, user_id: str, other_user_id: str) -> None:
    cid = await new_conversation(state_stub, user_id)
    await expect_rpc_error(
        state_stub.AcquireLease(_acquire(other_user_id, cid)), grpc.StatusCode.NOT_FOUND
    )
    await expect_rpc_error(
        state_stub.AcquireLease(_acquire(user_id, cid, ttl_ms=5)),
        grpc.StatusCode.INVALID_ARGUMENT,
        "ttl_ms",
    )
    await expect_rpc_error(
        state_stub.AcquireLease(_acquire(user_id, cid, holder="")),
        grpc.StatusCode.INVALID_ARGUMENT,
        "holder",
    )
    await expect_rpc_error(
        state_stub.AcquireLease(_acquire(user_id, cid, limit=-1)),
        grpc.StatusCode.INVALID_ARGUMENT,
        "max_user_leases",
    )


async def test_delete_removes_the_lease(state_stub: Stub, user_id: str) -> None:
    cid = await new_conversation(state_stub, user_id)
    lease = (await state_stub.AcquireLease(_acquire(user_id, cid))).lease
    await state_stub.DeleteConversation(
        pb.DeleteConversationRequest(user_id=user_id, conversation_id=cid)
    )
    await expect_rpc_error(
        state_stub.RequestStop(pb.RequestStopRequest(user_id=user_id, task_id=lease.task_id)),
        grpc.StatusCode.NOT_FOUND,
    )
    await expect_rpc_error(
        state_stub.AcquireLease(_acquire(user_id, cid)), grpc.StatusCode.NOT_FOUND
    )


async def test_get_message(state_stub: Stub, user_id: str, other_user_id: str) -> None:
    cid = await new_conversation(state_stub, user_id)
    record = (
        await state_stub.AppendMessage(
            pb.AppendMessageRequest(user_id=user_id, conversation_id=cid, message=user_text("hi"))
        )
    ).message
    got = await state_stub.GetMessage(
        pb.GetMessageRequest(user_id=user_id, conversation_id=cid, message_id=record.message_id)
    )
    assert got.message == record
    await expect_rpc_error(
        state_stub.GetMessage(
            pb.GetMessageRequest(
                user_id=other_user_id, conversation_id=cid, message_id=record.message_id
            )
        ),
        grpc.StatusCode.NOT_FOUND,
    )
    await expect_rpc_error(
        state_stub.GetMessage(
            pb.GetMessageRequest(user_id=user_id, conversation_id=cid, message_id="99")
        ),
        grpc.StatusCode.NOT_FOUND,
        "message 99 not found",
    )


async def test_get_lease_reads_who_runs_since_when(
    state_stub: Stub, user_id: str, other_user_id: str
) -> None:
    cid = await new_conversation(state_stub, user_id)
    get = pb.GetLeaseRequest(user_id=user_id, conversation_id=cid)
    assert not (await state_stub.GetLease(get)).HasField("lease")  # never taken
    taken = (await state_stub.AcquireLease(_acquire(user_id, cid, ttl_ms=100))).lease
    read = (await state_stub.GetLease(get)).lease
    assert (read.task_id, read.holder, read.user_id) == (taken.task_id, "replica-a", user_id)
    assert read.expire_time == taken.expire_time
    assert read.HasField("acquire_time")
    assert read.acquire_time.ToDatetime() <= read.expire_time.ToDatetime()
    # Read-only: a lapsed lease is still reported (its turn died) and can still be taken over.
    await asyncio.sleep(0.2)
    assert (await state_stub.GetLease(get)).lease.task_id == taken.task_id
    takeover = await state_stub.AcquireLease(_acquire(user_id, cid, holder="replica-b"))
    assert takeover.lapsed_task_id == taken.task_id
    await state_stub.ReleaseLease(
        pb.ReleaseLeaseRequest(user_id=user_id, task_id=takeover.lease.task_id)
    )
    assert not (await state_stub.GetLease(get)).HasField("lease")
    # Another user's conversation, an unknown one, a deleted one, a malformed id.
    await expect_rpc_error(
        state_stub.GetLease(pb.GetLeaseRequest(user_id=other_user_id, conversation_id=cid)),
        grpc.StatusCode.NOT_FOUND,
        "not found",
    )
    await expect_rpc_error(
        state_stub.GetLease(pb.GetLeaseRequest(user_id=user_id, conversation_id="123456789")),
        grpc.StatusCode.NOT_FOUND,
        "not found",
    )
    await expect_rpc_error(
        state_stub.GetLease(pb.GetLeaseRequest(user_id=user_id, conversation_id="x")),
        grpc.StatusCode.INVALID_ARGUMENT,
        "conversation_id",
    )
    await state_stub.AcquireLease(_acquire(user_id, cid))
    await state_stub.DeleteConversation(
        pb.DeleteConversationRequest(user_id=user_id, conversation_id=cid)
    )
    await expect_rpc_error(state_stub.GetLease(get), grpc.StatusCode.NOT_FOUND, "not found")
