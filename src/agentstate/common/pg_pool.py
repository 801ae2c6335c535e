"""A psycopg connection pool whose outages surface as one "unavailable" error, fast.

Both PostgreSQL users (the state store and the demo order system) open a pool the
same way and turn "cannot reach the database" into their own domain error.

A background watcher keeps one extra connection and probes the database with it
(`SELECT 1` every `interval` while it answers, a fresh connection attempt every
`retry_interval` while it does not). The RPCs themselves stay untouched: no check on
checkout, no extra round trip. While the database is unreachable:

- calls fail at once with `unavailable` (one line) instead of each waiting out the
  pool timeout for a connection that cannot come;
- listeners hear about it (the state service turns it into grpc.health NOT_SERVING).

When the probe connects again the watcher drops the pool's dead connections
(`pool.check()`), lets it grow, and only then reopens the gate. psycopg_pool's own
reconnection backs off exponentially (1, 2, 4 ... s) for `reconnect_timeout` (5 min by
default), so after a long outage its next attempt could be half a minute away: here the
pool gives up within `reconnect_timeout` (2 s) and the watcher, not the backoff,
decides when to reconnect.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import psycopg
from psycopg_pool import AsyncConnectionPool, PoolTimeout

Conn = psycopg.AsyncConnection[tuple[Any, ...]]
ConnT = TypeVar("ConnT", bound=psycopg.AsyncConnection[Any])
Unavailable = Callable[[str], Exception]
# SQLSTATE class 54: a statement beyond PostgreSQL's limits. psycopg files it under
# OperationalError with real outages, but retrying it can never succeed.
PROGRAM_LIMIT_EXCEEDED = "54"
# Called with (available, reason) whenever the database comes or goes.
Listener = Callable[[bool, str], Awaitable[None]]

log = logging.getLogger(__name__)

_MAX_REASON_CHARS = 400


def one_line(text: str) -> str:
    """libpq's multi-line error text as one line: hint lines (indented) dropped."""
    lines = [
        line.strip()
        for line in text.splitlines()
        if line.strip() and not line.startswith((" ", "\t"))
    ]
    joined = "; ".join(lines).replace(":; ", ": ")
    if len(joined) > _MAX_REASON_CHARS:
        joined = joined[: _MAX_REASON_CHARS - 3] + "..."
    return joined


def pg_reason(exc: BaseException) -> str:
    """PostgreSQL's own words for what went wrong (with its detail), on one line."""
    if isinstance(exc, psycopg.Error):
        primary = (exc.diag.message_primary or str(exc)).strip()
        detail = (exc.diag.message_detail or "").strip()
        text = f"{primary} ({detail})" if detail else primary
    elif isinstance(exc, TimeoutError):
        text = "no answer in time"
    else:
        text = str(exc) or type(exc).__name__
    return one_line(text)


@dataclass(frozen=True)
class WatchSettings:
    """How the watcher probes the database (see the module docstring)."""

    interval: float = 1.0  # seconds between probes while the database answers
    retry_interval: float = 0.25  # seconds between connection attempts while it does not
    timeout: float = 3.0  # a probe (connect or SELECT 1) slower than this counts as down
    reconnect_timeout: float = 2.0  # how long the pool's own reconnection keeps trying


class GuardedPool(Generic[ConnT]):
    def __init__(
        self,
        pool: AsyncConnectionPool[ConnT],
        *,
        what: str,
        unavailable: Unavailable,
        connect_timeout: float,
        watch: WatchSettings | None = None,
    ) -> None:
        self.pool = pool
        self._what = what
        self._unavailable = unavailable
        self._connect_timeout = connect_timeout
        self.watch_settings = watch or WatchSettings()
        self._available = False
        self._reason = "not opened yet"
        self._listeners: list[Listener] = []
        self._poke = asyncio.Event()
        self._watcher: asyncio.Task[None] | None = None
        self._probe_conn: psycopg.AsyncConnection[Any] | None = None
        self._down_since = 0.0

    @property
    def available(self) -> bool:
        """False while the watcher finds the database unreachable."""
        return self._available

    def add_listener(self, listener: Listener) -> None:
        self._listeners.append(listener)

    async def open(self) -> None:
        """Wait up to the connect timeout for the database, open the pool, start watching."""
        deadline = time.monotonic() + self._connect_timeout
        # Start-up may wait for a database that is still coming up: let the pool retry
        # for as long as we wait; once running, the watcher takes over.
        self.pool.reconnect_timeout = self._connect_timeout
        reason = await self._probe()
        while reason is not None and time.monotonic() < deadline:
            await asyncio.sleep(self.watch_settings.retry_interval)
            reason = await self._probe()
        try:
            if reason is not None:
                raise PoolTimeout(reason)
            await self.pool.open(wait=True, timeout=max(1.0, deadline - time.monotonic()))
        except PoolTimeout as exc:
            await self._close_probe()
            raise self._unavailable(
                f"could not connect to the {self._what} within {self._connect_timeout:g}s"
                f": {reason or 'the pool did not fill'}"
            ) from exc
        self.pool.reconnect_timeout = self.watch_settings.reconnect_timeout
        self._available = True
        self._reason = ""
        self._watcher = asyncio.create_task(self._watch(), name=f"{self._what} watcher")

    async def close(self) -> None:
        if self._watcher is not None:
            self._watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watcher
            self._watcher = None
        await self._close_probe()
        await self.pool.close()

    @contextlib.asynccontextmanager
    async def connection(self) -> AsyncIterator[ConnT]:
        """A pooled connection; a known outage, a pool timeout or a lost server becomes
        `unavailable` (at once, for a known outage)."""
        if not self._available:
            raise self._unavailable(f"{self._what} unavailable: {self._reason}")
        try:
            async with self.pool.connection() as conn:
                yield conn
        except PoolTimeout as exc:
            self._poke.set()  # maybe the database is gone: find out now
            raise self._unavailable(f"no {self._what} connection available: {exc}") from exc
        except psycopg.OperationalError as exc:
            if (exc.sqlstate or "").startswith(PROGRAM_LIMIT_EXCEEDED):
                raise  # the request is too complex (say, JSON nested too deep): not an outage
            self._poke.set()
            raise self._unavailable(f"{self._what} unavailable: {pg_reason(exc)}") from exc

    # ------------------------------------------------------------ the watcher

    async def _watch(self) -> None:
        settings = self.watch_settings
        while True:
            if self._available:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._poke.wait(), settings.interval)
            else:
                await asyncio.sleep(settings.retry_interval)
            self._poke.clear()
            reason = await self._probe()
            try:
                if reason is not None and self._available:
                    await self._went_down(reason)
                elif reason is None and not self._available:
                    await self._came_back()
                elif reason is not None:
                    self._reason = reason
            except Exception:  # a listener failed: keep watching regardless
                log.exception("%s watcher", self._what)

    async def _probe(self) -> str | None:
        """None when the database answers, else why not (one line)."""
        timeout = self.watch_settings.timeout
        try:
            async with asyncio.timeout(timeout):
                if self._probe_conn is None or self._probe_conn.closed:
                    self._probe_conn = await psycopg.AsyncConnection.connect(
                        self._conninfo(),
                        autocommit=True,
                        connect_timeout=max(1, round(timeout)),
                        # As the pool's: psycopg would prepare its 5th SELECT 1, which a
                        # transaction pooler without prepared statements breaks.
                        prepare_threshold=self._prepare_threshold(),
                    )
                await self._probe_conn.execute("SELECT 1")
            return None
        except (psycopg.Error, OSError, TimeoutError) as exc:
            await self._close_probe()
            return pg_reason(exc)

    def _prepare_threshold(self) -> int | None:
        kwargs = self.pool.kwargs
        return kwargs.get("prepare_threshold", 5) if isinstance(kwargs, dict) else 5

    def _conninfo(self) -> str:
        conninfo = self.pool.conninfo
        return conninfo if isinstance(conninfo, str) else ""

    async def _close_probe(self) -> None:
        conn, self._probe_conn = self._probe_conn, None
        if conn is not None:
            with contextlib.suppress(Exception):
                await conn.close()

    async def _went_down(self, reason: str) -> None:
        self._available = False
        self._reason = reason
        self._down_since = time.monotonic()
        log.warning("%s unreachable, failing calls fast until it answers: %s", self._what, reason)
        await self._notify(False, reason)

    async def _came_back(self) -> None:
        # Drop the connections that died with the server and refill before reopening the
        # gate, so the first calls find fresh connections instead of dead ones.
        await self.pool.check()
        try:
            async with self.pool.connection(timeout=self.watch_settings.timeout):
                pass
        except PoolTimeout:
            self._reason = f"the {self._what} answers but the pool could not connect"
            return  # still down: the next round tries again
        self._available = True
        self._reason = ""
        log.warning(
            "%s reachable again after %.1fs", self._what, time.monotonic() - self._down_since
        )
        await self._notify(True, "")

    async def _notify(self, available: bool, reason: str) -> None:
        for listener in self._listeners:
            await listener(available, reason)
