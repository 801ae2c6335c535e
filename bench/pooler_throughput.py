"""Turns per second behind PgBouncer (transaction mode) beside direct connections.

Both set-ups get the same number of PostgreSQL server connections (`--server-conns`):

- direct: `--processes` state-service processes, each with a pool of
  server-conns / processes connections straight to PostgreSQL (prepared statements on,
  the default), plus each process's idle watcher connection (one SELECT 1 a second);
- pooled: the same processes, each with a pool of `--sidecar-pool` connections to one
  PgBouncer whose server pool is server-conns (prepared statements off, as Debian's
  PgBouncer 1.18 requires); the watchers go through PgBouncer too;
- direct, prepared statements off: to tell the cost of the pooler's hop from the cost of
  not preparing.

`--callers` concurrent callers run whole turns (BeginTurn + EndTurn with a record
settled, on conversations of their own) for `--seconds` per set-up, after a warm-up.
The order of the set-ups rotates over `--rounds` so a drifting machine load hits each.

    .venv/bin/python -m bench.pooler_throughput [--seconds 15] [--rounds 2]

Needs the system's PostgreSQL binaries and Debian's pgbouncer (scripts/install_pgbouncer.sh).
Target: pooled >= 0.8x direct.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import grpc
import psycopg

from agentstate.common.embedded_postgres import EmbeddedPostgres
from agentstate.dev.pgbouncer import PgBouncer
from agentstate.dev.processes import ServiceProcess
from agentstate.state.v1 import state_service_pb2 as pb
from agentstate.state.v1 import state_service_pb2_grpc as pb_grpc

DB = "agentstate_bench_pooler"
REPLY = pb.NewMessage(role=pb.MESSAGE_ROLE_ASSISTANT, status=pb.MESSAGE_STATUS_STREAMING)
QUESTION = pb.NewMessage(
    role=pb.MESSAGE_ROLE_USER, blocks_json=b'[{"type":"text","text":"how is my order?"}]'
)
STATE = (
    b'{"messages": [' + b",".join([b'{"role": "user", "text": "' + b"x" * 300 + b'"}'] * 8) + b"]}"
)


async def turns(address_list: list[str], callers: int, seconds: float) -> tuple[float, float]:
    """(turns per second, p50 ms) of `callers` running turns for `seconds`."""
    channels = [grpc.aio.insecure_channel(a) for a in address_list]
    stubs = [pb_grpc.StateServiceStub(c) for c in channels]
    latencies: list[float] = []
    stop_at = 0.0

    async def caller(me: int) -> None:
        stub = stubs[me % len(stubs)]
        cid = ""
        while time.monotonic() < stop_at:
            start = time.perf_counter()
            begun = await stub.BeginTurn(
                pb.BeginTurnRequest(
                    user_id=f"bench-{me}",
                    conversation_id=cid,
                    holder="bench",
                    ttl_ms=10_000,
                    new_messages=[QUESTION, REPLY],
                ),
                timeout=30,
            )
            cid = begun.conversation.conversation_id
            await stub.EndTurn(
                pb.EndTurnRequest(
                    user_id=f"bench-{me}",
                    conversation_id=cid,
                    task_id=begun.lease.task_id,
                    payload=STATE,
                    expected_version=begun.version,
                    message_writes=[
                        pb.MessageWrite(
                            update=pb.MessageUpdate(
                                message_id=begun.messages[1].message_id,
                                status=pb.MESSAGE_STATUS_NORMAL,
                            )
                        )
                    ],
                ),
                timeout=30,
            )
            latencies.append((time.perf_counter() - start) * 1000)

    stop_at = time.monotonic() + 2.0  # warm-up: connections, plans, caches
    await asyncio.gather(*(caller(i) for i in range(callers)))
    latencies.clear()
    started = time.monotonic()
    stop_at = started + seconds
    await asyncio.gather(*(caller(i) for i in range(callers)))
    elapsed = time.monotonic() - started
    for channel in channels:
        await channel.close(None)
    return len(latencies) / elapsed, statistics.median(latencies)


def start_processes(env: dict[str, str], count: int) -> list[ServiceProcess]:
    first = ServiceProcess("agentstate.state_service", env, "serve")
    first.wait_ready(120)
    rest = [ServiceProcess("agentstate.state_service", env, "serve") for _ in range(count - 1)]
    for p in rest:
        p.wait_ready(120)
    return [first, *rest]


POOLED_ROLE = "bench_pooled"  # PgBouncer's server connections log in as this role


def server_connections(dsn: str, pooled: bool) -> int:
    """The set-up's server connections: PgBouncer's, or the processes' own (not this one)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = %s AND pid <> pg_backend_pid()"
            " AND (usename = %s) = %s",
            (DB, POOLED_ROLE, pooled),
        ).fetchone()
        return int(row[0]) if row else 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--processes", type=int, default=4)
    parser.add_argument("--server-conns", type=int, default=8)
    parser.add_argument("--sidecar-pool", type=int, default=8)
    parser.add_argument("--callers", type=int, default=32)
    parser.add_argument("--seconds", type=float, default=15.0)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    per_process = max(1, args.server_conns // args.processes)

    root = Path(tempfile.mkdtemp(prefix="agentstate-bench-pooler-", dir="/var/tmp"))
    root.chmod(0o755)
    server = EmbeddedPostgres(root / "pgdata")
    dsn = server.start()
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {DB} WITH (FORCE)")
        conn.execute(f"CREATE DATABASE {DB}")
        conn.execute(f"CREATE ROLE {POOLED_ROLE} LOGIN SUPERUSER")
    direct = dsn.replace("dbname=postgres", f"dbname={DB}")
    bouncer = PgBouncer(dsn, DB, pool_size=args.server_conns, server_user=POOLED_ROLE)
    bouncer.start()
    common = {"STATE_STORE": "postgres", "STATE_LISTEN_ADDRESS": "127.0.0.1:0"}
    setups = {
        "direct, prepared on": {
            **common,
            "DATABASE_URL": direct,
            "STATE_DB_POOL_MIN_SIZE": str(per_process),
            "STATE_DB_POOL_MAX_SIZE": str(per_process),
        },
        "direct, prepared off": {
            **common,
            "DATABASE_URL": direct,
            "STATE_DB_POOL_MIN_SIZE": str(per_process),
            "STATE_DB_POOL_MAX_SIZE": str(per_process),
            "STATE_DB_PREPARED_STATEMENTS": "off",
        },
        "PgBouncer (transaction), prepared off": {
            **common,
            "DATABASE_URL": bouncer.url,
            "STATE_MIGRATION_DATABASE_URL": direct,
            "STATE_DB_POOL_MIN_SIZE": str(args.sidecar_pool),
            "STATE_DB_POOL_MAX_SIZE": str(args.sidecar_pool),
            "STATE_DB_PREPARED_STATEMENTS": "off",
        },
    }
    results: dict[str, list[tuple[float, float, int]]] = {name: [] for name in setups}
    names = list(setups)
    try:
        for round_ in range(args.rounds):
            for name in names[round_ % len(names) :] + names[: round_ % len(names)]:
                processes = start_processes(setups[name], args.processes)
                try:
                    addresses = [p.wait_ready() for p in processes]
                    rate, p50 = asyncio.run(turns(addresses, args.callers, args.seconds))
                    conns = server_connections(dsn, pooled="PgBouncer" in name)
                finally:
                    for p in processes:
                        p.terminate()
                results[name].append((rate, p50, conns))
                print(
                    f"round {round_ + 1}: {name}: {rate:.0f} turns/s, p50 {p50:.1f} ms, "
                    f"{conns} server connections",
                    flush=True,
                )
    finally:
        bouncer.close()
        server.stop()
        shutil.rmtree(root, ignore_errors=True)

    base = statistics.mean(r for r, _, _ in results["direct, prepared on"])
    print()
    print(
        f"{args.processes} processes, {args.callers} callers, {args.server_conns} server "
        f"connections in every set-up, {args.seconds:g}s x {args.rounds} rounds"
    )
    print("| set-up | sidecar pool | server connections | turns/s | p50 turn (ms) | vs direct |")
    print("|---|---|---|---|---|---|")
    for name, rows in results.items():
        rate = statistics.mean(r for r, _, _ in rows)
        p50 = statistics.mean(p for _, p, _ in rows)
        conns = max(c for _, _, c in rows)
        pool = args.sidecar_pool if "PgBouncer" in name else per_process
        print(f"| {name} | {pool} | {conns} | {rate:.0f} | {p50:.1f} | {rate / base:.2f}x |")


if __name__ == "__main__":
    main()
