"""Conversations: create, resolve by external key, list, rename, delete, retention."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime

from agentstate.state_service import domain as d
from agentstate.state_service.domain import (
    Conversation,
    DeleteCounts,
    Page,
    ResolvedConversation,
)
from agentstate.state_service.storage.base.conversations import ConversationStore
from agentstate.state_service.storage.postgres import sql
from agentstate.state_service.storage.postgres.codecs import (
    BigintArray,
    Row,
)
from agentstate.state_service.storage.postgres.connection import (
    PostgresConnection,
)


async def delete_selected(
    store: PostgresConnection, select: str, params: Mapping[str, object], batch_size: int
) -> DeleteCounts:
    """Delete, a batch a transaction, the conversations `select` names (rows of user_id
    and id, at most %(limit)s of them), with everything they own: the retention sweeps."""
    total = DeleteCounts(0, 0, 0)
    while True:
        async with store._connection() as conn, conn.transaction():
            cur = await conn.execute(select, {**params, "limit": batch_size})
            rows = await cur.fetchall()
            by_user: dict[str, list[int]] = {}
            for row in rows:
                by_user.setdefault(row["user_id"], []).append(int(row["id"]))
            for user_id, ids in by_user.items():
                cur = await conn.execute(
                    sql.DELETE_CONVERSATIONS,
                    {"user_id": user_id, "conversation_ids": BigintArray(sorted(ids))},
                )
                counts = await cur.fetchone()
                assert counts is not None
                total = total + delete_counts_of(counts)
        if len(rows) < batch_size:
            return total


def conversation_of(row: Row) -> Conversation:
    ttl = None
    if row["ttl_seconds"] is not None:
        policy = d.TtlPolicy.RENEW_ON_WRITE if row["ttl_renew"] else d.TtlPolicy.FIXED
        ttl = d.TimeToLive(int(row["ttl_seconds"]), policy)
    return Conversation(
        conversation_id=int(row["id"]),
        user_id=row["user_id"],
        title=row["title"],
        create_time=row["create_time"],
        update_time=row["update_time"],
        external_key=row["external_key"] or "",
        labels=json.loads(row["labels"]),
        ttl=ttl,
        expire_time=row["expire_time"],
        status=d.ConversationStatus(row.get("status") or "IDLE"),
        last_turn_time=row.get("last_turn_time"),
    )


def ttl_params(ttl: d.TimeToLive | None) -> dict[str, object]:
    return {
        "ttl_seconds": None if ttl is None else ttl.seconds,
        "ttl_renew": ttl is not None and ttl.policy == d.TtlPolicy.RENEW_ON_WRITE,
    }


def delete_counts_of(row: Row) -> DeleteCounts:
    return DeleteCounts(
        conversations=int(row["conversations"]),
        messages=int(row["messages"]),
        states=int(row["states"]),
    )


class PostgresConversations(PostgresConnection, ConversationStore):
    async def create_conversation(
        self,
        *,
        user_id: str,
        title: str,
        external_key: str = "",
        labels: Mapping[str, str] | None = None,
        ttl: d.TimeToLive | None = None,
    ) -> Conversation:
        rows = await self._rows(
            sql.INSERT_CONVERSATION,
            {
                "user_id": user_id,
                "title": title,
                "external_key": external_key,
                "labels": json.dumps(labels or {}),
                **ttl_params(ttl),
            },
        )
        if not rows:
            raise d.external_key_taken(external_key)
        return conversation_of(rows[0])

    async def resolve_conversation(
        self,
        *,
        user_id: str,
        external_key: str,
        create_if_missing: bool,
        title: str,
        labels: Mapping[str, str] | None = None,
        ttl: d.TimeToLive | None = None,
    ) -> ResolvedConversation:
        rows = await self._rows(
            sql.RESOLVE_CONVERSATION,
            {
                "user_id": user_id,
                "external_key": external_key,
                "create_if_missing": create_if_missing,
                "title": title,
                "labels": json.dumps(labels or {}),
                **ttl_params(ttl),
            },
        )
        if not rows:
            raise d.external_key_not_found(external_key)
        return ResolvedConversation(conversation_of(rows[0]), created=bool(rows[0]["created"]))

    async def get_conversation(self, *, user_id: str, conversation_id: int) -> Conversation:
        rows = await self._rows(
            sql.SELECT_CONVERSATION, {"user_id": user_id, "conversation_id": conversation_id}
        )
        if not rows:
            raise d.conversation_not_found(conversation_id)
        return conversation_of(rows[0])

    async def list_conversations(
        self, *, user_id: str, page_size: int, before_id: int | None
    ) -> Page[Conversation]:
        rows = await self._rows(
            sql.LIST_CONVERSATIONS,
            {"user_id": user_id, "before_id": before_id, "limit": page_size + 1},
        )
        items = [conversation_of(r) for r in rows[:page_size]]
        token = str(items[-1].conversation_id) if len(rows) > page_size else ""
        return Page(items, token)

    async def rename_conversation(
        self, *, user_id: str, conversation_id: int, title: str
    ) -> Conversation:
        rows = await self._rows(
            sql.RENAME_CONVERSATION,
            {"user_id": user_id, "conversation_id": conversation_id, "title": title},
        )
        if not rows:
            raise d.conversation_not_found(conversation_id)
        return conversation_of(rows[0])

    async def delete_conversations(
        self, *, user_id: str, conversation_ids: Sequence[int]
    ) -> DeleteCounts:
        params = {
            "user_id": user_id,
            "conversation_ids": BigintArray(sorted(set(conversation_ids))),
        }
        (row,) = await self._rows(sql.DELETE_CONVERSATIONS, params)
        return delete_counts_of(row)

    async def purge_inactive(self, *, before: datetime, batch_size: int = 500) -> DeleteCounts:
        return await delete_selected(
            self, sql.SELECT_INACTIVE_CONVERSATIONS, {"before": before}, batch_size
        )
