"""The PostgreSQL store: psycopg 3 with an async connection pool.

One RPC, one statement, one round trip: connections are in autocommit and the
writes that take several steps run as PL/pgSQL functions (migrations.py), each
its own transaction. A function refuses with SQLSTATE AS000 and a JSON detail;
`_refusal` turns that into the domain's error. Every write that touches a
conversation first takes its row lock, which is what makes compare-and-set,
no-resurrection and atomic delete hold across replicas.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator, Sequence
from datetime import datetime
from typing import Any

import psycopg
import psycopg.errors
from psycopg.adapt import Buffer, Dumper, Loader
from psycopg.rows import DictRow, dict_row
from psycopg_pool import AsyncConnectionPool

from agentstate.common import telemetry
from agentstate.common.pg_pool import PROGRAM_LIMIT_EXCEEDED, GuardedPool, pg_reason
from agentstate.state_service import domain as d
from agentstate.state_service.domain import (
    AcquiredLease,
    BegunTurn,
    Compaction,
    Conversation,
    DeleteCounts,
    InvalidArgument,
    Lease,
    MessageRecord,
    MessageRole,
    MessageStatus,
    MessageWrite,
    NewMessage,
    NotFound,
    Page,
    RequireAwaiting,
    RequireNoneAwaiting,
    ResolvedConversation,
    StateDelta,
    StoredState,
    StoreError,
    StoreUnavailable,
    TurnStart,
    UpsertResult,
    VersionConflict,
)
from agentstate.state_service.storage import pg_checks, sql
from agentstate.state_service.storage.base import StateStore
from agentstate.state_service.storage.migrations import apply_migrations
from agentstate.state_service.storage.pg_checks import Route

log = logging.getLogger(__name__)

Conn = psycopg.AsyncConnection[DictRow]
Row = dict[str, Any]

REFUSAL_SQLSTATE = "AS000"  # raised by agentstate_refuse() in migrations.py


class RawJson:
    """JSON text passed to PostgreSQL as-is, as a jsonb parameter."""

    __slots__ = ("data",)

    def __init__(self, data: bytes) -> None:
        self.data = data


class _RawJsonbDumper(Dumper):
    oid = psycopg.postgres.types["jsonb"].oid

    def dump(self, obj: RawJson) -> Buffer:
        return obj.data


class TextArray:
    """A text[] parameter of UTF-8 byte strings (None: NULL), dumped in one pass.

    psycopg's generic list dumper works element by element in Python; a turn sends a
    dozen small arrays, so this matters on the hot path."""

    __slots__ = ("items",)

    def __init__(self, items: Sequence[bytes | str | None]) -> None:
        self.items = items


class BigintArray:
    """A bigint[] parameter (None: NULL)."""

    __slots__ = ("items",)

    def __init__(self, items: Sequence[int | None]) -> None:
        self.items = items


def _quoted(item: bytes | str | None) -> bytes:
    if item is None:
        return b"NULL"
    data = item.encode() if isinstance(item, str) else item
    return b'"' + data.replace(b"\\", b"\\\\").replace(b'"', b'\\"') + b'"'


class _TextArrayDumper(Dumper):
    oid = psycopg.postgres.types["text"].array_oid

    def dump(self, obj: TextArray) -> Buffer:
        return b"{" + b",".join(_quoted(item) for item in obj.items) + b"}"


class _BigintArrayDumper(Dumper):
    oid = psycopg.postgres.types["int8"].array_oid

    def dump(self, obj: BigintArray) -> Buffer:
        return (
            "{" + ",".join("NULL" if i is None else str(int(i)) for i in obj.items) + "}"
        ).encode()


class _RawJsonbLoader(Loader):
    """Return jsonb columns as the UTF-8 bytes PostgreSQL sends, undecoded."""

    def load(self, data: Buffer) -> bytes:
        return bytes(data)


class _RawTextLoader(Loader):
    """Text columns as undecoded UTF-8 bytes: registered only on the cursors that read
    a state's payload (assembled as text, see migration 10)."""

    def load(self, data: Buffer) -> bytes:
        return bytes(data)


async def _configure_connection(conn: Conn) -> None:
    conn.adapters.register_dumper(RawJson, _RawJsonbDumper)
    conn.adapters.register_dumper(TextArray, _TextArrayDumper)
    conn.adapters.register_dumper(BigintArray, _BigintArrayDumper)
    conn.adapters.register_loader("jsonb", _RawJsonbLoader)
    # One statement per call: it is its own transaction, with no BEGIN/COMMIT round trips.
    await conn.set_autocommit(True)
    telemetry.instrument_psycopg_connection(conn)  # database spans, when tracing is on


def _conversation(row: Row) -> Conversation:
    return Conversation(
        conversation_id=int(row["id"]),
        user_id=row["user_id"],
        title=row["title"],
        create_time=row["create_time"],
        update_time=row["update_time"],
        external_key=row["external_key"] or "",
    )


def _message(row: Row) -> MessageRecord:
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


def _lease(row: Row) -> Lease:
    return Lease(
        task_id=int(row["task_id"]),
        conversation_id=int(row["conversation_id"]),
        user_id=row["user_id"],
        holder=row["holder"],
        expire_time=row["expire_time"],
        stop_requested=bool(row["stop_requested"]),
        acquire_time=row.get("create_time"),
    )


def _compaction(row: Row) -> Compaction:
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


def _write_arrays(writes: Sequence[MessageWrite]) -> dict[str, TextArray | BigintArray]:
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


def _compaction_arrays(compactions: Sequence[Compaction]) -> dict[str, TextArray | BigintArray]:
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


# Up to this size the depth of a payload is checked here, in microseconds; a larger
# one with many brackets is checked by the database on the JSONB it parsed anyway.
DEPTH_SCAN_MAX_BYTES = 64 * 1024


def _depth_to_check_in_database(payload: bytes) -> int | None:
    """The nesting limit the database must enforce for this payload, or None when it is
    already known to hold (InvalidArgument when it is known not to)."""
    if not d.may_exceed_depth(payload):
        return None
    if len(payload) <= DEPTH_SCAN_MAX_BYTES:
        d.check_json_depth(payload, "payload")
        return None
    return d.MAX_JSON_DEPTH


def _check_write_json(write: MessageWrite, where: str) -> None:
    """InvalidArgument if this write holds JSON that PostgreSQL refuses."""
    for field, data, kind in (
        ("blocks_json", write.blocks_json, list),
        ("metadata_json", write.metadata_json, dict),
    ):
        if data is not None:
            d.check_jsonb(data, kind, f"{where}.{field}")


def _check_delta_json(delta: StateDelta) -> None:
    """InvalidArgument naming the first part of a delta PostgreSQL refuses."""
    for index, message in enumerate(delta.messages):
        d.check_jsonb(message, object, f"delta.messages[{index}]")
    if delta.fields_json is not None:
        d.check_jsonb(delta.fields_json, dict, "delta.fields_json")


def _where(index: Any, batch: str | None) -> str:
    """How an error names the write it is about: "message" or "message_writes[2]"."""
    return "message" if batch is None else f"{batch}[{index}]"


def _refusal(detail: dict[str, Any], batch: str | None) -> d.StateServiceError:
    """The domain error for one of the functions' refusals (see migrations.py)."""
    kind = detail.get("kind")
    if kind == "not_found":
        if detail.get("missing") == "message":
            where = _where(detail["index"], batch) if "index" in detail else ""
            return d.message_not_found(
                int(detail["message_id"]), int(detail["conversation_id"]), where
            )
        if detail.get("nothing_pruned"):
            return NotFound(
                f"conversation {detail['conversation_id']} not found; nothing was pruned"
            )
        return d.conversation_not_found(
            int(detail["conversation_id"]), nothing_deleted=bool(detail.get("nothing_deleted"))
        )
    if kind == "too_deep":
        return d.too_deep("payload", int(detail["limit"]))
    if kind == "delta_range":
        return d.delta_out_of_range(
            str(detail["field"]), int(detail["value"]), int(detail["length"])
        )
    if kind == "context_not_array":
        return d.context_not_array()
    if kind == "fields_not_object":
        return InvalidArgument("delta.fields_json must be a JSON object")
    if kind == "fields_name_context":
        return d.fields_name_context()
    if kind == "too_large":
        return d.state_too_large(int(detail["size"]), int(detail["limit"]))
    if kind == "revision_conflict":
        return d.RevisionConflict(int(detail["expected"]), int(detail["current"]))
    if kind == "version_conflict":
        return VersionConflict(int(detail["expected"]), int(detail["current"]))
    if kind == "status_mismatch":
        return d.status_mismatch(
            _where(detail["index"], batch),
            int(detail["message_id"]),
            str(detail["status"]),
            str(detail["expected"]),
        )
    if kind == "user_lease_limit":
        return d.user_lease_limit(int(detail["running"]), int(detail["limit"]))
    if kind == "lease_held":
        held = Lease(
            task_id=int(detail["task_id"]),
            conversation_id=int(detail["conversation_id"]),
            user_id="",
            holder=str(detail["holder"]),
            expire_time=datetime.fromisoformat(detail["expire_time"]),
            stop_requested=False,
        )
        return d.lease_held(held)
    if kind == "lease_lost":
        return d.lease_taken_over(int(detail["task_id"]), int(detail["holder_task_id"]))
    if kind == "checkpoint_conflict":
        return d.CheckpointConflict(
            str(detail["namespace"]), str(detail["expected"]), str(detail["current"])
        )
    if kind == "target_has_checkpoints":
        return d.target_has_checkpoints(int(detail["conversation_id"]))
    if kind == "card_pending":
        return d.CardPending(int(detail["message_id"]))
    if kind == "not_awaiting":
        return d.not_awaiting(int(detail["message_id"]), str(detail["status"]))
    return StoreError(f"unexpected refusal from the database: {detail}")


# psycopg's default: a statement is prepared on its 5th use on a connection.
_PREPARE_THRESHOLD = 5


class MisconfiguredStore(StoreError):
    """A start-up check failed; `parameter` names the store parameter at fault."""

    def __init__(self, parameter: str, message: str) -> None:
        super().__init__(message)
        self.parameter = parameter


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
        prepared_statements: bool = True,
        migration_conninfo: str = "",
        migration_lock_timeout: float | None = 60.0,
        check_route: bool = True,
    ) -> None:
        """`prepared_statements` off: psycopg never prepares (prepare_threshold None), as
        a transaction pooler without prepared statement support needs. Migrations run on
        `migration_conninfo` when given (straight to PostgreSQL, past a pooler), else on a
        pooled connection. `check_route`: the start-up checks of `open()`."""
        self._migrate = migrate
        self._conninfo = conninfo
        self._max_size = max_size
        self._prepared_statements = prepared_statements
        self._migration_conninfo = migration_conninfo
        self._migration_lock_timeout = migration_lock_timeout
        self._check_route = check_route
        self.route: Route | None = None  # what the start-up check found
        self._pool = GuardedPool(
            AsyncConnectionPool(
                conninfo,
                min_size=min_size,
                max_size=max_size,
                timeout=timeout,
                open=False,
                configure=_configure_connection,
                # Every session setting the store relies on is client-side (adapters,
                # autocommit): nothing to reset when a pooler swaps server sessions.
                kwargs={
                    "row_factory": dict_row,
                    "prepare_threshold": _PREPARE_THRESHOLD if prepared_statements else None,
                },
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
    def guard(self) -> GuardedPool[Conn]:
        """The pool's outage guard: availability, its listeners and probe settings."""
        return self._pool

    async def open(self) -> None:
        """Connect, check the route (MisconfiguredStore), migrate (MigrationLockTimeout)."""
        await self._pool.open()
        if self._check_route:
            await self._check_startup()
        if not self._migrate:
            return
        if self._migration_conninfo:
            async with await psycopg.AsyncConnection.connect(
                self._migration_conninfo, autocommit=True, prepare_threshold=None
            ) as conn:
                applied = await apply_migrations(conn, lock_timeout=self._migration_lock_timeout)
        else:
            async with self._pool.connection() as conn:
                applied = await apply_migrations(conn, lock_timeout=self._migration_lock_timeout)
        if applied:
            log.info("applied schema migrations %s", applied)

    async def _check_startup(self) -> None:
        """Refuse a configuration the route cannot carry, before the first request."""
        async with self._pool.connection() as conn:
            self.route = route = await pg_checks.route_of(conn)
            capacity = await pg_checks.server_capacity(conn)
        log.info(
            "database route: %s (%s)", "direct" if route.direct else "not direct", route.detail
        )
        # The pool plus the watcher's probe connection.
        needed = self._max_size + 1
        if route.direct and needed > capacity.available:
            raise MisconfiguredStore(
                "pool_max_size",
                f"a pool of {self._max_size} (+1 for the health probe) is more than the server "
                f"allows: max_connections {capacity.max_connections} - "
                f"{capacity.reserved} reserved = {capacity.available}; lower it, or put a "
                "pooler (PgBouncer) in front (docs/scaling.md)",
            )
        if not route.direct:
            log.info(
                "not a direct connection: the server's %d connections do not bound this "
                "pool of %d; the pooler's client limit does (docs/scaling.md)",
                capacity.available,
                self._max_size,
            )
        if self._prepared_statements:
            check = await pg_checks.prepared_statements_break(self._conninfo)
            log.info("prepared statement check: %s", check.detail)
            if check.breaks:
                raise MisconfiguredStore(
                    "prepared_statements",
                    f"prepared statements are on, but the route drops them: {check.detail}; "
                    "turn them off",
                )

    async def close(self) -> None:
        await self._pool.close()

    @contextlib.asynccontextmanager
    async def _connection(
        self,
        batch: str | None = None,
        writes: Sequence[MessageWrite] = (),
        json_param: str = "",
        delta: StateDelta | None = None,
    ) -> AsyncIterator[Conn]:
        """A pooled connection. Refusals become domain errors, outages StoreUnavailable,
        data the database cannot take InvalidArgument naming the message write it was in
        (else `json_param`, the JSON parameter parsed as the statement starts), anything
        else StoreError. In every case nothing changed.

        `batch`: the request field `writes` came from, for error messages."""
        try:
            async with self._pool.connection() as conn:
                yield conn
        except psycopg.Error as exc:
            if exc.sqlstate == REFUSAL_SQLSTATE:
                detail = json.loads(exc.diag.message_detail or "{}")
                raise _refusal(detail, batch) from None
            if (exc.sqlstate or "").startswith(PROGRAM_LIMIT_EXCEEDED):
                # Beyond the parser's own limits: far deeper than MAX_JSON_DEPTH.
                raise d.too_deep(json_param or "the request") from exc
            if isinstance(exc, psycopg.DataError | psycopg.errors.CheckViolation):
                for index, write in enumerate(writes):  # the error path: find the culprit
                    _check_write_json(write, _where(index, batch))
                if delta is not None:
                    _check_delta_json(delta)
                if json_param:
                    raise InvalidArgument(
                        f"{json_param} is not JSON that PostgreSQL can store: {pg_reason(exc)}"
                    ) from exc
                raise InvalidArgument(f"rejected by the database: {pg_reason(exc)}") from exc
            log.exception("database error")
            raise StoreError(f"database error, nothing was changed: {pg_reason(exc)}") from exc

    async def _rows(
        self,
        statement: str,
        params: dict[str, Any],
        *,
        batch: str | None = None,
        writes: Sequence[MessageWrite] = (),
        json_param: str = "",
        delta: StateDelta | None = None,
        raw_text: bool = False,
        binary: bool = False,
    ) -> list[Row]:
        """Run one statement: one round trip, its own transaction. `raw_text`: text
        columns come back as undecoded bytes (a state's payload)."""
        async with self._connection(batch, writes, json_param, delta) as conn:
            cur = conn.cursor()
            if raw_text:
                cur.adapters.register_loader("text", _RawTextLoader)
            await cur.execute(statement, params, binary=binary)
            return await cur.fetchall()

    # ------------------------------------------------------------------ state

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
            **_write_arrays(message_writes),
            **_compaction_arrays(compactions),
        }
        if delta is None:
            if payload is None:
                raise InvalidArgument("a save needs a payload or a delta")
            params |= {
                "payload": RawJson(payload),
                "expected_version": expected_version,
                "max_depth": _depth_to_check_in_database(payload),
                "base_version": None,
                "drop_head": 0,
                "replace_from": None,
                "delta_messages": None,
                "fields": None,
                "max_bytes": None,
            }
        else:
            d.check_state_delta(delta)
            params |= {
                "payload": None,
                "expected_version": None,
                "max_depth": None,
                "base_version": delta.base_version,
                "drop_head": delta.drop_head,
                "replace_from": delta.replace_from,
                "delta_messages": TextArray(delta.messages),
                "fields": None if delta.fields_json is None else RawJson(delta.fields_json),
                "max_bytes": max_state_bytes,
            }
        # The payload (or the delta's fields) is the one JSON parsed at bind time: a
        # data error is about it (message JSON is parsed inside the function and
        # refused by index; the delta's parts are named on the error path).
        rows = await self._rows(
            sql.SAVE_STATE,
            params,
            batch="message_writes",
            writes=message_writes,
            json_param="payload" if delta is None else "",
            delta=delta,
        )
        first = rows[0]
        return UpsertResult(
            version=int(first["version"]),
            update_time=first["state_update_time"],
            messages=[_message(row) for row in rows if row["id"] is not None],
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

    # ---------------------------------------------------------- conversations

    async def create_conversation(
        self, *, user_id: str, title: str, external_key: str = ""
    ) -> Conversation:
        rows = await self._rows(
            sql.INSERT_CONVERSATION,
            {"user_id": user_id, "title": title, "external_key": external_key},
        )
        if not rows:
            raise d.external_key_taken(external_key)
        return _conversation(rows[0])

    async def resolve_conversation(
        self, *, user_id: str, external_key: str, create_if_missing: bool, title: str
    ) -> ResolvedConversation:
        rows = await self._rows(
            sql.RESOLVE_CONVERSATION,
            {
                "user_id": user_id,
                "external_key": external_key,
                "create_if_missing": create_if_missing,
                "title": title,
            },
        )
        if not rows:
            raise d.external_key_not_found(external_key)
        return ResolvedConversation(_conversation(rows[0]), created=bool(rows[0]["created"]))

    async def get_conversation(self, *, user_id: str, conversation_id: int) -> Conversation:
        rows = await self._rows(
            sql.SELECT_CONVERSATION, {"user_id": user_id, "conversation_id": conversation_id}
        )
        if not rows:
            raise d.conversation_not_found(conversation_id)
        return _conversation(rows[0])

    async def list_conversations(
        self, *, user_id: str, page_size: int, before_id: int | None
    ) -> Page[Conversation]:
        rows = await self._rows(
            sql.LIST_CONVERSATIONS,
            {"user_id": user_id, "before_id": before_id, "limit": page_size + 1},
        )
        items = [_conversation(r) for r in rows[:page_size]]
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
        return _conversation(rows[0])

    async def delete_conversations(
        self, *, user_id: str, conversation_ids: Sequence[int]
    ) -> DeleteCounts:
        params = {
            "user_id": user_id,
            "conversation_ids": BigintArray(sorted(set(conversation_ids))),
        }
        (row,) = await self._rows(sql.DELETE_CONVERSATIONS, params)
        return _counts(row)

    async def purge_inactive(self, *, before: datetime, batch_size: int = 500) -> DeleteCounts:
        total = DeleteCounts(0, 0, 0)
        while True:
            async with self._connection() as conn, conn.transaction():
                cur = await conn.execute(
                    sql.SELECT_INACTIVE_CONVERSATIONS, {"before": before, "limit": batch_size}
                )
                rows = await cur.fetchall()
                by_user: dict[str, list[int]] = {}
                for row in rows:
                    by_user.setdefault(row["user_id"], []).append(int(row["id"]))
                for user_id, ids in by_user.items():
                    cur = await conn.execute(
                        sql.DELETE_CONVERSATIONS,
                        {"user_id": user_id, "conversation_ids": BigintArray(ids)},
                    )
                    counts = await cur.fetchone()
                    assert counts is not None
                    total = total + _counts(counts)
            if len(rows) < batch_size:
                return total

    # --------------------------------------------------------------- messages

    async def write_message(
        self, *, user_id: str, conversation_id: int, write: MessageWrite
    ) -> MessageRecord:
        params = {"user_id": user_id, "conversation_id": conversation_id, **_write_arrays([write])}
        (row,) = await self._rows(sql.WRITE_MESSAGE, params, writes=[write])
        return _message(row)

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
        records = [_message(r) for r in rows if r["id"] is not None]
        items = records[:page_size]
        token = str(items[-1].message_id) if len(records) > page_size else ""
        return Page(items, token)

    async def list_compactions(self, *, user_id: str, conversation_id: int) -> list[Compaction]:
        rows = await self._rows(
            sql.LIST_COMPACTIONS, {"user_id": user_id, "conversation_id": conversation_id}
        )
        if not rows:
            raise d.conversation_not_found(conversation_id)
        return [_compaction(row) for row in rows if row["id"] is not None]

    async def get_lease(self, *, user_id: str, conversation_id: int) -> Lease | None:
        rows = await self._rows(
            sql.GET_LEASE, {"user_id": user_id, "conversation_id": conversation_id}
        )
        if not rows:
            raise d.conversation_not_found(conversation_id)
        return _lease(rows[0]) if rows[0]["task_id"] is not None else None

    async def get_message(
        self, *, user_id: str, conversation_id: int, message_id: int
    ) -> MessageRecord:
        rows = await self._rows(
            sql.SELECT_MESSAGE,
            {"user_id": user_id, "conversation_id": conversation_id, "message_id": message_id},
        )
        if not rows:
            raise d.message_not_found(message_id, conversation_id)
        return _message(rows[0])

    # ------------------------------------------------------------ run leases

    async def acquire_lease(
        self,
        *,
        user_id: str,
        conversation_id: int,
        holder: str,
        ttl_ms: int,
        max_user_leases: int,
    ) -> AcquiredLease:
        (row,) = await self._rows(
            sql.ACQUIRE_LEASE,
            {
                "user_id": user_id,
                "conversation_id": conversation_id,
                "holder": holder,
                "ttl_ms": ttl_ms,
                "max_user_leases": max_user_leases,
            },
        )
        lease = Lease(
            task_id=int(row["task_id"]),
            conversation_id=conversation_id,
            user_id=user_id,
            holder=holder,
            expire_time=row["expire_time"],
            stop_requested=bool(row["stop_requested"]),
        )
        lapsed = row["lapsed_task_id"]
        return AcquiredLease(lease, int(lapsed) if lapsed is not None else None)

    async def renew_lease(self, *, user_id: str, task_id: int, ttl_ms: int) -> Lease:
        rows = await self._rows(
            sql.RENEW_LEASE, {"user_id": user_id, "task_id": task_id, "ttl_ms": ttl_ms}
        )
        if not rows:
            raise d.LeaseLost(f"lease of task {task_id} was lost (released or taken over)")
        return _lease(rows[0])

    async def release_lease(self, *, user_id: str, task_id: int) -> bool:
        async with self._connection() as conn:
            cur = await conn.execute(sql.RELEASE_LEASE, {"user_id": user_id, "task_id": task_id})
            return cur.rowcount > 0

    async def request_stop(self, *, user_id: str, task_id: int) -> Lease:
        rows = await self._rows(sql.REQUEST_STOP, {"user_id": user_id, "task_id": task_id})
        if not rows:
            raise NotFound(f"no running task {task_id}", "task")
        return _lease(rows[0])

    # ---------------------------------------------------- checkpoints (issue 15)

    async def put_checkpoint(
        self,
        *,
        user_id: str,
        conversation_id: int,
        checkpoint: d.NewCheckpoint,
        expected_head: str | None,
    ) -> datetime:
        d.check_json_depth(checkpoint.metadata_json, "metadata_json")
        values = checkpoint.new_values
        rows = await self._rows(
            sql.PUT_CHECKPOINT,
            {
                "user_id": user_id,
                "conversation_id": conversation_id,
                "namespace": checkpoint.namespace,
                "checkpoint_id": checkpoint.checkpoint_id,
                "parent_id": checkpoint.parent_checkpoint_id,
                "checkpoint_type": checkpoint.checkpoint_type,
                "checkpoint": checkpoint.checkpoint,
                "metadata": RawJson(checkpoint.metadata_json),
                "channel_versions": RawJson(json.dumps(checkpoint.channel_versions).encode()),
                "check_head": expected_head is not None,
                "expected_head": expected_head or "",
                "channels": TextArray([v.channel for v in values]),
                "versions": TextArray([v.version for v in values]),
                "value_types": TextArray([v.value_type for v in values]),
                "values": [v.value for v in values],
            },
            json_param="metadata_json",
        )
        created: datetime = rows[0]["create_time"]
        return created

    async def _select_checkpoints(
        self,
        *,
        user_id: str,
        conversation_id: int,
        namespace: str | None,
        checkpoint_id: str | None = None,
        metadata_filter: bytes | None = None,
        before_checkpoint_id: str | None = None,
        after: tuple[str, str] | None = None,
        limit: int,
    ) -> list[d.StoredCheckpoint]:
        rows = await self._rows(
            sql.SELECT_CHECKPOINTS,
            {
                "user_id": user_id,
                "conversation_id": conversation_id,
                "namespace": namespace,
                "checkpoint_id": checkpoint_id,
                "before": before_checkpoint_id,
                "after_id": after[0] if after else None,
                "after_ns": after[1] if after else None,
                "filter": RawJson(metadata_filter) if metadata_filter else None,
                "limit": limit,
            },
            json_param="metadata_filter_json",
            binary=True,
        )
        if not rows:
            raise d.conversation_not_found(conversation_id)
        return [_checkpoint(row) for row in rows if row["checkpoint_id"] is not None]

    async def get_checkpoint(
        self, *, user_id: str, conversation_id: int, namespace: str, checkpoint_id: str | None
    ) -> d.StoredCheckpoint | None:
        found = await self._select_checkpoints(
            user_id=user_id,
            conversation_id=conversation_id,
            namespace=namespace,
            checkpoint_id=checkpoint_id,
            limit=1,
        )
        return found[0] if found else None

    async def list_checkpoints(
        self,
        *,
        user_id: str,
        conversation_id: int,
        namespace: str | None,
        metadata_filter: bytes | None,
        before_checkpoint_id: str | None,
        page_size: int,
        after: tuple[str, str] | None,
    ) -> Page[d.StoredCheckpoint]:
        found = await self._select_checkpoints(
            user_id=user_id,
            conversation_id=conversation_id,
            namespace=namespace,
            metadata_filter=metadata_filter,
            before_checkpoint_id=before_checkpoint_id,
            after=after,
            limit=page_size + 1,  # one more tells whether there is a next page
        )
        page = found[:page_size]
        token = ""
        if len(found) > page_size:
            token = d.checkpoint_page_token(page[-1].checkpoint_id, page[-1].namespace)
        return Page(page, token)

    async def put_checkpoint_writes(
        self,
        *,
        user_id: str,
        conversation_id: int,
        namespace: str,
        checkpoint_id: str,
        writes: Sequence[d.CheckpointWrite],
    ) -> int:
        rows = await self._rows(
            sql.PUT_CHECKPOINT_WRITES,
            {
                "user_id": user_id,
                "conversation_id": conversation_id,
                "namespace": namespace,
                "checkpoint_id": checkpoint_id,
                "task_ids": TextArray([w.task_id for w in writes]),
                "idxs": BigintArray([w.idx for w in writes]),
                "channels": TextArray([w.channel for w in writes]),
                "value_types": TextArray([w.value_type for w in writes]),
                "values": [w.value for w in writes],
                "task_paths": TextArray([w.task_path for w in writes]),
            },
        )
        return int(rows[0]["stored"])

    async def delete_checkpoints_for_runs(self, *, user_id: str, run_ids: Sequence[str]) -> int:
        rows = await self._rows(
            sql.DELETE_CHECKPOINTS_FOR_RUNS, {"user_id": user_id, "run_ids": TextArray(run_ids)}
        )
        return int(rows[0]["deleted"])

    async def copy_checkpoints(
        self, *, user_id: str, source_conversation_id: int, target_conversation_id: int
    ) -> int:
        rows = await self._rows(
            sql.COPY_CHECKPOINTS,
            {
                "user_id": user_id,
                "source": source_conversation_id,
                "target": target_conversation_id,
            },
        )
        return int(rows[0]["copied"])

    async def prune_checkpoints(
        self, *, user_id: str, conversation_ids: Sequence[int], strategy: d.PruneStrategy
    ) -> int:
        rows = await self._rows(
            sql.PRUNE_CHECKPOINTS,
            {
                "user_id": user_id,
                "ids": BigintArray(sorted(set(conversation_ids))),
                "keep_latest": strategy is d.PruneStrategy.KEEP_LATEST,
            },
        )
        return int(rows[0]["deleted"])

    # ------------------------------------- conversation items, scoped state

    async def append_items(
        self,
        *,
        user_id: str,
        conversation_id: int,
        items: Sequence[d.NewItem],
        expected_revision: int | None,
    ) -> d.AppendedItems:
        rows = await self._rows(
            sql.APPEND_ITEMS,
            {
                "user_id": user_id,
                "conversation_id": conversation_id,
                "items": TextArray([i.item_json for i in items]),
                "item_times": [i.item_time for i in items],
                "expected_revision": expected_revision,
            },
        )
        return d.AppendedItems(
            [_item(conversation_id, row) for row in rows], int(rows[-1]["revision"])
        )

    async def list_items(
        self,
        *,
        user_id: str,
        conversation_id: int,
        last_n: int | None,
        min_item_time: datetime | None,
        page_size: int,
        after_seq: int | None,
    ) -> d.ItemsPage:
        rows = await self._rows(
            sql.LIST_ITEMS,
            {
                "user_id": user_id,
                "conversation_id": conversation_id,
                "last_n": last_n,
                "min_item_time": min_item_time,
                "after_seq": after_seq,
                "limit": page_size + 1,
            },
        )
        if not rows:
            raise d.conversation_not_found(conversation_id)
        found = [_item(conversation_id, r) for r in rows if r["seq"] is not None]
        items = found[:page_size]
        token = str(items[-1].seq) if len(found) > page_size else ""
        first = rows[0]
        return d.ItemsPage(
            items, token, int(first["item_revision"]), first["conversation_update_time"]
        )

    async def pop_item(
        self, *, user_id: str, conversation_id: int, expected_revision: int | None
    ) -> d.PoppedItem:
        (row,) = await self._rows(
            sql.POP_ITEM,
            {
                "user_id": user_id,
                "conversation_id": conversation_id,
                "expected_revision": expected_revision,
            },
        )
        item = _item(conversation_id, row) if row["seq"] is not None else None
        return d.PoppedItem(item, int(row["revision"]))

    async def clear_items(self, *, user_id: str, conversation_id: int) -> d.ClearedItems:
        (row,) = await self._rows(
            sql.CLEAR_ITEMS, {"user_id": user_id, "conversation_id": conversation_id}
        )
        return d.ClearedItems(int(row["deleted"]), int(row["revision"]))

    async def get_scoped_state(self, *, user_id: str, app_name: str) -> d.ScopedStates:
        rows = await self._rows(sql.SELECT_SCOPED_STATE, {"user_id": user_id, "app_name": app_name})
        states = {
            row["user_id"]: StoredState(row["payload"], int(row["version"]), row["update_time"])
            for row in rows
        }
        return d.ScopedStates(app=states.get(""), user=states.get(user_id))

    async def append_event(
        self, *, user_id: str, conversation_id: int, event: d.EventAppend
    ) -> d.AppendedEvent:
        (row,) = await self._rows(
            sql.APPEND_EVENT,
            {
                "user_id": user_id,
                "conversation_id": conversation_id,
                "item": event.item.item_json.decode() if event.item else None,
                "item_time": event.item.item_time if event.item else None,
                "expected_revision": event.expected_revision,
                "state_key": event.state_key,
                "state_delta": _text(event.state_delta),
                "app_name": event.app_name,
                "app_delta": _text(event.app_delta),
                "user_delta": _text(event.user_delta),
            },
        )
        item = _item(conversation_id, row) if row["seq"] is not None else None
        return d.AppendedEvent(item, int(row["revision"]), int(row["state_version"]))


def _text(data: bytes | None) -> str | None:
    return data.decode() if data is not None else None


def _item(conversation_id: int, row: Row) -> d.ConversationItem:
    return d.ConversationItem(
        conversation_id=conversation_id,
        seq=int(row["seq"]),
        item_json=row["item"],
        item_time=row["item_time"],
        create_time=row["create_time"],
    )


def _checkpoint(row: Row) -> d.StoredCheckpoint:
    def column(name: str) -> list[Any]:
        return row[name] or []  # array_agg over no rows is NULL

    return d.StoredCheckpoint(
        conversation_id=int(row["conversation_id"]),
        namespace=row["namespace"],
        checkpoint_id=row["checkpoint_id"],
        parent_checkpoint_id=row["parent_checkpoint_id"],
        checkpoint_type=row["checkpoint_type"],
        checkpoint=bytes(row["checkpoint"]),
        metadata_json=row["metadata"].encode(),
        channel_versions=json.loads(row["channel_versions"]),
        channel_values=[
            d.ChannelValue(channel, version, value_type, bytes(value))
            for channel, version, value_type, value in zip(
                column("channels"),
                column("versions"),
                column("value_types"),
                column("values"),
                strict=True,
            )
        ],
        pending_writes=[
            d.CheckpointWrite(task_id, int(idx), channel, value_type, bytes(value), task_path)
            for task_id, idx, channel, value_type, value, task_path in zip(
                column("task_ids"),
                column("idxs"),
                column("write_channels"),
                column("write_types"),
                column("write_values"),
                column("task_paths"),
                strict=True,
            )
        ],
        create_time=row["create_time"],
    )


def _counts(row: Row) -> DeleteCounts:
    return DeleteCounts(
        conversations=int(row["conversations"]),
        messages=int(row["messages"]),
        states=int(row["states"]),
    )
