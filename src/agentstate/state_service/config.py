"""State service settings: one declaration each, read from environment variables
(docs/reference/settings.md)."""

from __future__ import annotations

from typing import Annotated, Literal, Self

from pydantic import BeforeValidator, Field, model_validator

from agentstate.common.config import EnvSettings, casefold_choice, default_data_dir
from agentstate.state_service.storage.base.lifecycle import EraseSettings

MIB = 1024 * 1024

StoreKind = Annotated[Literal["embedded", "postgres", "memory"], BeforeValidator(casefold_choice)]
EngineKind = Annotated[Literal["auto", "system", "pgserver"], BeforeValidator(casefold_choice)]
OnOff = Annotated[Literal["on", "off"], BeforeValidator(casefold_choice)]


class StateServiceSettings(EnvSettings):
    listen_address: str = Field(
        default="127.0.0.1:50051",
        validation_alias="STATE_LISTEN_ADDRESS",
        description="host:port (port 0 picks one), or unix:///absolute/path.sock (sidecar)",
    )
    store: StoreKind = Field(
        default="embedded",
        validation_alias="STATE_STORE",
        description="embedded (start a private PostgreSQL), postgres (DATABASE_URL) or memory",
    )
    database_url: str = Field(
        default="",
        validation_alias="DATABASE_URL",
        description="libpq URL of the PostgreSQL to use; required by STATE_STORE=postgres",
    )
    embedded_pg_dir: str = Field(
        default_factory=lambda: default_data_dir("pgdata"),
        validation_alias="STATE_EMBEDDED_PG_DIR",
        description="data directory of the embedded PostgreSQL",
        json_schema_extra={"shown_default": "/var/tmp/agentstate-$USER/pgdata"},
    )
    embedded_pg_engine: EngineKind = Field(
        default="auto",
        validation_alias="STATE_EMBEDDED_PG_ENGINE",
        description="auto (system binaries if installed, else pgserver), system or pgserver",
    )
    pool_min_size: int = Field(
        default=1,
        validation_alias="STATE_DB_POOL_MIN_SIZE",
        ge=0,
        description="connection pool floor",
    )
    pool_max_size: int = Field(
        default=10,
        validation_alias="STATE_DB_POOL_MAX_SIZE",
        ge=1,
        description="connection pool bound",
    )
    pool_timeout_seconds: float = Field(
        default=5.0,
        validation_alias="STATE_DB_POOL_TIMEOUT_SECONDS",
        ge=0.1,
        description="wait for a free connection before UNAVAILABLE",
    )
    connect_timeout_seconds: float = Field(
        default=30.0,
        validation_alias="STATE_DB_CONNECT_TIMEOUT_SECONDS",
        ge=0.1,
        description="how long start-up waits for the database",
    )
    db_check_interval_seconds: float = Field(
        default=1.0,
        validation_alias="STATE_DB_CHECK_INTERVAL_SECONDS",
        ge=0.05,
        description="how often a background probe (SELECT 1 on its own connection) checks "
        "the database while it answers; it drives grpc.health",
    )
    db_retry_interval_seconds: float = Field(
        default=0.25,
        validation_alias="STATE_DB_RETRY_INTERVAL_SECONDS",
        ge=0.05,
        description="how often the probe reconnects while the database is unreachable "
        "(calls fail fast with UNAVAILABLE meanwhile)",
    )
    db_check_timeout_seconds: float = Field(
        default=3.0,
        validation_alias="STATE_DB_CHECK_TIMEOUT_SECONDS",
        ge=0.1,
        description="a probe slower than this counts as unreachable",
    )
    max_payload_bytes: int = Field(
        default=8 * MIB,
        validation_alias="STATE_MAX_PAYLOAD_BYTES",
        ge=2,
        description="largest AgentState accepted (RESOURCE_EXHAUSTED above)",
    )
    grpc_max_message_bytes: int = Field(
        default=16 * MIB,
        validation_alias="STATE_GRPC_MAX_MESSAGE_BYTES",
        ge=1024,
        description="gRPC receive/send limit; keep above the payload limit",
    )
    grpc_max_connection_age_seconds: float = Field(
        default=0.0,
        validation_alias="STATE_GRPC_MAX_CONNECTION_AGE_SECONDS",
        ge=0,
        description="close each client connection after this long so callers re-resolve "
        "a name with several replicas and find new ones; 0 never (the sidecar)",
    )
    workers: int = Field(
        default=1,
        validation_alias="STATE_WORKERS",
        ge=1,
        le=256,
        description="server processes on the one port (SO_REUSEPORT), each with its own "
        "pool: one per core a central replica may use; more than 1 needs STATE_STORE=postgres "
        "and a host:port address (docs/scaling.md)",
    )
    max_calls_in_flight: int = Field(
        default=32,
        validation_alias="STATE_MAX_CALLS_IN_FLIGHT",
        ge=0,
        description="calls one worker serves at once; 0: no admission control",
    )
    max_queued_calls: int = Field(
        default=32,
        validation_alias="STATE_MAX_QUEUED_CALLS",
        ge=0,
        description="calls one worker lets wait for a free slot; beyond them calls are "
        "refused at once (UNAVAILABLE, reason OVERLOADED, grpc-retry-pushback-ms)",
    )
    overload_retry_after_ms: int = Field(
        default=100,
        validation_alias="STATE_OVERLOAD_RETRY_AFTER_MS",
        ge=1,
        description="the pushback a refused call carries (scattered over ±50 %)",
    )
    shutdown_grace_seconds: float = Field(
        default=10.0,
        validation_alias="STATE_SHUTDOWN_GRACE_SECONDS",
        ge=0,
        description="time in-flight RPCs get after SIGTERM/SIGINT",
    )
    migrate_on_start: bool = Field(
        default=True,
        validation_alias="STATE_MIGRATE_ON_START",
        description="apply migrations at start-up",
    )
    migration_database_url: str = Field(
        default="",
        validation_alias="STATE_MIGRATION_DATABASE_URL",
        description="libpq URL for migrations and start-up checks, straight to PostgreSQL "
        "when DATABASE_URL goes through a pooler; empty: DATABASE_URL",
    )
    migration_lock_timeout_seconds: float = Field(
        default=60.0,
        validation_alias="STATE_MIGRATION_LOCK_TIMEOUT_SECONDS",
        ge=0.1,
        description="how long start-up waits for the migration lock (another replica "
        "migrating) before it exits",
    )
    db_prepared_statements: OnOff = Field(
        default="on",
        validation_alias="STATE_DB_PREPARED_STATEMENTS",
        description="on: server-side prepared statements (psycopg prepares a statement on "
        "its 5th use); off: none, for a transaction pooler without them (PgBouncer < 1.21)",
    )
    retention_days: float = Field(
        default=0.0,
        validation_alias="STATE_RETENTION_DAYS",
        ge=0,
        description="delete conversations untouched this long; 0 keeps them forever",
    )
    retention_interval_seconds: float = Field(
        default=3600.0,
        validation_alias="STATE_RETENTION_INTERVAL_SECONDS",
        ge=0.1,
        description="how often the retention sweep runs (it also deletes conversations past "
        "their own time to live)",
    )
    allow_list_all_users: OnOff = Field(
        default="off",
        validation_alias="STATE_ALLOW_LIST_ALL_USERS",
        description="on: ListConversations with all_users lists every user's conversations "
        "(an operator's ability); off: PERMISSION_DENIED",
    )
    erase_batch_conversations: int = Field(
        default=100,
        validation_alias="STATE_ERASE_BATCH_CONVERSATIONS",
        ge=1,
        le=10_000,
        description="EraseUser: conversations (with everything they own) per transaction",
    )
    erase_pause_seconds: float = Field(
        default=0.005,
        validation_alias="STATE_ERASE_PAUSE_SECONDS",
        ge=0,
        description="EraseUser: pause between batches, so other users' calls keep the database",
    )
    erase_batch_rows: int = Field(
        default=500,
        validation_alias="STATE_ERASE_BATCH_ROWS",
        ge=1,
        description="EraseUser: rows per transaction, about: each batch takes as many "
        "conversations as the last batch's held that many rows (at most "
        "STATE_ERASE_BATCH_CONVERSATIONS; the first batch is one conversation)",
    )
    erase_duty_cycle: float = Field(
        default=0.33,
        validation_alias="STATE_ERASE_DUTY_CYCLE",
        gt=0,
        le=1,
        description="EraseUser: the share of its time the erase spends in batches; after a "
        "batch of t seconds in the database it pauses t * (1 - duty) / duty (at least "
        "STATE_ERASE_PAUSE_SECONDS, at most a quarter of STATE_ERASE_STALE_SECONDS); 1: only "
        "STATE_ERASE_PAUSE_SECONDS",
    )
    erase_stop_grace_seconds: float = Field(
        default=5.0,
        validation_alias="STATE_ERASE_STOP_GRACE_SECONDS",
        ge=0,
        description="EraseUser: how long the user's running turns get to end after being asked "
        "to stop; a turn still running is erased anyway (its next write is NOT_FOUND)",
    )
    erase_stale_seconds: float = Field(
        default=30.0,
        validation_alias="STATE_ERASE_STALE_SECONDS",
        ge=1,
        description="EraseUser: a running erase silent this long was interrupted, and the next "
        "EraseUser of the user resumes it",
    )

    # ---- transport security and callers (docs/security.md)
    tls_cert_file: str = Field(
        default="",
        validation_alias="STATE_TLS_CERT_FILE",
        description="PEM certificate chain to serve TLS (1.2+) with, reloaded when the file "
        "changes; empty: plaintext (a sidecar on loopback or a unix socket)",
    )
    tls_key_file: str = Field(
        default="",
        validation_alias="STATE_TLS_KEY_FILE",
        description="PEM private key of STATE_TLS_CERT_FILE",
    )
    tls_client_ca_file: str = Field(
        default="",
        validation_alias="STATE_TLS_CLIENT_CA_FILE",
        description="PEM CA bundle: every client must present a certificate it signed "
        "(mTLS; the certificate is the caller's identity); empty: no client certificates",
    )
    policy_file: str = Field(
        default="",
        validation_alias="STATE_POLICY_FILE",
        description="JSON policy saying which caller may call which RPCs for which users "
        "(docs/security.md); everything else is PERMISSION_DENIED; empty: every caller may "
        "do everything (the sidecar)",
    )
    token_issuer: str = Field(
        default="",
        validation_alias="STATE_TOKEN_ISSUER",
        description="service tokens: the required `iss` of the bearer JWTs callers may send "
        "instead of a client certificate; empty: no tokens accepted",
    )
    token_audience: str = Field(
        default="",
        validation_alias="STATE_TOKEN_AUDIENCE",
        description="service tokens: the `aud` they must carry",
    )
    token_jwks_url: str = Field(
        default="",
        validation_alias="STATE_TOKEN_JWKS_URL",
        description="service tokens: the issuer's JWKS URL; or STATE_TOKEN_KEY_FILE",
    )
    token_key_file: str = Field(
        default="",
        validation_alias="STATE_TOKEN_KEY_FILE",
        description="service tokens: a JWKS JSON file or PEM public key; or STATE_TOKEN_JWKS_URL",
    )
    token_caller_claim: str = Field(
        default="sub",
        validation_alias="STATE_TOKEN_CALLER_CLAIM",
        description="service tokens: the claim naming the caller (what the policy matches)",
    )
    encryption: OnOff = Field(
        default="off",
        validation_alias="STATE_ENCRYPTION",
        description="on: payloads are sealed at rest with a data key per user, wrapped by a "
        "key-encryption key from STATE_ENCRYPTION_KEY_FILE (docs/security.md); off: "
        "plaintext, and rows stored sealed are refused",
    )
    encryption_key_file: str = Field(
        default="",
        validation_alias="STATE_ENCRYPTION_KEY_FILE",
        description='STATE_ENCRYPTION=on: JSON {"primary": ID, "keys": {ID: base64 of 32 '
        "bytes}}, the key-encryption keys (read again when it changes: rotation)",
    )
    encryption_erased_file: str = Field(
        default="",
        validation_alias="STATE_ENCRYPTION_ERASED_FILE",
        description="STATE_ENCRYPTION=on: a file, outside the database and its backups, "
        "where erasures list the data keys they destroyed (a restored backup's copy of one "
        "is refused); empty: none",
    )
    encryption_key_cache_size: int = Field(
        default=10_000,
        validation_alias="STATE_ENCRYPTION_KEY_CACHE_SIZE",
        ge=1,
        description="STATE_ENCRYPTION=on: unwrapped data keys kept in memory (users)",
    )
    encryption_key_cache_seconds: float = Field(
        default=60.0,
        validation_alias="STATE_ENCRYPTION_KEY_CACHE_SECONDS",
        ge=0,
        description="STATE_ENCRYPTION=on: how long an unwrapped data key is kept (another "
        "replica's erasure or key rotation is seen within it)",
    )

    @model_validator(mode="after")
    def _database_matches_store(self) -> Self:
        # The store is chosen explicitly: a pod whose DATABASE_URL secret is missing must
        # fail, never start a throwaway database, and a URL is never silently ignored.
        if self.store == "postgres" and not self.database_url:
            raise ValueError(
                "STATE_STORE=postgres needs DATABASE_URL, which is not set; no database is "
                "started in its place (STATE_STORE=embedded runs a local PostgreSQL)"
            )
        if self.store != "postgres" and self.migration_database_url:
            raise ValueError(
                f"STATE_MIGRATION_DATABASE_URL is set but STATE_STORE={self.store} does not "
                "use it: set STATE_STORE=postgres, or unset STATE_MIGRATION_DATABASE_URL"
            )
        if self.workers > 1 and self.store != "postgres":
            raise ValueError(
                f"STATE_WORKERS={self.workers} needs STATE_STORE=postgres: the workers must "
                f"share one database, and STATE_STORE={self.store} is one process's own"
            )
        if self.workers > 1 and self.listen_address.startswith("unix:"):
            raise ValueError(
                f"STATE_WORKERS={self.workers} needs a host:port STATE_LISTEN_ADDRESS: "
                "worker processes share a TCP port, not a unix socket (a sidecar needs one "
                "worker)"
            )
        if self.encryption == "on" and not self.encryption_key_file:
            raise ValueError(
                "STATE_ENCRYPTION=on needs STATE_ENCRYPTION_KEY_FILE, which is not set: "
                "nothing is stored unencrypted in its place (docs/security.md)"
            )
        if self.encryption == "on" and self.store == "memory":
            raise ValueError(
                "STATE_ENCRYPTION=on needs a PostgreSQL store (STATE_STORE=embedded or "
                "postgres): STATE_STORE=memory keeps nothing at rest"
            )
        if self.store != "postgres" and self.database_url:
            raise ValueError(
                f"DATABASE_URL is set but STATE_STORE={self.store} does not use it: "
                "set STATE_STORE=postgres to use that database, or unset DATABASE_URL"
            )
        return self


def erase_settings(settings: StateServiceSettings) -> EraseSettings:
    return EraseSettings(
        batch_conversations=settings.erase_batch_conversations,
        pause_seconds=settings.erase_pause_seconds,
        batch_rows=settings.erase_batch_rows,
        duty_cycle=settings.erase_duty_cycle,
        stop_grace_seconds=settings.erase_stop_grace_seconds,
        stale_seconds=settings.erase_stale_seconds,
    )
