"""The pool every aggregate's statements run on: start-up checks, migrations, and the
translation of database errors into the domain's (nothing changed in every case)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator, Sequence
from typing import Any

import psycopg
import psycopg.errors
from psycopg.rows import dict_row
from psycopg_pool import AsyncConnectionPool

from agentstate.common.pg_pool import PROGRAM_LIMIT_EXCEEDED, GuardedPool, pg_reason
from agentstate.state_service import domain as d
from agentstate.state_service.crypto.kms import WrappedKey
from agentstate.state_service.domain import (
    InvalidArgument,
    MessageWrite,
    StateDelta,
    StoreError,
    StoreUnavailable,
)
from agentstate.state_service.storage.postgres import encryption as enc
from agentstate.state_service.storage.postgres import pg_checks
from agentstate.state_service.storage.postgres.codecs import (
    Conn,
    RawTextLoader,
    Row,
    TextArray,
    configure_connection,
)
from agentstate.state_service.storage.postgres.encryption import OFF, Encryption, UserKeys
from agentstate.state_service.storage.postgres.migrations import apply_migrations
from agentstate.state_service.storage.postgres.pg_checks import Route
from agentstate.state_service.storage.postgres.refusals import (
    REFUSAL_SQLSTATE,
    check_write_json,
    refusal,
    where_in_batch,
)

log = logging.getLogger(__name__)


# psycopg's default: a statement is prepared on its 5th use on a connection.
_PREPARE_THRESHOLD = 5


class MisconfiguredStore(StoreError):
    """A start-up check failed; `parameter` names the store parameter at fault."""

    def __init__(self, parameter: str, message: str) -> None:
        super().__init__(message)
        self.parameter = parameter


class PostgresConnection:
    """One pool; one statement per call, in autocommit: each call is its own transaction."""

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
        encryption: Encryption | None = None,
    ) -> None:
        """`prepared_statements` off: psycopg never prepares (prepare_threshold None), as
        a transaction pooler without prepared statement support needs. Migrations run on
        `migration_conninfo` when given (straight to PostgreSQL, past a pooler), else on a
        pooled connection. `check_route`: the start-up checks of `open()`. `encryption`:
        encryption at rest (None: off; encryption.py)."""
        self._migrate = migrate
        self.encryption = encryption or OFF
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
                configure=configure_connection,
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

    async def rotate_data_keys(self, *, batch_size: int = 500, pause: float = 0.0) -> int:
        """Rewrap every data key not wrapped by the primary KEK with it, `batch_size` per
        statement, online (the data keys themselves do not change, so nothing sealed is
        rewritten and every cached key stays valid). Returns how many it rewrapped."""
        kms = self.encryption.kms
        if kms is None:
            raise d.EncryptionKeyUnavailable(
                "rotate-keys needs STATE_ENCRYPTION=on and its STATE_ENCRYPTION_KEY_FILE"
            )
        total = 0
        after: str | None = None
        while True:
            primary = kms.primary_id()
            rows = await self._rows(
                enc.SELECT_KEYS_TO_REWRAP, {"primary": primary, "after": after, "batch": batch_size}
            )
            if not rows:
                return total
            rewrapped = []
            for row in rows:
                key_id = bytes(row["key_id"])
                raw = kms.unwrap(
                    user_id=row["user_id"],
                    key_id=key_id,
                    wrapped=WrappedKey(row["kek_id"], bytes(row["wrapped"])),
                )
                rewrapped.append(
                    (row, kms.wrap(user_id=row["user_id"], key_id=key_id, data_key=raw))
                )
            updated = await self._rows(
                enc.REWRAP_KEYS,
                {
                    "user_ids": TextArray([r["user_id"] for r, _ in rewrapped]),
                    "old_kek_ids": TextArray([r["kek_id"] for r, _ in rewrapped]),
                    "new_kek_ids": TextArray([w.kek_id for _, w in rewrapped]),
                    "new_wrapped": [w.wrapped for _, w in rewrapped],
                },
            )
            total += len(updated)  # a key erased or rewrapped meanwhile is not counted
            after = rows[-1]["user_id"]
            if pause:
                await asyncio.sleep(pause)

    async def data_keys_by_kek(self) -> dict[str, int]:
        """How many data keys each KEK id wraps (what rotate-keys left)."""
        rows = await self._rows(enc.COUNT_KEYS_BY_KEK, {})
        return {row["kek_id"]: int(row["keys"]) for row in rows}

    def _keys(self, user_id: str) -> UserKeys:
        """The user's data key for one call (encryption.py), fetched only when needed."""
        return UserKeys(self.encryption, self._key_rows, user_id)

    async def _key_rows(self, statement: str, params: dict[str, object]) -> list[Row]:
        return await self._rows(statement, dict(params))

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
                raise refusal(detail, batch) from None
            if (exc.sqlstate or "").startswith(PROGRAM_LIMIT_EXCEEDED):
                # Beyond the parser's own limits: far deeper than MAX_JSON_DEPTH.
                raise d.too_deep(json_param or "the request") from exc
            if isinstance(exc, psycopg.DataError | psycopg.errors.CheckViolation):
                for index, write in enumerate(writes):  # the error path: find the culprit
                    check_write_json(write, where_in_batch(index, batch))
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
                cur.adapters.register_loader("text", RawTextLoader)
            await cur.execute(statement, params, binary=binary)
            return await cur.fetchall()
