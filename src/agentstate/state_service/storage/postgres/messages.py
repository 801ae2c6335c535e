"""Message records for UI replay, and compaction records."""

from __future__ import annotations

from collections.abc import Sequence

from agentstate.state_service import domain as d
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


class PostgresMessages(PostgresConnection, MessageStore):
    async def write_message(
        self, *, user_id: str, conversation_id: int, write: MessageWrite
    ) -> MessageRecord:
        params = {"user_id": user_id, "conversation_id": conversation_id, **write_arrays([write])}
        (row,) = await self._rows(sql.WRITE_MESSAGE, params, writes=[write])
        return message_of(row)

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
        records = [message_of(r) for r in rows if r["id"] is not None]
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
        return message_of(rows[0])
