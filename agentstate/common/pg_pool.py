"""A psycopg connection pool whose outages surface as one "unavailable" error.

Both PostgreSQL users (the state store and the demo order system) open a pool the
same way and turn "cannot reach the database" into their own domain error.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any, Generic, TypeVar

import psycopg
from psycopg_pool import AsyncConnectionPool, PoolTimeout

Conn = psycopg.AsyncConnection[tuple[Any, ...]]
ConnT = TypeVar("ConnT", bound=psycopg.AsyncConnection[Any])
Unavailable = Callable[[str], Exception]
# SQLSTATE class 54: a statement beyond PostgreSQL's limits. psycopg files it under
# OperationalError with real outages, but retrying it can never succeed.
PROGRAM_LIMIT_EXCEEDED = "54"


def pg_reason(exc: psycopg.Error) -> str:
    """PostgreSQL's own words for what went wrong, with its detail when it gives one."""
    primary = (exc.diag.message_primary or str(exc)).strip()
    detail = (exc.diag.message_detail or "").strip()
    return f"{primary} ({detail})" if detail else primary


class GuardedPool(Generic[ConnT]):
    def __init__(
        self,
        pool: AsyncConnectionPool[ConnT],
        *,
        what: str,
        unavailable: Unavailable,
        connect_timeout: float,
    ) -> None:
        self.pool = pool
        self._what = what
        self._unavailable = unavailable
        self._connect_timeout = connect_timeout

    async def open(self) -> None:
        """Open the pool, waiting up to the connect timeout for the database."""
        try:
            await self.pool.open(wait=True, timeout=self._connect_timeout)
        except PoolTimeout as exc:
            raise self._unavailable(
                f"could not connect to the {self._what} within {self._connect_timeout:g}s"
            ) from exc

    async def close(self) -> None:
        await self.pool.close()

    @contextlib.asynccontextmanager
    async def connection(self) -> AsyncIterator[ConnT]:
        """A pooled connection; a pool timeout or a lost server becomes `unavailable`."""
        try:
            async with self.pool.connection() as conn:
                yield conn
        except PoolTimeout as exc:
            raise self._unavailable(f"no {self._what} connection available: {exc}") from exc
        except psycopg.OperationalError as exc:
            if (exc.sqlstate or "").startswith(PROGRAM_LIMIT_EXCEEDED):
                raise  # the request is too complex (say, JSON nested too deep): not an outage
            raise self._unavailable(f"{self._what} unavailable: {pg_reason(exc)}") from exc
