"""`agentstate-state`: run the state service or apply its migrations.

    agentstate-state serve     # the gRPC service (default)
    agentstate-state migrate   # apply schema migrations to DATABASE_URL and exit

Settings come from environment variables: see state_service/config.py and README.
"""

from __future__ import annotations

import argparse
import asyncio
import sys

from agentstate.common import telemetry
from agentstate.common.config import ConfigError
from agentstate.common.embedded_postgres import EmbeddedPostgres, EmbeddedPostgresError
from state_service.config import StateServiceSettings
from state_service.domain import StoreUnavailable
from state_service.server import serve
from state_service.storage.postgres import PostgresStore


async def _migrate(settings: StateServiceSettings) -> None:
    embedded = None
    dsn = settings.database_url
    if not dsn:
        embedded = EmbeddedPostgres(settings.embedded_pg_dir, settings.embedded_pg_engine)
        dsn = embedded.start()
    store = PostgresStore(
        dsn, min_size=1, max_size=1, connect_timeout=settings.connect_timeout_seconds
    )
    try:
        await store.open()
        print("schema is up to date")
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
    parser.add_argument("command", nargs="?", default="serve", choices=["serve", "migrate"])
    args = parser.parse_args(argv)
    telemetry.configure_logging("agentstate-state")
    try:
        settings = StateServiceSettings.from_env()
        telemetry.configure_from_env("agentstate-state")
        if args.command == "migrate":
            asyncio.run(_migrate(settings))
        else:
            asyncio.run(serve(settings))
    except (ConfigError, EmbeddedPostgresError, StoreUnavailable) as exc:
        print(f"agentstate-state: {exc}", file=sys.stderr)
        return 2
    finally:
        telemetry.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
