"""Erasure of a user's data: EraseUser, GetErasureReceipt."""

from __future__ import annotations

from agentstate.client.convert._common import Op, time_of
from agentstate.client.types import ErasureReceipt
from agentstate.state.v1 import state_service_pb2 as pb


def _receipt_of(message: pb.ErasureReceipt) -> ErasureReceipt:
    return ErasureReceipt(
        erasure_id=message.erasure_id,
        done=message.state == pb.ERASURE_STATE_DONE,
        counts=dict(message.counts),
        start_time=time_of(message.start_time),
        end_time=time_of(message.end_time) if message.HasField("end_time") else None,
    )


def erase_user(user_id: str) -> Op[ErasureReceipt]:
    return Op("EraseUser", pb.EraseUserRequest(user_id=user_id), lambda r: _receipt_of(r.receipt))


def get_erasure_receipt(erasure_id: str) -> Op[ErasureReceipt]:
    return Op(
        "GetErasureReceipt",
        pb.GetErasureReceiptRequest(erasure_id=erasure_id),
        lambda r: _receipt_of(r.receipt),
    )
