"""A database behind a real PgBouncer (transaction mode) for the pooler tests.

The pooler logs in to PostgreSQL as `agentstate_pooled`, an ordinary role that may read
and write the tables but not create anything: migrations through the pooler would fail,
so a test that serves through it proves they ran on STATE_MIGRATION_DATABASE_URL, and
the pooler's server connections are the ones with that user name in pg_stat_activity.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

import grpc
import psycopg
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from agentstate.common.embedded_postgres import EmbeddedPostgres
from agentstate.dev.pgbouncer import PgBouncer, pgbouncer_binary
from tests.conftest import create_database

POOLED_ROLE = "agentstate_pooled"
SERVING = health_pb2.HealthCheckResponse.SERVING


def require_pgbouncer() -> None:
    if pgbouncer_binary() is None:
        if os.environ.get("CI"):
            pytest.fail(
                "pgbouncer is missing in CI: scripts/install_pgbouncer.sh should install it"
            )
        pytest.skip("pgbouncer is not installed (scripts/install_pgbouncer.sh)")


def pooled_database(postgres: EmbeddedPostgres, name: str) -> str:
    """A fresh database the pooled role may use; returns its direct (superuser) URL."""
    url = create_database(postgres, name)
    with psycopg.connect(postgres.dsn, autocommit=True) as conn:
        exists = conn.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (POOLED_ROLE,))
        if exists.fetchone() is None:
            conn.execute(f"CREATE ROLE {POOLED_ROLE} LOGIN")
    with psycopg.connect(url, autocommit=True) as conn:
        for kind in ("TABLES", "SEQUENCES"):
            conn.execute(
                f"ALTER DEFAULT PRIVILEGES FOR ROLE postgres IN SCHEMA public "
                f"GRANT ALL ON {kind} TO {POOLED_ROLE}"
            )
    return url


@contextmanager
def pgbouncer(postgres: EmbeddedPostgres, name: str, pool_size: int) -> Iterator[PgBouncer]:
    require_pgbouncer()
    bouncer = PgBouncer(postgres.dsn, name, pool_size=pool_size, server_user=POOLED_ROLE)
    bouncer.start()
    try:
        yield bouncer
    finally:
        bouncer.close()


def pooled_env(bouncer: PgBouncer, direct_url: str, **extra: str) -> dict[str, str]:
    """The state service behind the pooler, as k8s/overlays/ha configures it."""
    return {
        "STATE_STORE": "postgres",
        "DATABASE_URL": bouncer.url,
        "STATE_MIGRATION_DATABASE_URL": direct_url,
        "STATE_DB_PREPARED_STATEMENTS": "off",
        "STATE_LISTEN_ADDRESS": "127.0.0.1:0",
        **extra,
    }


def health(address: str) -> int:
    with grpc.insecure_channel(address) as channel:
        reply = health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(service=""), timeout=3
        )
        return int(reply.status)


def server_connections(direct_url: str) -> int:
    """The pooler's server connections to PostgreSQL, now."""
    with psycopg.connect(direct_url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE usename = %s", (POOLED_ROLE,)
        ).fetchone()
        assert row is not None
        return int(row[0])
