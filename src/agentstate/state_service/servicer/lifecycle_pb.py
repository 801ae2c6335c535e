"""Protobuf <-> domain for the data lifecycle's fields (issue 23)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from agentstate.state.v1 import state_service_pb2 as pb
from agentstate.state_service import domain as d
from agentstate.state_service.servicer.translate import timestamp

STATUS_TO_PB = {
    d.ConversationStatus.IDLE: pb.CONVERSATION_STATUS_IDLE,
    d.ConversationStatus.RUNNING: pb.CONVERSATION_STATUS_RUNNING,
    d.ConversationStatus.AWAITING_CONFIRMATION: pb.CONVERSATION_STATUS_AWAITING_CONFIRMATION,
    d.ConversationStatus.FAILED: pb.CONVERSATION_STATUS_FAILED,
}
STATUS_OF_PB = {v: k for k, v in STATUS_TO_PB.items()}
POLICY_OF_PB = {
    pb.TTL_POLICY_UNSPECIFIED: d.TtlPolicy.FIXED,
    pb.TTL_POLICY_FIXED: d.TtlPolicy.FIXED,
    pb.TTL_POLICY_RENEW_ON_WRITE: d.TtlPolicy.RENEW_ON_WRITE,
}


def labels_of(labels: Mapping[str, str]) -> dict[str, str]:
    return d.validate_labels(dict(labels))


def ttl_of(request: Any, field: str) -> d.TimeToLive | None:
    """The request's TimeToLive in `field`, or None when unset."""
    if not request.HasField(field):
        return None
    ttl = getattr(request, field)
    policy = POLICY_OF_PB.get(ttl.policy)
    if policy is None:
        raise d.InvalidArgument(f"{field}.policy {ttl.policy} is not a TtlPolicy")
    return d.validate_ttl(ttl.seconds, policy)


def ttl_to_pb(ttl: d.TimeToLive) -> pb.TimeToLive:
    policy = (
        pb.TTL_POLICY_RENEW_ON_WRITE
        if ttl.policy is d.TtlPolicy.RENEW_ON_WRITE
        else pb.TTL_POLICY_FIXED
    )
    return pb.TimeToLive(seconds=ttl.seconds, policy=policy)


def statuses_of(values: Any) -> frozenset[d.ConversationStatus]:
    found = set()
    for index, value in enumerate(values):
        status = STATUS_OF_PB.get(value)
        if status is None:
            raise d.InvalidArgument(
                f"statuses[{index}] is {value}: not a ConversationStatus (IDLE, RUNNING, "
                "AWAITING_CONFIRMATION or FAILED)"
            )
        found.add(status)
    return frozenset(found)


def receipt_to_pb(receipt: d.ErasureReceipt) -> pb.ErasureReceipt:
    message = pb.ErasureReceipt(
        erasure_id=str(receipt.erasure_id),
        state=pb.ERASURE_STATE_DONE if receipt.done else pb.ERASURE_STATE_RUNNING,
        counts=dict(receipt.counts),
        start_time=timestamp(receipt.start_time),
    )
    if receipt.end_time is not None:
        message.end_time.CopyFrom(timestamp(receipt.end_time))
    return message
