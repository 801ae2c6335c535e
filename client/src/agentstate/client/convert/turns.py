"""Turns: BeginTurn and EndTurn (a lease, the messages and the state in one call each)."""

from __future__ import annotations

from collections.abc import Sequence

from agentstate.client.convert._common import Op, Payload, time_of
from agentstate.client.convert.conversations import conversation_of
from agentstate.client.convert.leases import lease_of
from agentstate.client.convert.messages import (
    compaction_pb,
    message_write_pb,
    new_message_pb,
    record_of,
)
from agentstate.client.convert.states import saved_of, set_payload_or_delta
from agentstate.client.types import (
    BegunTurn,
    CompactionNote,
    MessageWrite,
    NoOpenCard,
    OpenCard,
    SavedState,
    StateChange,
    StateSnapshot,
    TurnRequest,
)
from agentstate.state.v1 import state_service_pb2 as pb


def _begun(response: pb.BeginTurnResponse) -> BegunTurn:
    state = None
    if response.version:
        state = StateSnapshot(
            response.payload, int(response.version), time_of(response.state_update_time)
        )
    return BegunTurn(
        conversation=conversation_of(response.conversation),
        conversation_created=response.conversation_created,
        lease=lease_of(response.lease),
        lapsed_task_id=response.lapsed_task_id,
        interrupted_records=response.interrupted_records,
        state=state,
        records=[record_of(m) for m in response.messages],
        payload_omitted=response.payload_omitted,
    )


def begin_turn(request: TurnRequest) -> Op[BegunTurn]:
    message = pb.BeginTurnRequest(
        user_id=request.user_id,
        conversation_id=request.conversation_id,
        title=request.title,
        state_key=request.state_key,
        holder=request.holder,
        ttl_ms=request.ttl_ms,
        max_user_leases=request.max_user_leases,
        new_messages=[new_message_pb(r) for r in request.new_records],
    )
    if request.cached_version is not None:
        message.cached_version = request.cached_version
    if isinstance(request.guard, NoOpenCard):
        message.require_none_awaiting = True
    elif isinstance(request.guard, OpenCard):
        message.require_awaiting_message_id = request.guard.message_id
    return Op("BeginTurn", message, _begun)


def end_turn(
    user_id: str,
    conversation_id: str,
    task_id: str,
    payload: Payload | None,
    *,
    expected_version: int | None,
    state_key: str,
    writes: Sequence[MessageWrite],
    compactions: Sequence[CompactionNote],
    delta: StateChange | None = None,
) -> Op[SavedState]:
    request = pb.EndTurnRequest(
        user_id=user_id,
        conversation_id=conversation_id,
        task_id=task_id,
        state_key=state_key,
        message_writes=[message_write_pb(w) for w in writes],
        compaction_records=[compaction_pb(c) for c in compactions],
    )
    set_payload_or_delta(request, payload, expected_version, delta)
    return Op("EndTurn", request, saved_of)
