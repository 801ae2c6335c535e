"""Assemble and run the state service: store, gRPC server, health, shutdown."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from datetime import UTC, datetime, timedelta
from typing import Any

import grpc

from agentstate.common import jwt_keys, telemetry, workers
from agentstate.common.admission import Admission, AdmissionLimits
from agentstate.common.config import ConfigError
from agentstate.common.embedded_postgres import EmbeddedPostgres
from agentstate.common.grpc_server import (
    add_health_and_reflection,
    bind,
    create_server,
    install_stop_signals,
    set_serving,
)
from agentstate.common.listen import check_listen_address
from agentstate.common.pg_pool import WatchSettings
from agentstate.common.state_metrics import PURGED
from agentstate.common.tls import server_tls
from agentstate.state.v1 import state_service_pb2 as pb
from agentstate.state.v1 import state_service_pb2_grpc as pb_grpc
from agentstate.state_service.callers import CallerInterceptor, TokenVerifier, audit_operation
from agentstate.state_service.config import StateServiceSettings, erase_settings
from agentstate.state_service.crypto import DataKeyCache, FileKms, KmsConfigError
from agentstate.state_service.domain import DeleteCounts, StateServiceError
from agentstate.state_service.policy import load_policy
from agentstate.state_service.servicer import StateServicer
from agentstate.state_service.storage.base import StateStore
from agentstate.state_service.storage.memory import MemoryStore
from agentstate.state_service.storage.postgres import MisconfiguredStore, PostgresStore
from agentstate.state_service.storage.postgres.encryption import Encryption
from agentstate.state_service.storage.postgres.migrations import MigrationLockTimeout

log = logging.getLogger(__name__)

SERVICE_NAME = pb.DESCRIPTOR.services_by_name["StateService"].full_name
LISTEN_SETTING = "STATE_LISTEN_ADDRESS"


class StateServiceApp:
    """The running service. `start()` returns the address it listens on."""

    def __init__(self, settings: StateServiceSettings) -> None:
        self.settings = settings
        self.store: StateStore | None = None
        self._embedded: EmbeddedPostgres | None = None
        self._server: grpc.aio.Server | None = None
        self._health: Any = None
        self._sweeper: asyncio.Task[None] | None = None
        self.admission = admission_of(settings)
        # Checked before a database is started: a bad policy or TLS setting exits at once.
        self.tls = server_tls(
            "STATE", settings.tls_cert_file, settings.tls_key_file, settings.tls_client_ca_file
        )
        self.callers = caller_interceptor(settings)
        # A supervised worker shares its port with the others (agentstate.common.workers).
        self.worker = workers.worker_index()

    async def start(self) -> str:
        # A port in use is reported before a database is started for nothing (a worker's
        # port is the supervisor's, reserved for sharing).
        if self.worker is None:
            check_listen_address(self.settings.listen_address, LISTEN_SETTING)
        self.store = await self._open_store()
        server = create_server(
            max_message_bytes=self.settings.grpc_max_message_bytes,
            max_connection_age_seconds=self.settings.grpc_max_connection_age_seconds,
            # Callers are identified, checked and audited inside the tracing (the audit
            # event lands on the call's span) and before admission (a refusal takes no slot).
            interceptors=[*telemetry.grpc_server_interceptors(), self.callers],
            admission=self.admission,
            reuse_port=self.worker is not None,
        )
        pb_grpc.add_StateServiceServicer_to_server(
            StateServicer(
                self.store,
                max_payload_bytes=self.settings.max_payload_bytes,
                allow_list_all_users=self.settings.allow_list_all_users == "on",
                erase=erase_settings(self.settings),
            ),
            server,
        )
        self._health = add_health_and_reflection(server, [SERVICE_NAME])
        address = bind(server, self.settings.listen_address, LISTEN_SETTING, self.tls)
        await server.start()
        self._server = server
        await set_serving(self._health, [SERVICE_NAME])
        if isinstance(self.store, PostgresStore):
            # Readiness: NOT_SERVING while the database is unreachable, SERVING once back.
            self.store.guard.add_listener(self._database_changed)
            if not self.store.guard.available:  # it went away while we were starting
                await self._database_changed(False, "unreachable")
        # One retention sweeper per replica: the first worker's. It runs without
        # STATE_RETENTION_DAYS too: conversations may have their own time to live.
        if not self.worker:
            self._sweeper = asyncio.create_task(self._sweep_forever(self.store))
        if self.worker is None:
            log.info("state service listening on %s (store: %s)", address, self.settings.store)
        else:
            log.info("state service worker %d serving on %s", self.worker, address)
            workers.announce_ready()
        return address

    async def _database_changed(self, available: bool, reason: str) -> None:
        await set_serving(self._health, [SERVICE_NAME], serving=available)

    async def _sweep_forever(self, store: StateStore) -> None:
        """Retention: every interval, delete conversations untouched for retention_days
        (when set) and those past their own time to live."""
        keep = timedelta(days=self.settings.retention_days)
        while True:
            await asyncio.sleep(self.settings.retention_interval_seconds)
            try:
                await purge(
                    store,
                    datetime.now(UTC) - keep if self.settings.retention_days > 0 else None,
                )
            except StateServiceError as exc:  # the database may be briefly away: next round
                log.warning("retention sweep failed: %s", exc)

    async def stop(self) -> None:
        """Stop taking RPCs, give in-flight ones the grace period, then release everything."""
        if self._sweeper is not None:
            self._sweeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._sweeper
        if self._health is not None:
            await self._health.enter_graceful_shutdown()
        if self._server is not None:
            await self._server.stop(self.settings.shutdown_grace_seconds)
        if self.store is not None:
            await self.store.close()
        if self._embedded is not None:
            await asyncio.to_thread(self._embedded.stop)
        if self._server is not None:  # not after a start that failed
            log.info("state service stopped")

    async def _open_store(self) -> StateStore:
        settings = self.settings
        if settings.store == "memory":
            return MemoryStore()
        dsn = settings.database_url
        if settings.store == "embedded":
            self._embedded = EmbeddedPostgres(settings.embedded_pg_dir, settings.embedded_pg_engine)
            dsn = await asyncio.to_thread(self._embedded.start)
        store = postgres_store(
            settings,
            dsn,
            min_size=settings.pool_min_size,
            max_size=settings.pool_max_size,
            migrate=settings.migrate_on_start,
        )
        store.guard.watch_settings = WatchSettings(
            interval=settings.db_check_interval_seconds,
            retry_interval=settings.db_retry_interval_seconds,
            timeout=settings.db_check_timeout_seconds,
        )
        try:
            await open_store(store)
        except BaseException:
            await store.close()
            if self._embedded is not None:
                await asyncio.to_thread(self._embedded.stop)
            raise
        return store


def caller_interceptor(settings: StateServiceSettings) -> CallerInterceptor:
    """Identity, policy and audit as the settings ask (docs/security.md); ConfigError
    for a policy that cannot be read or that no caller could satisfy."""
    policy = None
    if settings.policy_file:
        rpcs = [m.name for m in pb.DESCRIPTOR.services_by_name["StateService"].methods]
        policy = load_policy(settings.policy_file, rpcs)
        if not (settings.tls_client_ca_file or settings.token_issuer):
            raise ConfigError(
                "STATE_POLICY_FILE is set but callers have no way to identify themselves: "
                "set STATE_TLS_CLIENT_CA_FILE (client certificates) or STATE_TOKEN_ISSUER "
                "(service tokens), or both"
            )
    tokens = None
    if settings.token_issuer:
        if not settings.token_audience or bool(settings.token_jwks_url) == bool(
            settings.token_key_file
        ):
            raise ConfigError(
                "STATE_TOKEN_ISSUER needs STATE_TOKEN_AUDIENCE and exactly one of "
                "STATE_TOKEN_JWKS_URL or STATE_TOKEN_KEY_FILE"
            )
        keys = jwt_keys.key_source(
            settings.token_jwks_url, settings.token_key_file, 300.0, "STATE_TOKEN"
        )
        tokens = TokenVerifier(
            keys, settings.token_issuer, settings.token_audience, settings.token_caller_claim
        )
    return CallerInterceptor(policy, tokens, certificates=bool(settings.tls_client_ca_file))


def admission_of(settings: StateServiceSettings) -> Admission | None:
    """The admission control the settings ask for (None: STATE_MAX_CALLS_IN_FLIGHT=0)."""
    if settings.max_calls_in_flight == 0:
        return None
    return Admission(
        AdmissionLimits(
            max_in_flight=settings.max_calls_in_flight,
            max_queued=settings.max_queued_calls,
            retry_after_ms=settings.overload_retry_after_ms,
        )
    )


# The settings behind each PostgresStore parameter a start-up check can fault.
_CHECKED_SETTINGS = {
    "pool_max_size": "STATE_DB_POOL_MAX_SIZE",
    "prepared_statements": "STATE_DB_PREPARED_STATEMENTS",
}


def encryption_of(settings: StateServiceSettings) -> Encryption | None:
    """Encryption at rest as the settings ask (None: off); a key file that cannot be
    used is a ConfigError naming it."""
    if settings.encryption != "on":
        return None
    try:
        kms = FileKms(settings.encryption_key_file, settings.encryption_erased_file or None)
    except KmsConfigError as exc:
        name = (
            "STATE_ENCRYPTION_ERASED_FILE"
            if "erased-keys" in str(exc)
            else "STATE_ENCRYPTION_KEY_FILE"
        )
        raise ConfigError(f"{name}: {exc}") from None
    return Encryption(
        kms,
        DataKeyCache(
            size=settings.encryption_key_cache_size, ttl=settings.encryption_key_cache_seconds
        ),
    )


def postgres_store(
    settings: StateServiceSettings, dsn: str, *, min_size: int, max_size: int, migrate: bool
) -> PostgresStore:
    """The PostgreSQL store as the settings describe it (serve, migrate and purge)."""
    return PostgresStore(
        dsn,
        encryption=encryption_of(settings),
        min_size=min_size,
        max_size=max_size,
        timeout=settings.pool_timeout_seconds,
        connect_timeout=settings.connect_timeout_seconds,
        migrate=migrate,
        prepared_statements=settings.db_prepared_statements == "on",
        migration_conninfo=settings.migration_database_url,
        migration_lock_timeout=settings.migration_lock_timeout_seconds,
    )


async def open_store(store: PostgresStore) -> None:
    """Open the store; a failed start-up check is a ConfigError naming the variable."""
    try:
        await store.open()
    except MisconfiguredStore as exc:
        name = _CHECKED_SETTINGS[exc.parameter]
        raise ConfigError(f"{name}: {exc}") from None
    except MigrationLockTimeout as exc:
        raise ConfigError(f"STATE_MIGRATION_LOCK_TIMEOUT_SECONDS: {exc}") from None


async def serve(settings: StateServiceSettings) -> None:
    """Run until SIGTERM or SIGINT, then shut down gracefully."""
    stop = asyncio.Event()
    install_stop_signals(stop)
    app = StateServiceApp(settings)
    try:
        await app.start()
    except BaseException:
        await app.stop()  # whatever it had started (the embedded PostgreSQL, say)
        raise
    await stop.wait()
    await app.stop()


RETENTION_SWEEP = "retention sweep"


async def purge(
    store: StateStore, before: datetime | None, by: str = RETENTION_SWEEP
) -> DeleteCounts:
    """Run one retention sweep and account for it (metrics, and the audit trail: `by` is
    who ran it): conversations untouched since `before` (None: none of that kind), then
    those past their own time to live."""
    inactive = DeleteCounts(0, 0, 0)
    if before is not None:
        inactive = await store.purge_inactive(before=before)
    expired = await store.purge_expired()
    if expired.conversations:
        log.info(
            "retention: deleted %d conversations past their time to live (%d messages, %d states)",
            expired.conversations,
            expired.messages,
            expired.states,
        )
    counts = inactive + expired
    if by == RETENTION_SWEEP and not counts.conversations:
        return counts  # the sweep runs every interval: only one that deleted is audited
    audit_operation(
        by,
        "PurgeInactive",
        {
            "conversations_deleted": counts.conversations,
            "messages_deleted": counts.messages,
            "states_deleted": counts.states,
        },
        before=before.isoformat() if before is not None else "",
    )
    for kind, value in (
        ("conversations", counts.conversations),
        ("messages", counts.messages),
        ("states", counts.states),
    ):
        PURGED.add(value, {"kind": kind})
    if inactive.conversations and before is not None:
        log.info(
            "retention: deleted %d conversations untouched since %s (%d messages, %d states)",
            inactive.conversations,
            before.isoformat(),
            inactive.messages,
            inactive.states,
        )
    return counts
