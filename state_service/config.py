"""State service settings. Every one comes from an environment variable (see README)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from agentstate.common.config import (
    default_data_dir,
    env_bool,
    env_choice,
    env_float,
    env_int,
    env_str,
)
from agentstate.common.embedded_postgres import ENGINES

MIB = 1024 * 1024


@dataclass(frozen=True)
class StateServiceSettings:
    # STATE_LISTEN_ADDRESS: host:port, or unix:///absolute/path.sock for a sidecar.
    listen_address: str = "127.0.0.1:50051"
    # STATE_STORE: postgres (production) or memory (demos; data dies with the process).
    store: str = "postgres"
    # DATABASE_URL: libpq URL of the PostgreSQL to use. Empty: start an embedded one.
    database_url: str = ""
    # STATE_EMBEDDED_PG_DIR: data directory of the embedded PostgreSQL.
    embedded_pg_dir: str = default_data_dir("pgdata")
    # STATE_EMBEDDED_PG_ENGINE: auto (system binaries, else the pgserver package),
    # system or pgserver.
    embedded_pg_engine: str = "auto"
    # STATE_DB_POOL_MIN_SIZE / STATE_DB_POOL_MAX_SIZE: connection pool bounds.
    pool_min_size: int = 1
    pool_max_size: int = 10
    # STATE_DB_POOL_TIMEOUT_SECONDS: wait for a free connection before UNAVAILABLE.
    pool_timeout_seconds: float = 5.0
    # STATE_DB_CONNECT_TIMEOUT_SECONDS: how long start-up waits for the database.
    connect_timeout_seconds: float = 30.0
    # STATE_DB_CHECK_INTERVAL_SECONDS: how often a background probe (SELECT 1 on its own
    # connection) checks the database while it answers; it drives grpc.health.
    db_check_interval_seconds: float = 1.0
    # STATE_DB_RETRY_INTERVAL_SECONDS: how often the probe tries to reconnect while the
    # database is unreachable (calls fail fast with UNAVAILABLE meanwhile).
    db_retry_interval_seconds: float = 0.25
    # STATE_DB_CHECK_TIMEOUT_SECONDS: a probe slower than this counts as unreachable.
    db_check_timeout_seconds: float = 3.0
    # STATE_MAX_PAYLOAD_BYTES: largest AgentState accepted (RESOURCE_EXHAUSTED above).
    max_payload_bytes: int = 8 * MIB
    # STATE_GRPC_MAX_MESSAGE_BYTES: gRPC receive/send limit; keep above the payload limit.
    grpc_max_message_bytes: int = 16 * MIB
    # STATE_SHUTDOWN_GRACE_SECONDS: time in-flight RPCs get after SIGTERM/SIGINT.
    shutdown_grace_seconds: float = 10.0
    # STATE_MIGRATE_ON_START: apply schema migrations at start-up.
    migrate_on_start: bool = True
    # STATE_RETENTION_DAYS: delete conversations untouched this long (0 = keep forever).
    retention_days: float = 0.0
    # STATE_RETENTION_INTERVAL_SECONDS: how often the retention sweep runs.
    retention_interval_seconds: float = 3600.0

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> StateServiceSettings:
        env = os.environ if env is None else env
        d = cls()
        return cls(
            listen_address=env_str(env, "STATE_LISTEN_ADDRESS", d.listen_address),
            store=env_choice(env, "STATE_STORE", d.store, ("postgres", "memory")),
            database_url=env_str(env, "DATABASE_URL", d.database_url),
            embedded_pg_dir=env_str(env, "STATE_EMBEDDED_PG_DIR", d.embedded_pg_dir),
            embedded_pg_engine=env_choice(
                env, "STATE_EMBEDDED_PG_ENGINE", d.embedded_pg_engine, ENGINES
            ),
            pool_min_size=env_int(env, "STATE_DB_POOL_MIN_SIZE", d.pool_min_size, minimum=0),
            pool_max_size=env_int(env, "STATE_DB_POOL_MAX_SIZE", d.pool_max_size, minimum=1),
            pool_timeout_seconds=env_float(
                env, "STATE_DB_POOL_TIMEOUT_SECONDS", d.pool_timeout_seconds, minimum=0.1
            ),
            connect_timeout_seconds=env_float(
                env, "STATE_DB_CONNECT_TIMEOUT_SECONDS", d.connect_timeout_seconds, minimum=0.1
            ),
            db_check_interval_seconds=env_float(
                env, "STATE_DB_CHECK_INTERVAL_SECONDS", d.db_check_interval_seconds, minimum=0.05
            ),
            db_retry_interval_seconds=env_float(
                env, "STATE_DB_RETRY_INTERVAL_SECONDS", d.db_retry_interval_seconds, minimum=0.05
            ),
            db_check_timeout_seconds=env_float(
                env, "STATE_DB_CHECK_TIMEOUT_SECONDS", d.db_check_timeout_seconds, minimum=0.1
            ),
            max_payload_bytes=env_int(
                env, "STATE_MAX_PAYLOAD_BYTES", d.max_payload_bytes, minimum=2
            ),
            grpc_max_message_bytes=env_int(
                env, "STATE_GRPC_MAX_MESSAGE_BYTES", d.grpc_max_message_bytes, minimum=1024
            ),
            shutdown_grace_seconds=env_float(
                env, "STATE_SHUTDOWN_GRACE_SECONDS", d.shutdown_grace_seconds
            ),
            migrate_on_start=env_bool(env, "STATE_MIGRATE_ON_START", d.migrate_on_start),
            retention_days=env_float(env, "STATE_RETENTION_DAYS", d.retention_days),
            retention_interval_seconds=env_float(
                env, "STATE_RETENTION_INTERVAL_SECONDS", d.retention_interval_seconds, minimum=0.1
            ),
        )
