"""Retention: inactive conversations are deleted whole; running ones are kept."""

from __future__ import annotations

import asyncio
import logging
from datetime import UTC, datetime, timedelta

import psycopg
import pytest

from agentstate.state_service.config import StateServiceSettings
from agentstate.state_service.domain import MessageRole, NewMessage
from agentstate.state_service.server import StateServiceApp
from agentstate.state_service.storage.base import StateStore
from tests.conftest import create_database
from tests.support.state_process import StateServices


async def _conversation(store: StateStore, user_id: str) -> int:
    conversation = await store.create_conversation(user_id=user_id, title="t")
    await store.save_state(
        user_id=user_id,
        conversation_id=conversation.conversation_id,
        state_key="agent_state",
        payload=b'{"context": []}',
        expected_version=None,
        message_writes=[NewMessage(MessageRole.USER, b'[{"type": "text", "text": "hi"}]')],
    )
    return conversation.conversation_id


async def test_purge_deletes_inactive_and_keeps_running(store: StateStore, user_id: str) -> None:
    idle = [await _conversation(store, user_id) for _ in range(2)]
    busy = await _conversation(store, user_id)
    lease = (
        await store.acquire_lease(
            user_id=user_id,
            conversation_id=busy,
            holder="replica",
            ttl_ms=60_000,
            max_user_leases=0,
        )
    ).lease
    await store.purge_inactive(
        before=datetime.now(UTC) - timedelta(days=1)
    )  # none of ours is that old
    assert (
        len((await store.list_conversations(user_id=user_id, page_size=10, before_id=None)).items)
        == 3
    )

    counts = await store.purge_inactive(before=datetime.now(UTC) + timedelta(seconds=1))
    assert counts.conversations >= 2 and counts.messages >= 2 and counts.states >= 2
    left = [
        c.conversation_id
        for c in (
            await store.list_conversations(user_id=user_id, page_size=10, before_id=None)
        ).items
    ]
    assert left == [busy]  # the running turn's conversation stays
    for cid in idle:
        assert cid not in left

    await store.release_lease(user_id=user_id, task_id=lease.task_id)
    await store.purge_inactive(before=datetime.now(UTC) + timedelta(seconds=1))
    assert (
        await store.list_conversations(user_id=user_id, page_size=10, before_id=None)
    ).items == []


async def test_purge_command_and_sweeper(
    postgres: object,
    state_services: StateServices,
    user_id: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="agentstate.audit")
    dsn = create_database(postgres, "retention_test")  # type: ignore[arg-type]
    app = StateServiceApp(
        StateServiceSettings(
            listen_address="127.0.0.1:0",
            store="postgres",
            database_url=dsn,
            retention_days=30,
            retention_interval_seconds=0.2,
        )
    )
    await app.start()
    assert app.store is not None
    try:
        old = await _conversation(app.store, user_id)
        recent = await _conversation(app.store, user_id)
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
            await conn.execute(
                "UPDATE t_conversation SET update_time = now() - interval '31 days' WHERE id = %s",
                (old,),
            )
        for _ in range(50):  # the sweeper runs every 0.2 s
            ids = [
                c.conversation_id
                for c in (
                    await app.store.list_conversations(
                        user_id=user_id, page_size=10, before_id=None
                    )
                ).items
            ]
            if old not in ids:
                break
            await asyncio.sleep(0.1)
        assert ids == [recent]
        async with await psycopg.AsyncConnection.connect(dsn) as conn:
            cur = await conn.execute(
                "SELECT (SELECT count(*) FROM t_agent_message WHERE conversation_id = %(id)s),"
                " (SELECT count(*) FROM t_agent_state WHERE session_id = %(id)s)",
                {"id": old},
            )
            assert await cur.fetchone() == (0, 0)
        # The sweep is in the audit trail: who, what, the counts.
        swept = [
            r
            for r in caplog.records
            if r.name == "agentstate.audit" and r.audit_conversations_deleted  # type: ignore[attr-defined]
        ]
        assert swept and swept[0].audit_rpc == "PurgeInactive"  # type: ignore[attr-defined]
        assert swept[0].audit_caller == "retention sweep"  # type: ignore[attr-defined]
        assert swept[0].audit_messages_deleted >= 0  # type: ignore[attr-defined]
    finally:
        await app.stop()

    # The same sweep as a one-off command (for a CronJob).
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        await conn.execute(
            "UPDATE t_conversation SET update_time = now() - interval '8 days' WHERE id = %s",
            (recent,),
        )
    settings = {"STATE_STORE": "postgres", "DATABASE_URL": dsn}
    command = state_services.start(settings, "purge", "--older-than-days", "7")
    assert await asyncio.to_thread(command.wait, 60) == 0, command.output
    assert "deleted 1 conversations" in command.output
    assert "audit: agentstate-state purge PurgeInactive" in command.output
    refused = state_services.start(settings, "purge")
    assert await asyncio.to_thread(refused.wait, 60) == 2
    assert "--older-than-days" in refused.output
