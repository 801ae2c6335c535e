"""Start-up checks of the database route: direct or through a pooler, and what that allows.

What a client can learn, and how (docs/scaling.md says the same):

- Whether something sits between us and PostgreSQL: PostgreSQL reports the client
  address of our backend (`pg_stat_activity`). Over TCP, a direct connection is one where
  that is our own socket's address and port; over a unix socket, one where the socket's
  port is the server's `port`. Anything else (PgBouncer, another proxy, a NAT that
  rewrites the source) counts as "not direct". Unix socket to a pooler that reaches
  PostgreSQL by a unix socket with the same port number is the one route this misses.
- Whether server-side prepared statements survive the route: `prepared_statements_break`
  tries it. One connection prepares a statement; a second connection holds a transaction
  open (a transaction pooler hands it the server connection just released, PgBouncer's
  default LIFO); the first then runs its prepared statement again, necessarily on another
  server connection when pooled. A transaction pooler without prepared statement support
  (PgBouncer < 1.21, or `max_prepared_statements = 0`) fails that with "prepared statement
  does not exist" (or "already exists": another client's statement of the same name on
  the session it got; the check's own statement stays behind on one server session
  the same way, harmless while statements are not prepared). When no switch of server
  connection is seen, the check cannot tell and says so; it never reports a break it did
  not see.
- The server's connection limit: `max_connections` less the slots reserved for
  superusers (and `reserved_connections`, PostgreSQL 16+). Behind a pooler the limit that
  bounds our pool is the pooler's `max_client_conn`, which a client cannot read.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import os
import socket
from dataclasses import dataclass
from typing import Any

import psycopg
import psycopg.errors
from psycopg.rows import tuple_row

CHECK_STATEMENT = "SELECT pg_backend_pid() /* agentstate prepared-statement check */"


@dataclass(frozen=True)
class Route:
    direct: bool
    detail: str  # what each side sees, for the log and error messages


def _local_endpoint(conn: psycopg.AsyncConnection[Any]) -> tuple[str, int] | None:
    """Our socket's (address, port), or None for a unix socket."""
    sock = socket.socket(fileno=os.dup(conn.pgconn.socket))  # a duplicate: ours to close
    try:
        if sock.family not in (socket.AF_INET, socket.AF_INET6):
            return None
        address, port = sock.getsockname()[:2]
        return str(ipaddress.ip_address(address.split("%")[0])), int(port)
    finally:
        sock.close()


def _normalised(address: str | None) -> str | None:
    if address is None:
        return None
    ip = ipaddress.ip_address(address)
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return str(ip.ipv4_mapped)
    return str(ip)


async def route_of(conn: psycopg.AsyncConnection[Any]) -> Route:
    """Does `conn` reach PostgreSQL directly? (See the module docstring.)"""
    cur = conn.cursor(row_factory=tuple_row)
    await cur.execute(
        "SELECT host(client_addr), client_port, current_setting('port')::int "
        "FROM pg_stat_activity WHERE pid = pg_backend_pid()"
    )
    row = await cur.fetchone()
    assert row is not None  # our own backend is always visible to us
    client_addr, client_port, server_port = _normalised(row[0]), int(row[1]), int(row[2])
    ours = _local_endpoint(conn)
    if ours is None:
        their = "a unix socket" if client_addr is None else f"{client_addr}:{client_port}"
        connected_port = int(conn.info.port)
        direct = client_addr is None and connected_port == server_port
        return Route(
            direct,
            f"we connected to a unix socket of port {connected_port}; PostgreSQL (port "
            f"{server_port}) sees its client on {their}",
        )
    our_addr, our_port = _normalised(ours[0]), ours[1]
    their = "a unix socket" if client_addr is None else f"{client_addr}:{client_port}"
    return Route(
        (client_addr, client_port) == (our_addr, our_port),
        f"we connect from {our_addr}:{our_port}; PostgreSQL sees its client at {their}",
    )


@dataclass(frozen=True)
class PreparedCheck:
    breaks: bool | None  # True: seen failing; False: seen working across servers; None: unknown
    detail: str


async def prepared_statements_break(conninfo: str, *, wait: float = 3.0) -> PreparedCheck:
    """Try a prepared statement across a change of server connection (module docstring)."""
    preparer = await psycopg.AsyncConnection.connect(
        conninfo, autocommit=True, prepare_threshold=0, connect_timeout=max(1, round(wait))
    )
    holder = await psycopg.AsyncConnection.connect(
        conninfo, autocommit=True, prepare_threshold=None, connect_timeout=max(1, round(wait))
    )
    try:
        try:
            first = await _backend_pid(preparer)
        except psycopg.errors.DuplicatePreparedStatement as exc:
            # Our connection is new, its statement names too: the server session it got
            # carries another client's prepared statements.
            return PreparedCheck(True, f"server sessions are shared: {exc.diag.message_primary}")
        async with holder.transaction():
            held = await _backend_pid(holder)
            try:
                async with asyncio.timeout(wait):
                    again = await _backend_pid(preparer)
            except (
                psycopg.errors.InvalidSqlStatementName,
                psycopg.errors.DuplicatePreparedStatement,
            ) as exc:
                return PreparedCheck(
                    True,
                    "a statement prepared on one server connection was run on another: "
                    f"{exc.diag.message_primary} (a transaction pooler that does not keep "
                    "prepared statements, such as PgBouncer < 1.21)",
                )
            except TimeoutError:
                return PreparedCheck(
                    None,
                    f"no second server connection within {wait:g}s (a pooler with a "
                    "server pool of 1?): cannot tell",
                )
        if again != first:
            return PreparedCheck(
                False,
                f"the statement prepared on server process {first} ran on {again}: the "
                "pooler keeps prepared statements",
            )
        return PreparedCheck(
            None,
            f"no change of server connection seen (the other connection ran on server process "
            f"{held}): a direct connection, session pooling, or a pooler that is not LIFO",
        )
    finally:
        for conn in (preparer, holder):
            with contextlib.suppress(Exception):
                await conn.close()


async def _backend_pid(conn: psycopg.AsyncConnection[Any]) -> int:
    cur = conn.cursor(row_factory=tuple_row)
    await cur.execute(CHECK_STATEMENT)
    row = await cur.fetchone()
    assert row is not None
    return int(row[0])


@dataclass(frozen=True)
class ServerCapacity:
    max_connections: int
    reserved: int  # superuser_reserved_connections + reserved_connections (PostgreSQL 16+)

    @property
    def available(self) -> int:
        """Connections an ordinary role may open."""
        return self.max_connections - self.reserved


async def server_capacity(conn: psycopg.AsyncConnection[Any]) -> ServerCapacity:
    cur = conn.cursor(row_factory=tuple_row)
    await cur.execute(
        "SELECT current_setting('max_connections')::int, "
        "current_setting('superuser_reserved_connections')::int "
        "+ coalesce(current_setting('reserved_connections', true)::int, 0)"
    )
    row = await cur.fetchone()
    assert row is not None
    return ServerCapacity(int(row[0]), int(row[1]))
