"""Agent states and turns: whole and delta saves under compare-and-set, BeginTurn."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from agentstate.state_service import domain as d
from agentstate.state_service.domain import (
    BegunTurn,
    Compaction,
    Conversation,
    InvalidArgument,
    Lease,
    MessageRecord,
    MessageWrite,
    NotFound,
    RequireAwaiting,
    RequireNoneAwaiting,
    StateDelta,
    StoredState,
    TurnStart,
    UpsertResult,
)
from agentstate.state_service.storage.base.states import AgentStateStore
from agentstate.state_service.storage.postgres import sql
from agentstate.state_service.storage.postgres.codecs import (
    TextArray,
)
from agentstate.state_service.storage.postgres.connection import (
    PostgresConnection,
)
from agentstate.state_service.storage.postgres.messages import (
    compaction_arrays,
    message_of,
    write_arrays,
)


class PostgresStates(PostgresConnection, AgentStateStore):
    async def get_state(self, *, user_id: str, conversation_id: int, state_key: str) -> StoredState:
        rows = await self._rows(
            sql.SELECT_STATE,
            {"user_id": user_id, "conversation_id": conversation_id, "state_key": state_key},
            raw_text=True,
        )
        if not rows:
            raise d.conversation_not_found(conversation_id)
        row = rows[0]
        if row["version"] is None:
            raise NotFound(
                f"conversation {conversation_id} has no state {state_key!r} yet", "state"
            )
        return StoredState(row["payload"], int(row["version"]), row["update_time"])

    async def save_state(
        self,
        *,
        user_id: str,
        conversation_id: int,
        state_key: str,
        payload: bytes | None,
        expected_version: int | None,
        message_writes: Sequence[MessageWrite] = (),
        compactions: Sequence[Compaction] = (),
        task_id: int | None = None,
        delta: StateDelta | None = None,
        max_state_bytes: int | None = None,
    ) -> UpsertResult:
        params: dict[str, Any] = {
            "user_id": user_id,
            "conversation_id": conversation_id,
            "state_key": state_key,
            "task_id": task_id,
            **write_arrays(message_writes),
            **compaction_arrays(compactions),
        }
        if delta is None:
            if payload is None:
                raise InvalidArgument("a save needs a payload or a delta")
            # The stored form is made here, from the text as sent (domain StateForm):
            # the database never re-prints a value.
            d.check_json_depth(payload, "payload")
            form = d.state_form(payload)
            params |= {
                "keys": None if form.split else TextArray(form.keys),
                "values": None if form.split else TextArray(form.values),
                "head": form.head,
                "tail": form.tail if form.split else None,
                "context": TextArray(form.messages) if form.split else None,
                "expected_version": expected_version,
                "base_version": None,
                "drop_head": 0,
                "replace_from": None,
                "delta_messages": None,
                "fields_head": None,
                "fields_tail": None,
                "max_bytes": None,
            }
        else:
            d.check_state_delta(delta)
            messages, fields = d.check_delta_parts(delta)
            params |= {
                "keys": None,
                "values": None,
                "head": None,
                "tail": None,
                "context": None,
                "expected_version": None,
                "base_version": delta.base_version,
                "drop_head": delta.drop_head,
                "replace_from": delta.replace_from,
                "delta_messages": TextArray(messages),
                "fields_head": None if fields is None else fields[0],
                "fields_tail": None if fields is None else fields[1],
                "max_bytes": max_state_bytes,
            }
        rows = await self._rows(
            sql.SAVE_STATE,
            params,
            batch="message_writes",
            writes=message_writes,
            delta=delta,
        )
        first = rows[0]
        return UpsertResult(
            version=int(first["version"]),
            update_time=first["state_update_time"],
            messages=[message_of(row) for row in rows if row["id"] is not None],
            lease_released=bool(first["lease_released"]),
        )

    async def begin_turn(
        self, *, user_id: str, conversation_id: int | None, start: TurnStart
    ) -> BegunTurn:
        guard = start.guard
        params = {
            "user_id": user_id,
            "conversation_id": conversation_id,
            "title": start.title,
            "state_key": start.state_key,
            "holder": start.holder,
            "ttl_ms": start.ttl_ms,
            "max_user_leases": start.max_user_leases,
            "require_none_awaiting": isinstance(guard, RequireNoneAwaiting),
            "require_awaiting_message_id": (
                guard.message_id if isinstance(guard, RequireAwaiting) else None
            ),
            "roles": TextArray([m.role.value for m in start.new_messages]),
            "statuses": TextArray([m.status.value for m in start.new_messages]),
            "blocks": TextArray([m.blocks_json for m in start.new_messages]),
            "metadata": TextArray([m.metadata_json for m in start.new_messages]),
            "cached_version": start.cached_version,
        }
        (row,) = await self._rows(
            sql.BEGIN_TURN, params, batch="new_messages", writes=start.new_messages, raw_text=True
        )
        conversation = Conversation(
            conversation_id=int(row["conversation_id"]),
            user_id=user_id,
            title=bytes(row["title"]).decode(),  # text columns are raw on this cursor
            create_time=row["create_time"],
            update_time=row["update_time"],
            external_key=bytes(row["external_key"]).decode() if row["external_key"] else "",
        )
        lease = Lease(
            task_id=int(row["task_id"]),
            conversation_id=conversation.conversation_id,
            user_id=user_id,
            holder=start.holder,
            expire_time=row["expire_time"],
            stop_requested=bool(row["stop_requested"]),
        )
        state = None
        omitted = bool(row["payload_omitted"])
        if row["version"] is not None:
            payload = b"" if omitted else row["payload"]
            state = StoredState(payload, int(row["version"]), row["state_update_time"])
        # The appended records are what was sent, with the ids and time they were given.
        messages = [
            MessageRecord(
                message_id=int(message_id),
                conversation_id=conversation.conversation_id,
                user_id=user_id,
                role=new.role,
                blocks_json=new.blocks_json,
                status=new.status,
                metadata_json=new.metadata_json,
                create_time=row["message_time"],
                update_time=row["message_time"],
            )
            for message_id, new in zip(row["message_ids"], start.new_messages, strict=True)
        ]
        lapsed = row["lapsed_task_id"]
        return BegunTurn(
            conversation=conversation,
            conversation_created=bool(row["conversation_created"]),
            lease=lease,
            lapsed_task_id=int(lapsed) if lapsed is not None else None,
            interrupted_records=int(row["interrupted_records"]),
            state=state,
            messages=messages,
            payload_omitted=omitted,
        )

    async def split_whole_states(self, *, batch_size: int = 200, pause: float = 0.0) -> int:
        """The online migration of migration 11: split every state stored whole (whose
        "context" is an array) into rows, `batch_size` per transaction, beside live
        traffic (rows a writer holds are skipped and picked up by the next pass; any
        save splits its state too). Returns how many it split."""
        total = 0
        while True:
            key: tuple[str | None, int | None, str | None] = (None, None, None)
            while True:
                (row,) = await self._rows(
                    sql.SPLIT_STATES,
                    {
                        "batch": batch_size,
                        "user_id": key[0],
                        "session_id": key[1],
                        "state_key": key[2],
                    },
                )
                total += int(row["split"])
                if row["last_user_id"] is None:
                    break
                key = (row["last_user_id"], int(row["last_session_id"]), row["last_state_key"])
                if pause:
                    await asyncio.sleep(pause)
            (left,) = await self._rows(sql.COUNT_UNSPLIT_STATES, {})
            if int(left["unsplit"]) == 0:
                return total
            await asyncio.sleep(max(pause, 0.05))  # a writer held some: another pass
