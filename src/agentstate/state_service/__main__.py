"""`agentstate-state`: run the state service or apply its migrations.

    agentstate-state serve     # the gRPC service (default)
    agentstate-state migrate   # apply schema migrations to the configured database and exit
    agentstate-state purge --older-than-days N   # one retention sweep, then exit
    agentstate-state split-states [--batch-size N]   # move states stored whole into rows
                                                     # (migration 11), online, in batches
    agentstate-state health [--ca-file F] [--server-name N]   # exit 0 when it serves
                                                     # (an exec probe for a TLS port)
    agentstate-state erase-user USER   # remove every row of USER, print the receipt
    agentstate-state rotate-keys [--batch-size N]   # rewrap every data key with the key
                                                     # file's primary KEK, online, in batches

Settings come from environment variables: see state_service/config.py and
docs/reference/settings.md.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta

from agentstate.common import telemetry, workers
from agentstate.common.config import ConfigError
from agentstate.common.embedded_postgres import EmbeddedPostgres, EmbeddedPostgresError
from agentstate.state_service.config import StateServiceSettings, erase_settings
from agentstate.state_service.domain import (
    CiphertextRejected,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    StoreUnavailable,
    validate_user_id,
)
from agentstate.state_service.server import (
    LISTEN_SETTING,
    open_store,
    postgres_store,
    purge,
    serve,
)
from agentstate.state_service.servicer.lifecycle import erase_user
from agentstate.state_service.storage.postgres import PostgresStore


async def _with_store(
    settings: StateServiceSettings, work: Callable[[PostgresStore], Awaitable[None]]
) -> None:
    """Open the configured PostgreSQL (STATE_STORE postgres or embedded), run `work`.

    On the embedded store: the server a running state service started in the data
    directory, if there is one (the commands are safe online), else one of our own,
    stopped again when the work is done."""
    if settings.store == "memory":
        raise ConfigError("STATE_STORE=memory has no database to migrate or purge")
    embedded = None
    dsn = settings.database_url
    if settings.store == "embedded":
        candidate = EmbeddedPostgres(settings.embedded_pg_dir, settings.embedded_pg_engine)
        running = candidate.running()
        if running is not None:
            dsn = running.dsn
        else:
            embedded = candidate
            dsn = embedded.start()
    store = postgres_store(settings, dsn, min_size=1, max_size=1, migrate=True)
    try:
        await open_store(store)
        await work(store)
    finally:
        await store.close()
        if embedded is not None:
            embedded.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="agentstate-state",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "command",
        nargs="?",
        default="serve",
        choices=[
            "serve",
            "migrate",
            "purge",
            "split-states",
            "health",
            "erase-user",
            "rotate-keys",
        ],
    )
    parser.add_argument("--ca-file", default="", help="health: the CA of a TLS service")
    parser.add_argument(
        "--server-name", default="", help="health: the name in the service's certificate"
    )
    parser.add_argument("user", nargs="?", help="erase-user: the user id to erase")
    parser.add_argument(
        "--older-than-days",
        type=float,
        help="purge: delete conversations untouched for this many days",
    )
    parser.add_argument(
        "--batch-size",
        type=int,
        default=200,
        help="split-states: states per transaction; rotate-keys: data keys per statement",
    )
    args = parser.parse_args(argv)
    if args.command == "purge" and (args.older_than_days is None or args.older_than_days <= 0):
        parser.error("purge needs --older-than-days with a positive number")
    if args.command == "health":
        return _health(args.ca_file, args.server_name)
    if (args.command == "erase-user") != (args.user is not None):
        parser.error("erase-user needs a USER (and only erase-user takes one)")
    try:
        # An admin command's output is its answer: its diagnostics only when asked for.
        admin = args.command != "serve"
        # Coalesced: a server writes an audit line per write call (see callers.py).
        telemetry.configure_logging("agentstate-state", quiet=admin, coalesce=not admin)
        # The audit trail is kept even by a quiet admin command (its purge, say).
        logging.getLogger("agentstate.audit").setLevel(logging.INFO)
        settings = StateServiceSettings.from_env()
        telemetry.configure_from_env("agentstate-state")
        if args.command == "migrate":

            async def migrated(store: PostgresStore) -> None:
                print("schema is up to date")

            asyncio.run(_with_store(settings, migrated))
        elif args.command == "split-states":

            async def split(store: PostgresStore) -> None:
                count = await store.split_whole_states(batch_size=args.batch_size, pause=0.01)
                print(f"split {count} states stored whole into rows; none is left")

            asyncio.run(_with_store(settings, split))
        elif args.command == "rotate-keys":

            async def rotated(store: PostgresStore) -> None:
                count = await store.rotate_data_keys(batch_size=args.batch_size, pause=0.01)
                assert store.encryption.kms is not None
                primary = store.encryption.kms.primary_id()
                left = {k: n for k, n in (await store.data_keys_by_kek()).items() if k != primary}
                print(f"rewrapped {count} data keys with key-encryption key {primary!r}")
                if left:
                    others = ", ".join(f"{k!r}: {n}" for k, n in sorted(left.items()))
                    print(f"still wrapped by other keys (written meanwhile; run again): {others}")
                else:
                    print("no data key is wrapped by another key: the others can be removed")

            if settings.encryption != "on":
                raise ConfigError("rotate-keys needs STATE_ENCRYPTION=on")
            asyncio.run(_with_store(settings, rotated))
        elif args.command == "purge":
            before = datetime.now(UTC) - timedelta(days=args.older_than_days)

            async def purged(store: PostgresStore) -> None:
                counts = await purge(store, before, by="agentstate-state purge")
                print(
                    f"deleted {counts.conversations} conversations untouched since "
                    f"{before.isoformat()} ({counts.messages} messages, {counts.states} states)"
                )

            asyncio.run(_with_store(settings, purged))
        elif args.command == "erase-user":
            user_id = validate_user_id(args.user)
            # The audit line is written even when the command's diagnostics are quiet.
            logging.getLogger("agentstate.audit").setLevel(logging.INFO)

            async def erased(store: PostgresStore) -> None:
                receipt = await erase_user(store, user_id, erase_settings(settings))
                print(f"erased: receipt {receipt.erasure_id}")
                print(f"started {receipt.start_time.isoformat()}")
                if receipt.end_time is not None:
                    print(f"ended {receipt.end_time.isoformat()}")
                for kind, count in receipt.counts.items():
                    print(f"{kind} {count}")

            asyncio.run(_with_store(settings, erased))
        elif settings.workers > 1 and workers.worker_index() is None:
            # The supervisor: the workers are this command again, one process each.
            return workers.supervise(
                settings.workers,
                settings.listen_address,
                LISTEN_SETTING,
                os.environ,
                workers.python_module("agentstate.state_service", "serve"),
            )
        else:
            asyncio.run(serve(settings))
    except (ConfigError, EmbeddedPostgresError, StoreUnavailable) as exc:
        print(f"agentstate-state: {exc}", file=sys.stderr)
        return 2
    except (NotFound, FailedPrecondition, InvalidArgument, CiphertextRejected) as exc:  # refusals
        print(f"agentstate-state: {exc}", file=sys.stderr)
        return 2
    finally:
        telemetry.shutdown()
    return 0


def _health(ca_file: str, server_name: str) -> int:
    """No logging or telemetry set-up: a probe runs every few seconds."""
    from agentstate.state_service.health_probe import check

    try:
        serving, seen = check(StateServiceSettings.from_env(), ca_file, server_name)
    except ConfigError as exc:
        print(f"agentstate-state: {exc}", file=sys.stderr)
        return 2
    print(seen)
    return 0 if serving else 1


if __name__ == "__main__":
    sys.exit(main())
