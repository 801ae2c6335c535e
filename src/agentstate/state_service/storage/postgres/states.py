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
from agentstate.state_service.storage.postgres.encryption import UserKeys, ad
from agentstate.state_service.storage.postgres.messages import (
    compaction_arrays,
    message_of,
    open_records,
    seal_record_texts,
    seal_writes,
    write_arrays,
)
from agentstate.state_service.storage.postgres.refusals import check_write_json, where_in_batch


def state_ad(user_id: str, conversation_id: int, state_key: str) -> bytes:
    """Every sealed part of one state (head, tail, messages, member values) is bound to
    its state row: the user, the conversation and the state key."""
    return ad(user_id, conversation_id, "state", state_key)


async def _sealed_form(keys: UserKeys, form: d.StateForm, ad: bytes) -> d.StateForm:
    """The stored form with every text sealed (member keys stay: the database merges
    and checks by them), or the form itself with encryption off."""
    if not keys.on:
        return form
    if form.head is None:
        return d.StateForm(keys=form.keys, values=tuple(await keys.seal_all(form.values, ad)))
    head, tail, *messages = await keys.seal_all([form.head, form.tail, *form.messages], ad)
    return d.StateForm(head=head, tail=tail, messages=tuple(messages))


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
        payload = await self._keys(user_id).open(
            row["payload"], state_ad(user_id, conversation_id, state_key)
        )
        return StoredState(payload, int(row["version"]), row["update_time"])

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
        keys = self._keys(user_id)
        ad = state_ad(user_id, conversation_id, state_key)
        params: dict[str, Any] = {
            "user_id": user_id,
            "conversation_id": conversation_id,
            "state_key": state_key,
            "task_id": task_id,
            **await seal_writes(
                keys,
                conversation_id,
                message_writes,
                write_arrays(message_writes),
                "message_writes",
            ),
            **compaction_arrays(compactions),
        }
        if delta is None:
            if payload is None:
                raise InvalidArgument("a save needs a payload or a delta")
            # The stored form is made here, from the text as sent (domain StateForm):
            # the database never re-prints a value.
            d.check_json_depth(payload, "payload")
            form = await _sealed_form(keys, d.state_form(payload), ad)
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
            if keys.on:  # sealed: the function appends and frames them as they are
                messages = tuple(await keys.seal_all(messages, ad))
                if fields is not None:
                    head, tail = await keys.seal_all(fields, ad)
                    fields = (head, tail)
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
            messages=await open_records(
                keys, [message_of(row) for row in rows if row["id"] is not None]
            ),
            lease_released=bool(first["lease_released"]),
        )

    async def begin_turn(
        self, *, user_id: str, conversation_id: int | None, start: TurnStart
    ) -> BegunTurn:
        guard = start.guard
        keys = self._keys(user_id)
        if keys.on:  # sealed, the database can no longer refuse them: checked here
            for index, new in enumerate(start.new_messages):
                check_write_json(new, where_in_batch(index, "new_messages"))
        blocks, metadata = await seal_record_texts(
            keys,
            conversation_id,
            [m.blocks_json for m in start.new_messages],
            [m.metadata_json for m in start.new_messages],
        )
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
            "blocks": TextArray(blocks),
            "metadata": TextArray(metadata),
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
            payload = (
                b""
                if omitted
                else await keys.open(
                    row["payload"],
                    state_ad(user_id, conversation.conversation_id, start.state_key),
                )
            )
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
