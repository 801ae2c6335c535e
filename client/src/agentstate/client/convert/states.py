"""State: GetState, UpsertState; the saved state and the payload-or-delta a save sends (EndTurn's
too)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from agentstate.client.convert._common import Op, Payload, payload_bytes, time_of
from agentstate.client.convert.messages import compaction_pb, message_write_pb, record_of
from agentstate.client.types import (
    CompactionNote,
    MessageWrite,
    SavedState,
    StateChange,
    StateSnapshot,
)
from agentstate.state.v1 import state_service_pb2 as pb


def get_state(user_id: str, conversation_id: str, state_key: str) -> Op[StateSnapshot]:
    return Op(
        "GetState",
        pb.GetStateRequest(user_id=user_id, conversation_id=conversation_id, state_key=state_key),
        lambda r: StateSnapshot(r.payload, int(r.version), time_of(r.update_time)),
    )


def state_delta_pb(change: StateChange) -> pb.StateDelta:
    delta = pb.StateDelta(
        base_version=change.base_version, drop_head=change.drop_head, messages=change.messages
    )
    if change.replace_from is not None:
        delta.replace_from = change.replace_from
    if change.fields_json is not None:
        delta.fields_json = change.fields_json
    return delta


def set_payload_or_delta(
    request: pb.UpsertStateRequest | pb.EndTurnRequest,
    payload: Payload | None,
    expected_version: int | None,
    delta: StateChange | None,
) -> None:
    """The whole payload (with its compare-and-set), or a delta (which carries its own):
    UpsertState's and EndTurn's."""
    if delta is not None:
        if payload is not None or expected_version is not None:
            raise ValueError("send a payload (with expected_version) or a delta, not both")
        request.delta.CopyFrom(state_delta_pb(delta))
        return
    if payload is None:
        raise ValueError("a save needs a payload or a delta")
    request.payload = payload_bytes(payload)
    if expected_version is not None:
        request.expected_version = expected_version


def saved_of(response: Any) -> SavedState:
    """A save's answer: UpsertState's, or EndTurn's (which also says if the lease went)."""
    return SavedState(
        version=int(response.version),
        update_time=time_of(response.update_time),
        records=[record_of(m) for m in response.messages],
        lease_released=bool(getattr(response, "lease_released", False)),
    )


def upsert_state(
    user_id: str,
    conversation_id: str,
    payload: Payload | None,
    *,
    expected_version: int | None,
    state_key: str,
    writes: Sequence[MessageWrite],
    compactions: Sequence[CompactionNote],
    delta: StateChange | None = None,
) -> Op[SavedState]:
    request = pb.UpsertStateRequest(
        user_id=user_id,
        conversation_id=conversation_id,
        state_key=state_key,
        message_writes=[message_write_pb(w) for w in writes],
        compaction_records=[compaction_pb(c) for c in compactions],
    )
    set_payload_or_delta(request, payload, expected_version, delta)
    return Op("UpsertState", request, saved_of)
