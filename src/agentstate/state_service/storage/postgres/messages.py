"""Message records for UI replay, and compaction records."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from agentstate.state_service import domain as d
from agentstate.state_service.crypto import envelope
from agentstate.state_service.domain import (
    Compaction,
    MessageRecord,
    MessageRole,
    MessageStatus,
    MessageWrite,
    NewMessage,
    Page,
)
from agentstate.state_service.storage.base.messages import MessageStore
from agentstate.state_service.storage.postgres import sql
from agentstate.state_service.storage.postgres.codecs import (
    BigintArray,
    Row,
    TextArray,
)
from agentstate.state_service.storage.postgres.connection import (
    PostgresConnection,
)
from agentstate.state_service.storage.postgres.encryption import UserKeys, ad
from agentstate.state_service.storage.postgres.refusals import check_write_json, where_in_batch


def message_of(row: Row) -> MessageRecord:
    return MessageRecord(
        message_id=int(row["id"]),
        conversation_id=int(row["conversation_id"]),
        user_id=row["user_id"],
        role=MessageRole(row["role"]),
        blocks_json=row["blocks"],
        status=MessageStatus(row["status"]),
        metadata_json=row["metadata"],
        create_time=row["create_time"],
        update_time=row["update_time"],
    )


def compaction_of(row: Row) -> Compaction:
    return Compaction(
        compaction_id=int(row["id"]),
        messages_before=int(row["messages_before"]),
        messages_after=int(row["messages_after"]),
        tokens_before=int(row["tokens_before"]),
        tokens_after=int(row["tokens_after"]),
        summary_chars=int(row["summary_chars"]),
        reason=row["reason"],
        create_time=row["create_time"],
    )


def write_arrays(writes: Sequence[MessageWrite]) -> dict[str, TextArray | BigintArray]:
    """Message writes as the parallel arrays agentstate_write_messages() takes."""
    kinds: list[str] = []
    message_ids: list[int | None] = []
    roles: list[str | None] = []
    statuses: list[str | None] = []
    blocks: list[bytes | None] = []
    metadata: list[bytes | None] = []
    expected: list[str | None] = []
    for write in writes:
        if isinstance(write, NewMessage):
            kinds.append("insert")
            message_ids.append(None)
            roles.append(write.role.value)
            statuses.append(write.status.value)
            expected.append(None)
        else:
            kinds.append("update")
            message_ids.append(write.message_id)
            roles.append(None)
            statuses.append(write.status.value if write.status else None)
            expected.append(write.expected_status.value if write.expected_status else None)
        blocks.append(write.blocks_json)
        metadata.append(write.metadata_json)
    return {
        "kinds": TextArray(kinds),
        "message_ids": BigintArray(message_ids),
        "roles": TextArray(roles),
        "statuses": TextArray(statuses),
        "blocks": TextArray(blocks),
        "metadata": TextArray(metadata),
        "expected_statuses": TextArray(expected),
    }


def compaction_arrays(compactions: Sequence[Compaction]) -> dict[str, TextArray | BigintArray]:
    numbers: list[int | None] = []
    for c in compactions:
        numbers += [
            c.messages_before,
            c.messages_after,
            c.tokens_before,
            c.tokens_after,
            c.summary_chars,
        ]
    return {
        "compactions": BigintArray(numbers),
        "reasons": TextArray([c.reason for c in compactions]),
    }


def _record_ad(user_id: str, conversation_id: int | None, field: str) -> bytes:
    """A record's blocks and metadata are bound to their user, conversation and field
    (the record's id is the database's, given after the text is sealed). The records a
    BeginTurn appends to the conversation it creates are sealed before it has an id:
    they are bound to "new" (NEW_CONVERSATION) instead."""
    return ad(
        user_id,
        NEW_CONVERSATION if conversation_id is None else conversation_id,
        f"message.{field}",
    )


NEW_CONVERSATION = "new"


# The jsonb columns check their type (blocks an array, metadata an object), so a token
# is kept as one: ["\u0001..."] and {"\u0001": "..."}, as jsonb prints them.
_SEALED_PREFIX = {"blocks": b'["\\u0001', "metadata": b'{"\\u0001": "'}
_SEALED_SUFFIX = {"blocks": b'"]', "metadata": b'"}'}


def _sealed_json(token: str, field: str) -> bytes:
    return _SEALED_PREFIX[field] + token[1:].encode() + _SEALED_SUFFIX[field]


def _token_of(data: bytes | None, field: str) -> str | None:
    prefix = _SEALED_PREFIX[field]
    if data is None or not data.startswith(prefix):
        return None
    return "\x01" + data[len(prefix) : -2].decode()


async def seal_record_texts(
    keys: UserKeys,
    conversation_id: int | None,
    blocks: Sequence[bytes | None],
    metadata: Sequence[bytes | None],
) -> tuple[list[bytes | None], list[bytes | None]]:
    """Blocks and metadata sealed (checked first as PostgreSQL would have: a sealed text
    is a JSON string to it, so it can no longer refuse them); as they are when off."""
    if not keys.on:
        return list(blocks), list(metadata)
    key = await keys.for_write()
    user_id = keys.user_id
    out: list[list[bytes | None]] = []
    for field, texts in (("blocks", blocks), ("metadata", metadata)):
        bound = _record_ad(user_id, conversation_id, field)
        out.append(
            [
                None if t is None else _sealed_json(envelope.seal_text(key, t, bound), field)
                for t in texts
            ]
        )
    return out[0], out[1]


async def seal_writes(
    keys: UserKeys,
    conversation_id: int,
    writes: Sequence[MessageWrite],
    arrays: dict[str, TextArray | BigintArray],
    batch: str | None,
) -> dict[str, TextArray | BigintArray]:
    """write_arrays' arrays with the blocks and metadata sealed."""
    if not keys.on or not writes:
        return arrays
    for index, write in enumerate(writes):
        check_write_json(write, where_in_batch(index, batch))
    blocks, metadata = await seal_record_texts(
        keys,
        conversation_id,
        [w.blocks_json for w in writes],
        [w.metadata_json for w in writes],
    )
    return arrays | {"blocks": TextArray(blocks), "metadata": TextArray(metadata)}


def _open_record_text(
    key: envelope.DataKey | None, token: str, user_id: str, conversation_id: int, field: str
) -> bytes:
    try:
        return envelope.open_token(
            key, token, _record_ad(user_id, conversation_id, field), user_id=user_id
        )
    except d.CiphertextRejected:
        # Appended by the BeginTurn that created the conversation (see _record_ad).
        return envelope.open_token(key, token, _record_ad(user_id, None, field), user_id=user_id)


async def open_records(keys: UserKeys, records: list[MessageRecord]) -> list[MessageRecord]:
    """Records with sealed blocks and metadata opened."""
    sealed = [
        (_token_of(r.blocks_json, "blocks"), _token_of(r.metadata_json, "metadata"))
        for r in records
    ]
    if not any(b or m for b, m in sealed):
        return records
    key = await keys.for_read("\x01")
    opened = []
    for record, (blocks, metadata) in zip(records, sealed, strict=True):
        changes: dict[str, bytes] = {}
        for field, token in (("blocks", blocks), ("metadata", metadata)):
            if token is not None:
                changes[f"{field}_json"] = _open_record_text(
                    key, token, keys.user_id, record.conversation_id, field
                )
        opened.append(dataclasses.replace(record, **changes))  # type: ignore[arg-type]
    return opened


class PostgresMessages(PostgresConnection, MessageStore):
    async def write_message(
        self, *, user_id: str, conversation_id: int, write: MessageWrite
    ) -> MessageRecord:
        keys = self._keys(user_id)
        arrays = await seal_writes(keys, conversation_id, [write], write_arrays([write]), None)
        params = {"user_id": user_id, "conversation_id": conversation_id, **arrays}
        (row,) = await self._rows(sql.WRITE_MESSAGE, params, writes=[write])
        return (await open_records(keys, [message_of(row)]))[0]

    async def list_messages(
        self,
        *,
        user_id: str,
        conversation_id: int,
        page_size: int,
        after_id: int | None,
        newest_first: bool = False,
    ) -> Page[MessageRecord]:
        statement = sql.LIST_MESSAGES_NEWEST_FIRST if newest_first else sql.LIST_MESSAGES
        rows = await self._rows(
            statement,
            {
                "user_id": user_id,
                "conversation_id": conversation_id,
                "after_id": after_id,
                "limit": page_size + 1,
            },
        )
        if not rows:
            raise d.conversation_not_found(conversation_id)
        records = await open_records(
            self._keys(user_id), [message_of(r) for r in rows if r["id"] is not None]
        )
        items = records[:page_size]
        token = str(items[-1].message_id) if len(records) > page_size else ""
        return Page(items, token)

    async def list_compactions(self, *, user_id: str, conversation_id: int) -> list[Compaction]:
        rows = await self._rows(
            sql.LIST_COMPACTIONS, {"user_id": user_id, "conversation_id": conversation_id}
        )
        if not rows:
            raise d.conversation_not_found(conversation_id)
        return [compaction_of(row) for row in rows if row["id"] is not None]

    async def get_message(
        self, *, user_id: str, conversation_id: int, message_id: int
    ) -> MessageRecord:
        rows = await self._rows(
            sql.SELECT_MESSAGE,
            {"user_id": user_id, "conversation_id": conversation_id, "message_id": message_id},
        )
        if not rows:
            raise d.message_not_found(message_id, conversation_id)
        return (await open_records(self._keys(user_id), [message_of(rows[0])]))[0]
