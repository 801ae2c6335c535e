"""The PostgreSQL store: psycopg 3 with an async connection pool.

Transactions are explicit (`conn.transaction()`); every write that touches a
conversation first takes its row lock (TOUCH_CONVERSATION), which is what makes
compare-and-set, no-resurrection and atomic delete hold across replicas.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator, Sequence
from datetime import datetime
from typing import Any

import psycopg
import psycopg.errors
from psycopg.adapt import Buffer, Dumper, Loader
from psycopg.rows import tuple_row
from psycopg_pool import AsyncConnectionPool

from agentstate.common import telemetry
from agentstate.common.pg_pool import Conn, GuardedPool, pg_reason
from state_service.domain import (
    AcquiredLease,
    Compaction,
    Conversation,
    DeleteCounts,
    FailedPrecondition,
    InvalidArgument,
    Lease,
    MessageRecord,
    MessageRole,
    MessageStatus,
    MessageUpdate,
    MessageWrite,
    NewMessage,
    NotFound,
    Page,
    ResourceExhausted,
    StoredState,
    StoreError,
    StoreUnavailable,
    UpsertResult,
    VersionConflict,
    lease_conflict_message,
)
from state_service.storage import sql
from state_service.storage.base import StateStore
from state_service.storage.migrations import apply_migrations

log = logging.getLogger(__name__)


class RawJson:
    """JSON text passed to PostgreSQL as-is, as a jsonb parameter."""

    __slots__ = ("data",)

    def __init__(self, data: bytes) -> None:
        self.data = data


_JSONB_OID = psycopg.postgres.types["jsonb"].oid


class _RawJsonbDumper(Dumper):
    oid = _JSONB_OID

    def dump(self, obj: RawJson) -> Buffer:
        return obj.data


class _RawJsonbLoader(Loader):
    """Return jsonb columns as the UTF-8 bytes PostgreSQL sends, undecoded."""

    def load(self, data: Buffer) -> bytes:
        return bytes(data)


async def _configure_connection(conn: Conn) -> None:
    conn.adapters.register_dumper(RawJson, _RawJsonbDumper)
    conn.adapters.register_loader(_JSONB_OID, _RawJsonbLoader)
    await conn.set_autocommit(False)
    telemetry.instrument_psycopg_connection(conn)  # database spans, when tracing is on


def _conversation(row: tuple[Any, ...]) -> Conversation:
    return Conversation(int(row[0]), row[1], row[2], row[3], row[4])


def _message(row: tuple[Any, ...]) -> MessageRecord:
    return MessageRecord(
        message_id=int(row[0]),
        conversation_id=int(row[1]),
        user_id=row[2],
        role=MessageRole(row[3]),
        blocks_json=row[4],
        status=MessageStatus(row[5]),
        metadata_json=row[6],
        create_time=row[7],
        update_time=row[8],
    )


def _lease(row: tuple[Any, ...]) -> Lease:
    return Lease(int(row[0]), int(row[1]), row[2], row[3], row[4], bool(row[5]))


def _compaction(row: tuple[Any, ...]) -> Compaction:
    return Compaction(
        compaction_id=int(row[0]),
        messages_before=int(row[1]),
        messages_after=int(row[2]),
        tokens_before=int(row[3]),
        tokens_after=int(row[4]),
        summary_chars=int(row[5]),
        reason=row[6],
        create_time=row[7],
    )


class PostgresStore(StateStore):
    def __init__(
        self,
        conninfo: str,
        *,
        min_size: int = 1,
        max_size: int = 10,
        timeout: float = 5.0,
        connect_timeout: float = 30.0,
        migrate: bool = True,
    ) -> None:
        self._migrate = migrate
        self._pool = GuardedPool(
            AsyncConnectionPool(
                conninfo,
                min_size=min_size,
                max_size=max_size,
                timeout=timeout,
                open=False,
                configure=_configure_connection,
                kwargs={"row_factory": tuple_row},
                name="agentstate-state",
            ),
            what="database",
            unavailable=StoreUnavailable,
            connect_timeout=connect_timeout,
        )

    @property
    def pool(self) -> AsyncConnectionPool[Conn]:
        return self._pool.pool

    @property
    def guard(self) -> GuardedPool:
        """The pool's outage guard: availability, its listeners and probe settings."""
        return self._pool

    async def open(self) -> None:
        await self._pool.open()
        if self._migrate:
            async with self._pool.connection() as conn:
                applied = await apply_migrations(conn)
            if applied:
                log.info("applied schema migrations %s", applied)

    async def close(self) -> None:
        await self._pool.close()

    @contextlib.asynccontextmanager
    async def _connection(self) -> AsyncIterator[Conn]:
        """A pooled connection; outages are StoreUnavailable, other refusals StoreError."""
        try:
            async with self._pool.connection() as conn:
                yield conn
        except psycopg.Error as exc:
            # Anything else the database refused: the transaction was rolled back.
            log.exception("database error")
            raise StoreError(f"database error, nothing was changed: {pg_reason(exc)}") from exc

    # ------------------------------------------------------------------ state

    async def get_state(self, user_id: str, conversation_id: int, state_key: str) -> StoredState:
        params = {"user_id": user_id, "conversation_id": conversation_id, "state_key": state_key}
        async with self._connection() as conn:
            cur = await conn.execute(sql.SELECT_STATE, params)
            row = await cur.fetchone()
            if row is None:
                await self._require_conversation(conn, user_id, conversation_id)
                raise NotFound(
                    f"conversation {conversation_id} has no state {state_key!r} yet", "state"
                )
        return StoredState(payload=row[0], version=int(row[1]), update_time=row[2])

    async def upsert_state(
        self,
        user_id: str,
        conversation_id: int,
        state_key: str,
        payload: bytes,
        expected_version: int | None,
        message_writes: Sequence[MessageWrite] = (),
        compactions: Sequence[Compaction] = (),
    ) -> UpsertResult:
        params = {
            "user_id": user_id,
            "conversation_id": conversation_id,
            "state_key": state_key,
            "payload": RawJson(payload),
            "expected_version": expected_version,
        }
        async with self._connection() as conn, conn.transaction():
            await self._touch_conversation(conn, user_id, conversation_id)
            if expected_version is None:
                statement = sql.UPSERT_STATE
            elif expected_version == 0:
                statement = sql.INSERT_STATE_IF_ABSENT
            else:
                statement = sql.UPDATE_STATE_IF_VERSION
            try:
                cur = await conn.execute(statement, params)
            except (psycopg.DataError, psycopg.errors.CheckViolation) as exc:
                raise InvalidArgument(
                    f"payload is not JSON that PostgreSQL can store: {pg_reason(exc)}"
                ) from exc
            row = await cur.fetchone()
            if row is None:
                assert expected_version is not None
                cur = await conn.execute(sql.SELECT_STATE_VERSION, params)
                current = await cur.fetchone()
                raise VersionConflict(expected_version, int(current[0]) if current else 0)
            messages = [
                await self._write_message(conn, user_id, conversation_id, write, index)
                for index, write in enumerate(message_writes)
            ]
            for compaction in compactions:
                await conn.execute(
                    sql.INSERT_COMPACTION,
                    {
                        "user_id": user_id,
                        "conversation_id": conversation_id,
                        "messages_before": compaction.messages_before,
                        "messages_after": compaction.messages_after,
                        "tokens_before": compaction.tokens_before,
                        "tokens_after": compaction.tokens_after,
                        "summary_chars": compaction.summary_chars,
                        "reason": compaction.reason,
                    },
                )
        return UpsertResult(version=int(row[0]), update_time=row[1], messages=messages)

    # ---------------------------------------------------------- conversations

    async def create_conversation(self, user_id: str, title: str) -> Conversation:
        async with self._connection() as conn, conn.transaction():
            cur = await conn.execute(sql.INSERT_CONVERSATION, {"user_id": user_id, "title": title})
            row = await cur.fetchone()
        assert row is not None
        return _conversation(row)

    async def get_conversation(self, user_id: str, conversation_id: int) -> Conversation:
        async with self._connection() as conn:
            return await self._require_conversation(conn, user_id, conversation_id)

    async def list_conversations(
        self, user_id: str, page_size: int, before_id: int | None
    ) -> Page[Conversation]:
        params = {"user_id": user_id, "before_id": before_id, "limit": page_size + 1}
        async with self._connection() as conn:
            cur = await conn.execute(sql.LIST_CONVERSATIONS, params)
            rows = await cur.fetchall()
        items = [_conversation(r) for r in rows[:page_size]]
        token = str(items[-1].conversation_id) if len(rows) > page_size else ""
        return Page(items, token)

    async def rename_conversation(
        self, user_id: str, conversation_id: int, title: str
    ) -> Conversation:
        params = {"user_id": user_id, "conversation_id": conversation_id, "title": title}
        async with self._connection() as conn, conn.transaction():
            cur = await conn.execute(sql.RENAME_CONVERSATION, params)
            row = await cur.fetchone()
        if row is None:
            raise NotFound(f"conversation {conversation_id} not found")
        return _conversation(row)

    async def delete_conversations(
        self, user_id: str, conversation_ids: Sequence[int]
    ) -> DeleteCounts:
        wanted = sorted(set(conversation_ids))
        params = {"user_id": user_id, "conversation_ids": wanted}
        async with self._connection() as conn, conn.transaction():
            cur = await conn.execute(sql.LOCK_CONVERSATIONS_FOR_DELETE, params)
            found = {int(r[0]) for r in await cur.fetchall()}
            missing = [cid for cid in wanted if cid not in found]
            if missing:
                raise NotFound(f"conversation {missing[0]} not found; nothing was deleted")
            return await self._delete_locked(conn, user_id, wanted)

    async def _delete_locked(
        self, conn: Conn, user_id: str, conversation_ids: Sequence[int]
    ) -> DeleteCounts:
        """Delete conversations whose rows this transaction has locked, children first."""
        params = {"user_id": user_id, "conversation_ids": list(conversation_ids)}
        await conn.execute(sql.DELETE_LEASES, params)
        await conn.execute(sql.DELETE_COMPACTIONS, params)
        states = (await conn.execute(sql.DELETE_STATES, params)).rowcount
        messages = (await conn.execute(sql.DELETE_MESSAGES, params)).rowcount
        conversations = (await conn.execute(sql.DELETE_CONVERSATIONS, params)).rowcount
        return DeleteCounts(conversations=conversations, messages=messages, states=states)

    async def purge_inactive(self, before: datetime, batch_size: int = 500) -> DeleteCounts:
        total = DeleteCounts(0, 0, 0)
        while True:
            async with self._connection() as conn, conn.transaction():
                cur = await conn.execute(
                    sql.SELECT_INACTIVE_CONVERSATIONS, {"before": before, "limit": batch_size}
                )
                rows = await cur.fetchall()
                by_user: dict[str, list[int]] = {}
                for conversation_id, user_id in rows:
                    by_user.setdefault(user_id, []).append(int(conversation_id))
                for user_id, ids in by_user.items():
                    total = total + await self._delete_locked(conn, user_id, ids)
            if len(rows) < batch_size:
                return total

    # --------------------------------------------------------------- messages

    async def append_message(
        self, user_id: str, conversation_id: int, message: NewMessage
    ) -> MessageRecord:
        async with self._connection() as conn, conn.transaction():
            await self._touch_conversation(conn, user_id, conversation_id)
            return await self._write_message(conn, user_id, conversation_id, message, None)

    async def update_message(
        self, user_id: str, conversation_id: int, update: MessageUpdate
    ) -> MessageRecord:
        async with self._connection() as conn, conn.transaction():
            await self._touch_conversation(conn, user_id, conversation_id)
            return await self._write_message(conn, user_id, conversation_id, update, None)

    async def list_messages(
        self,
        user_id: str,
        conversation_id: int,
        page_size: int,
        after_id: int | None,
        newest_first: bool = False,
    ) -> Page[MessageRecord]:
        params = {
            "user_id": user_id,
            "conversation_id": conversation_id,
            "after_id": after_id,
            "limit": page_size + 1,
        }
        statement = sql.LIST_MESSAGES_NEWEST_FIRST if newest_first else sql.LIST_MESSAGES
        async with self._connection() as conn:
            await self._require_conversation(conn, user_id, conversation_id)
            cur = await conn.execute(statement, params)
            rows = await cur.fetchall()
        items = [_message(r) for r in rows[:page_size]]
        token = str(items[-1].message_id) if len(rows) > page_size else ""
        return Page(items, token)

    async def list_compactions(self, user_id: str, conversation_id: int) -> list[Compaction]:
        params = {"user_id": user_id, "conversation_id": conversation_id}
        async with self._connection() as conn:
            await self._require_conversation(conn, user_id, conversation_id)
            cur = await conn.execute(sql.LIST_COMPACTIONS, params)
            return [_compaction(row) for row in await cur.fetchall()]

    async def get_message(
        self, user_id: str, conversation_id: int, message_id: int
    ) -> MessageRecord:
        params = {"user_id": user_id, "conversation_id": conversation_id, "message_id": message_id}
        async with self._connection() as conn:
            cur = await conn.execute(sql.SELECT_MESSAGE, params)
            row = await cur.fetchone()
        if row is None:
            raise NotFound(
                f"message {message_id} not found in conversation {conversation_id}", "message"
            )
        return _message(row)

    # ------------------------------------------------------------ run leases

    async def acquire_lease(
        self,
        user_id: str,
        conversation_id: int,
        holder: str,
        ttl_ms: int,
        max_user_leases: int,
    ) -> AcquiredLease:
        params = {
            "user_id": user_id,
            "conversation_id": conversation_id,
            "holder": holder,
            "ttl_ms": ttl_ms,
        }
        async with self._connection() as conn, conn.transaction():
            await conn.execute(sql.LOCK_USER_LEASES, params)
            cur = await conn.execute(sql.LOCK_CONVERSATION_SHARED, params)
            if await cur.fetchone() is None:
                raise NotFound(f"conversation {conversation_id} not found")
            if max_user_leases > 0:
                cur = await conn.execute(sql.COUNT_OTHER_ACTIVE_LEASES, params)
                row = await cur.fetchone()
                running = int(row[0]) if row else 0
                if running >= max_user_leases:
                    raise ResourceExhausted(
                        f"user already has {running} running turns (limit {max_user_leases}); "
                        "retry when one finishes"
                    )
            cur = await conn.execute(sql.SELECT_LAPSED_LEASE, params)
            lapsed = await cur.fetchone()
            cur = await conn.execute(sql.ACQUIRE_LEASE, params)
            row = await cur.fetchone()
            if row is None:
                cur = await conn.execute(sql.SELECT_LEASE_OF_CONVERSATION, params)
                held = await cur.fetchone()
                assert held is not None
                raise FailedPrecondition(lease_conflict_message(_lease(held)))
        return AcquiredLease(_lease(row), int(lapsed[0]) if lapsed else None)

    async def renew_lease(self, user_id: str, task_id: int, ttl_ms: int) -> Lease:
        params = {"user_id": user_id, "task_id": task_id, "ttl_ms": ttl_ms}
        async with self._connection() as conn, conn.transaction():
            cur = await conn.execute(sql.RENEW_LEASE, params)
            row = await cur.fetchone()
        if row is None:
            raise FailedPrecondition(f"lease of task {task_id} was lost (released or taken over)")
        return _lease(row)

    async def release_lease(self, user_id: str, task_id: int) -> bool:
        async with self._connection() as conn, conn.transaction():
            cur = await conn.execute(sql.RELEASE_LEASE, {"user_id": user_id, "task_id": task_id})
            return cur.rowcount > 0

    async def request_stop(self, user_id: str, task_id: int) -> Lease:
        async with self._connection() as conn, conn.transaction():
            cur = await conn.execute(sql.REQUEST_STOP, {"user_id": user_id, "task_id": task_id})
            row = await cur.fetchone()
        if row is None:
            raise NotFound(f"no running task {task_id}", "task")
        return _lease(row)

    # ---------------------------------------------------------------- helpers

    async def _require_conversation(
        self, conn: Conn, user_id: str, conversation_id: int
    ) -> Conversation:
        cur = await conn.execute(
            sql.SELECT_CONVERSATION, {"user_id": user_id, "conversation_id": conversation_id}
        )
        row = await cur.fetchone()
        if row is None:
            raise NotFound(f"conversation {conversation_id} not found")
        return _conversation(row)

    async def _touch_conversation(self, conn: Conn, user_id: str, conversation_id: int) -> None:
        cur = await conn.execute(
            sql.TOUCH_CONVERSATION, {"user_id": user_id, "conversation_id": conversation_id}
        )
        if await cur.fetchone() is None:
            raise NotFound(f"conversation {conversation_id} not found")

    async def _write_message(
        self,
        conn: Conn,
        user_id: str,
        conversation_id: int,
        write: MessageWrite,
        index: int | None,
    ) -> MessageRecord:
        where = "message" if index is None else f"message_writes[{index}]"
        base = {"user_id": user_id, "conversation_id": conversation_id}
        try:
            if isinstance(write, NewMessage):
                cur = await conn.execute(
                    sql.INSERT_MESSAGE,
                    {
                        **base,
                        "role": write.role.value,
                        "blocks": RawJson(write.blocks_json),
                        "status": write.status.value,
                        "metadata": RawJson(write.metadata_json),
                    },
                )
            else:
                cur = await conn.execute(
                    sql.UPDATE_MESSAGE,
                    {
                        **base,
                        "message_id": write.message_id,
                        "status": write.status.value if write.status else None,
                        "blocks": _optional_json(write.blocks_json),
                        "metadata": _optional_json(write.metadata_json),
                        "expected_status": (
                            write.expected_status.value if write.expected_status else None
                        ),
                    },
                )
        except psycopg.errors.ForeignKeyViolation as exc:
            raise NotFound(f"conversation {conversation_id} not found") from exc
        except (psycopg.DataError, psycopg.errors.CheckViolation) as exc:
            raise InvalidArgument(
                f"{where} holds JSON that PostgreSQL cannot store: {pg_reason(exc)}"
            ) from exc
        row = await cur.fetchone()
        if row is not None:
            return _message(row)
        assert isinstance(write, MessageUpdate)
        cur = await conn.execute(
            sql.SELECT_MESSAGE_STATUS, {**base, "message_id": write.message_id}
        )
        current = await cur.fetchone()
        if current is None:
            raise NotFound(
                f"{where}: message {write.message_id} not found in conversation {conversation_id}",
                "message",
            )
        raise FailedPrecondition(
            f"{where}: message {write.message_id} has status {current[0]}, "
            f"expected {write.expected_status}"
        )


def _optional_json(data: bytes | None) -> RawJson | None:
    return None if data is None else RawJson(data)
