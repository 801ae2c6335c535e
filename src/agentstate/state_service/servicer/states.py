"""Agent states and turns: GetState, UpsertState, BeginTurn, EndTurn."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import grpc

from agentstate.common.state_metrics import (
    LOAD_DURATION,
    PAYLOAD_SIZE,
    SAVE_DURATION,
)
from agentstate.state.v1 import state_service_pb2 as pb
from agentstate.state_service import domain as d
from agentstate.state_service.servicer.base import ServicerBase
from agentstate.state_service.servicer.conversations import conversation_to_pb
from agentstate.state_service.servicer.leases import lease_to_pb
from agentstate.state_service.servicer.messages import (
    compaction_from_pb,
    message_to_pb,
    message_write_from_pb,
    new_message_from_pb,
)
from agentstate.state_service.servicer.translate import grpc_errors, timed, timestamp

# The payload-size metric's attributes, built once.
_LOADED = {"side": "server", "op": "load"}
_SAVED = {"side": "server", "op": "save"}


@dataclass(frozen=True)
class Save:
    """A validated UpsertState / EndTurn request."""

    user_id: str
    conversation_id: int
    state_key: str
    payload: bytes | None
    expected_version: int | None
    writes: list[d.MessageWrite]
    compactions: list[d.Compaction]
    delta: d.StateDelta | None
    max_state_bytes: int

    def arguments(self) -> dict[str, Any]:
        """The store's save_state keywords."""
        return {
            "user_id": self.user_id,
            "conversation_id": self.conversation_id,
            "state_key": self.state_key,
            "payload": self.payload,
            "expected_version": self.expected_version,
            "message_writes": self.writes,
            "compactions": self.compactions,
            "delta": self.delta,
            "max_state_bytes": self.max_state_bytes,
        }


def delta_from_pb(delta: pb.StateDelta) -> d.StateDelta:
    return d.StateDelta(
        base_version=delta.base_version,
        drop_head=delta.drop_head,
        replace_from=delta.replace_from if delta.HasField("replace_from") else None,
        messages=tuple(delta.messages),
        fields_json=delta.fields_json if delta.HasField("fields_json") else None,
    )


class StateRpcs(ServicerBase):
    @grpc_errors
    async def GetState(
        self, request: pb.GetStateRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.GetStateResponse:
        with timed(LOAD_DURATION):
            state = await self._store.get_state(
                user_id=d.validate_user_id(request.user_id),
                conversation_id=d.parse_id(request.conversation_id, "conversation_id"),
                state_key=d.validate_state_key(request.state_key),
            )
        PAYLOAD_SIZE.record(len(state.payload), _LOADED)
        return pb.GetStateResponse(
            payload=state.payload, version=state.version, update_time=timestamp(state.update_time)
        )

    def _save_request(self, request: pb.UpsertStateRequest | pb.EndTurnRequest) -> Save:
        expected: int | None = None
        if request.HasField("expected_version"):
            expected = request.expected_version
            if expected < 0:
                raise d.InvalidArgument("expected_version must not be negative")
        delta: d.StateDelta | None = None
        payload: bytes | None = request.payload
        if request.HasField("delta"):
            if request.payload:
                raise d.InvalidArgument("send either payload or delta, not both")
            if expected is not None:
                raise d.InvalidArgument(
                    "expected_version must be absent with a delta (delta.base_version is its "
                    "compare-and-set)"
                )
            # Checked by the store (both stores check a delta before anything else).
            delta = delta_from_pb(request.delta)
            payload = None
        else:
            d.check_state_payload(request.payload, self._max_payload_bytes)
        save = Save(
            user_id=d.validate_user_id(request.user_id),
            conversation_id=d.parse_id(request.conversation_id, "conversation_id"),
            state_key=d.validate_state_key(request.state_key),
            payload=payload,
            expected_version=expected,
            writes=[message_write_from_pb(w, i) for i, w in enumerate(request.message_writes)],
            compactions=[
                compaction_from_pb(c, i) for i, c in enumerate(request.compaction_records)
            ],
            delta=delta,
            max_state_bytes=self._max_payload_bytes,
        )
        sent = len(request.payload) if delta is None else request.delta.ByteSize()
        PAYLOAD_SIZE.record(sent, _SAVED)
        return save

    @grpc_errors
    async def UpsertState(
        self, request: pb.UpsertStateRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.UpsertStateResponse:
        save = self._save_request(request)
        with timed(SAVE_DURATION):
            result = await self._store.save_state(**save.arguments())
        return pb.UpsertStateResponse(
            version=result.version,
            update_time=timestamp(result.update_time),
            messages=[message_to_pb(m) for m in result.messages],
        )

    @grpc_errors
    async def BeginTurn(
        self, request: pb.BeginTurnRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.BeginTurnResponse:
        if request.max_user_leases < 0:
            raise d.InvalidArgument("max_user_leases must not be negative")
        guard: d.CardGuard | None = None
        which = request.WhichOneof("awaiting_confirm_guard")
        if which == "require_none_awaiting" and request.require_none_awaiting:
            guard = d.RequireNoneAwaiting()
        elif which == "require_awaiting_message_id":
            guard = d.RequireAwaiting(
                d.parse_id(request.require_awaiting_message_id, "require_awaiting_message_id")
            )
        user_id = d.validate_user_id(request.user_id)
        conversation_id = (
            d.parse_id(request.conversation_id, "conversation_id")
            if request.conversation_id
            else None
        )
        start = d.TurnStart(
            holder=d.validate_holder(request.holder),
            ttl_ms=d.validate_ttl_ms(request.ttl_ms),
            max_user_leases=request.max_user_leases,
            title=d.normalize_title(request.title, default=d.DEFAULT_TITLE),
            state_key=d.validate_state_key(request.state_key),
            cached_version=(request.cached_version if request.HasField("cached_version") else None),
            new_messages=tuple(
                new_message_from_pb(m, f"new_messages[{i}]")
                for i, m in enumerate(request.new_messages)
            ),
            guard=guard,
        )
        with timed(LOAD_DURATION):
            begun = await self._store.begin_turn(
                user_id=user_id, conversation_id=conversation_id, start=start
            )
        response = pb.BeginTurnResponse(
            conversation=conversation_to_pb(begun.conversation),
            conversation_created=begun.conversation_created,
            lease=lease_to_pb(begun.lease),
            lapsed_task_id=str(begun.lapsed_task_id) if begun.lapsed_task_id else "",
            interrupted_records=begun.interrupted_records,
            messages=[message_to_pb(m) for m in begun.messages],
        )
        if begun.state is not None:
            response.payload_omitted = begun.payload_omitted
            response.payload = begun.state.payload
            response.version = begun.state.version
            response.state_update_time.CopyFrom(timestamp(begun.state.update_time))
            PAYLOAD_SIZE.record(len(begun.state.payload), _LOADED)
        return response

    @grpc_errors
    async def EndTurn(
        self, request: pb.EndTurnRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.EndTurnResponse:
        save = self._save_request(request)
        task_id = d.parse_id(request.task_id, "task_id")
        with timed(SAVE_DURATION):
            result = await self._store.save_state(**save.arguments(), task_id=task_id)
        return pb.EndTurnResponse(
            version=result.version,
            update_time=timestamp(result.update_time),
            messages=[message_to_pb(m) for m in result.messages],
            lease_released=result.lease_released,
        )
