"""Data lifecycle (issue 23): erasing a user, and a listing page against the user's size.

    .venv/bin/python -m bench.lifecycle [--conversations 10000] [--records 20] [--erase-rounds 3]
                                        [--sizes 1000,10000,100000,1000000] [--pages 100]
                                        [--variant NAME:KEY=VALUE,...]...
                                        [--json bench/lifecycle-DATE.json]

A real state-service process (`python -m agentstate.state_service`, STATE_STORE=postgres)
on its own embedded PostgreSQL (a temporary directory); every number is a gRPC call to it
over 127.0.0.1, from this process:

- **erase**: a user with `--conversations` conversations of `--records` message records
  each (and a state per conversation) is erased by one EraseUser call, with the service's
  default settings (see docs/reference/settings.md, STATE_ERASE_*). Meanwhile another
  user's GetState runs in a closed loop against the same process; its p50/p99 is compared
  with the same loop without the erase, measured before and after it (so a drift of the
  machine's load shows). `--erase-rounds` erases (each of a new user) show the spread.
  `--variant NAME:KEY=VALUE,...` (repeatable): one more service process per variant, on
  the same database, with those settings (e.g. `old:STATE_ERASE_DUTY_CYCLE=1`); each round
  erases once through every variant, the order alternating round by round, so a change in
  the machine's load falls on every variant alike. Without it, one service, the defaults.
- **list**: for users with each of `--sizes` conversations (labelled, half of them with an
  `adk:shop:` key, one in a hundred with a failed last turn), the p50/p99 of
  ListConversations with a page of 50: the first page, a page deep in the listing (by page
  token), by key prefix, by label selector, FAILED only, and the first page with
  include_total (counted up to 10,000).

Rows are loaded with generate_series (INSERT ... SELECT), not through the API, so that the
sizes are reachable in minutes. Prints tables and `uptime`, and writes them as JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import statistics
import subprocess
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import grpc
import psycopg

from agentstate.common.embedded_postgres import EmbeddedPostgres
from agentstate.dev.processes import ServiceProcess
from agentstate.state.v1 import state_service_pb2 as pb
from agentstate.state.v1 import state_service_pb2_grpc as pb_grpc
from agentstate.state_service.storage.postgres import PostgresStore


def load_user(dsn: str, user_id: str, conversations: int, records: int) -> None:
    """`conversations` conversations with `records` records and one state each; with no
    records, every hundredth conversation gets one ERROR record (a failed last turn)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            """
            INSERT INTO t_conversation (user_id, title, external_key, labels)
            SELECT %(u)s, 'chat ' || n,
                   CASE WHEN n %% 2 = 0 THEN 'adk:shop:' || n ELSE 'other:' || n END,
                   jsonb_build_object('team', CASE WHEN n %% 10 = 0 THEN 'ops' ELSE 'shop' END)
            FROM generate_series(1, %(n)s) AS n
            """,
            {"u": user_id, "n": conversations},
        )
        conn.execute(
            """
            INSERT INTO t_agent_message (user_id, conversation_id, role, blocks, status)
            SELECT c.user_id, c.id, 'USER', '[{"type": "text", "text": "hello there"}]',
                   'NORMAL'
            FROM t_conversation AS c, generate_series(1, %(r)s)
            WHERE c.user_id = %(u)s
            """,
            {"u": user_id, "r": records},
        )
        if records == 0:
            conn.execute(
                """
                INSERT INTO t_agent_message (user_id, conversation_id, role, blocks, status)
                SELECT user_id, id, 'ASSISTANT', '[]', 'ERROR'
                FROM t_conversation WHERE user_id = %(u)s AND id %% 100 = 0
                """,
                {"u": user_id},
            )
        conn.execute(
            """
            INSERT INTO t_agent_state (user_id, session_id, state_key, payload, version)
            SELECT user_id, id, 'agent_state', '{"context": [], "cur_iter": 1}', 1
            FROM t_conversation WHERE user_id = %(u)s
            """,
            {"u": user_id},
        )
        # As autovacuum would, in time: without it the erased users' dead rows stay in the
        # tables, and with few live rows left the planner reads them with a sequential scan.
        conn.execute("VACUUM ANALYZE")


def quantiles(samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples)
    return {
        "p50_ms": round(statistics.median(ordered), 3),
        "p99_ms": round(ordered[max(0, int(len(ordered) * 0.99) - 1)], 3),
        "calls": len(ordered),
    }


def uptime() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True, check=False).stdout.strip()


async def get_state_loop(
    stub: pb_grpc.StateServiceAsyncStub, user_id: str, cid: str, stop: asyncio.Event
) -> list[float]:
    samples = []
    request = pb.GetStateRequest(user_id=user_id, conversation_id=cid, state_key="agent_state")
    while not stop.is_set():
        started = time.perf_counter()
        await stub.GetState(request, timeout=10)
        samples.append((time.perf_counter() - started) * 1000)
    return samples


async def timed_loop(
    stub: pb_grpc.StateServiceAsyncStub, user_id: str, cid: str, seconds: float
) -> list[float]:
    stop = asyncio.Event()
    task = asyncio.create_task(get_state_loop(stub, user_id, cid, stop))
    await asyncio.sleep(seconds)
    stop.set()
    return await task


async def bench_erase(
    dsn: str,
    stub: pb_grpc.StateServiceAsyncStub,
    conversations: int,
    records: int,
    n: int,
    variant: str = "default",
) -> dict[str, Any]:
    erased = f"erased-{n}-{variant}"
    load_user(dsn, erased, conversations, records)
    page = await stub.ListConversations(
        pb.ListConversationsRequest(user_id="bystander", page_size=1)
    )
    cid = page.conversations[0].conversation_id
    await timed_loop(stub, "bystander", cid, 1)  # warm the service's connections
    before = await timed_loop(stub, "bystander", cid, 5)

    stop = asyncio.Event()
    task = asyncio.create_task(get_state_loop(stub, "bystander", cid, stop))
    started = time.perf_counter()
    response = await stub.EraseUser(pb.EraseUserRequest(user_id=erased), timeout=600)
    took = time.perf_counter() - started
    stop.set()
    during = await task
    after = await timed_loop(stub, "bystander", cid, 5)
    result: dict[str, Any] = {
        "round": n,
        "variant": variant,
        "conversations": conversations,
        "records_per_conversation": records,
        "erase_seconds": round(took, 2),
        "receipt_counts": dict(response.receipt.counts),
        "bystander_get_state_before": quantiles(before),
        "bystander_get_state_during": quantiles(during),
        "bystander_get_state_after": quantiles(after),
    }
    print(
        f"\n## erase {n} ({variant}) over gRPC: {conversations} conversations x {records} records"
    )
    print(f"EraseUser took {took:.1f} s; receipt counts: {result['receipt_counts']}")
    print("| bystander GetState (gRPC) | p50 ms | p99 ms | calls |")
    print("|---|---|---|---|")
    for name in ("before", "during", "after"):
        q = result[f"bystander_get_state_{name}"]
        print(f"| {name} the erase | {q['p50_ms']:.2f} | {q['p99_ms']:.2f} | {q['calls']} |")
    ratio = result["bystander_get_state_during"]["p99_ms"] / max(
        result["bystander_get_state_before"]["p99_ms"], 1e-9
    )
    result["p99_during_over_before"] = round(ratio, 2)
    print(f"p99 during / before: {ratio:.2f}x", flush=True)
    return result


LISTINGS = ("first page", "deep page", "key prefix", "label selector", "FAILED", "with total")


async def bench_list(
    dsn: str, stub: pb_grpc.StateServiceAsyncStub, sizes: list[int], pages: int
) -> list[dict[str, Any]]:
    results = []
    print("\n## list over gRPC: page of 50, p50 / p99 ms")
    print("| conversations | " + " | ".join(LISTINGS) + " | load s |")
    print("|---" * (len(LISTINGS) + 2) + "|")
    for size in sizes:
        user = f"lister-{size}"
        started = time.perf_counter()
        load_user(dsn, user, size, 0)
        loaded = time.perf_counter() - started
        # A token deep in the listing: the id at 90% of the way.
        with psycopg.connect(dsn) as conn:
            row = conn.execute(
                "SELECT id FROM t_conversation WHERE user_id = %s ORDER BY id DESC "
                "OFFSET %s LIMIT 1",
                (user, int(size * 0.9)),
            ).fetchone()
        assert row is not None
        requests = {
            "first page": pb.ListConversationsRequest(user_id=user, page_size=50),
            "deep page": pb.ListConversationsRequest(
                user_id=user, page_size=50, page_token=str(row[0])
            ),
            "key prefix": pb.ListConversationsRequest(
                user_id=user, page_size=50, key_prefix="adk:shop:"
            ),
            "label selector": pb.ListConversationsRequest(
                user_id=user, page_size=50, label_selector="team=ops"
            ),
            "FAILED": pb.ListConversationsRequest(
                user_id=user, page_size=50, statuses=[pb.CONVERSATION_STATUS_FAILED]
            ),
            "with total": pb.ListConversationsRequest(
                user_id=user, page_size=50, include_total=True
            ),
        }
        row_result: dict[str, Any] = {"conversations": size, "load_seconds": round(loaded, 1)}
        for name in LISTINGS:  # plans cached, untimed
            response = await stub.ListConversations(requests[name], timeout=60)
            assert response.conversations, name
        # Interleaved: call k of every kind runs back to back, so a burst of load on the
        # (shared) machine falls on every column alike.
        samples: dict[str, list[float]] = {name: [] for name in LISTINGS}
        last: dict[str, pb.ListConversationsResponse] = {}
        for _ in range(pages):
            for name in LISTINGS:
                t0 = time.perf_counter()
                last[name] = await stub.ListConversations(requests[name], timeout=60)
                samples[name].append((time.perf_counter() - t0) * 1000)
        cells = []
        for name in LISTINGS:
            q: dict[str, Any] = dict(quantiles(samples[name]))
            if name == "with total":
                q["total_count"] = last[name].total_count
            row_result[name] = q
            cells.append(f"{q['p50_ms']:.2f} / {q['p99_ms']:.2f}")
        results.append(row_result)
        print(f"| {size:,} | " + " | ".join(cells) + f" | {loaded:.0f} |", flush=True)
    return results


async def run(dsn: str, addresses: dict[str, str], args: argparse.Namespace) -> dict[str, Any]:
    out: dict[str, Any] = {"uptime_start": uptime()}
    channels = {name: grpc.aio.insecure_channel(a) for name, a in addresses.items()}
    try:
        stubs: dict[str, pb_grpc.StateServiceAsyncStub] = {
            name: pb_grpc.StateServiceStub(channel) for name, channel in channels.items()
        }
        load_user(dsn, "bystander", 10, 5)
        out["erase"] = []
        names = list(stubs)
        for n in range(1, args.erase_rounds + 1):
            # Interleaved: every variant once a round, the order reversed every other round.
            for name in names if n % 2 else names[::-1]:
                if args.conversations:
                    out["erase"].append(
                        await bench_erase(
                            dsn, stubs[name], args.conversations, args.records, n, name
                        )
                    )
        out["uptime_after_erase"] = uptime()
        sizes = [int(s) for s in args.sizes.split(",") if s]
        out["list"] = await bench_list(dsn, stubs[names[0]], sizes, args.pages)
    finally:
        for channel in channels.values():
            await channel.close(None)
    out["uptime_end"] = uptime()
    return out


def parse_variant(text: str) -> tuple[str, dict[str, str]]:
    """`NAME:KEY=VALUE,KEY=VALUE` (the settings may be empty: `NAME:`)."""
    name, _, settings = text.partition(":")
    env = dict(item.split("=", 1) for item in settings.split(",") if item)
    return name, env


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--conversations", type=int, default=10_000, help="0: no erase")
    parser.add_argument("--records", type=int, default=20)
    parser.add_argument("--erase-rounds", type=int, default=3, help="erases, each of a new user")
    parser.add_argument("--sizes", default="1000,10000,100000,1000000")
    parser.add_argument("--pages", type=int, default=100)
    parser.add_argument(
        "--variant",
        action="append",
        default=[],
        help="NAME:KEY=VALUE,... one more service with these settings (repeatable)",
    )
    parser.add_argument("--json", default="", help="also write the results here")
    args = parser.parse_args()
    variants = dict(parse_variant(v) for v in args.variant) or {"default": {}}
    print(uptime())
    root = Path(tempfile.mkdtemp(prefix="agentstate-lifecycle-"))
    root.chmod(0o755)  # the postgres user must reach the data directory
    pg = EmbeddedPostgres(root / "pgdata")
    dsn = pg.start()
    services: dict[str, ServiceProcess] = {}
    try:
        asyncio.run(_migrate(dsn))
        base = {
            "STATE_LISTEN_ADDRESS": "127.0.0.1:0",
            "STATE_STORE": "postgres",
            "DATABASE_URL": dsn,
        }
        for name, env in variants.items():
            services[name] = ServiceProcess("agentstate.state_service", {**base, **env})
        addresses = {name: service.wait_ready() for name, service in services.items()}
        results = asyncio.run(run(dsn, addresses, args))
        results["variants"] = variants
    finally:
        for service in services.values():
            service.terminate()
        pg.stop()
        shutil.rmtree(root, ignore_errors=True)
    print(results["uptime_end"])
    if args.json:
        results["command"] = (
            "python -m bench.lifecycle "
            + " ".join(
                f"--{k.replace('_', '-')} {v}"
                for k, v in vars(args).items()
                if k not in ("json", "variant")
            )
            + "".join(f" --variant {v}" for v in args.variant)
        )
        results["date"] = datetime.now(UTC).isoformat(timespec="seconds")
        results["note"] = (
            "shared machine: 2 cores shared with other builds, tests and benchmarks; "
            "a real state-service process per variant over gRPC on 127.0.0.1; take ratios, "
            "not values"
        )
        Path(args.json).write_text(json.dumps(results, indent=2) + "\n")


async def _migrate(dsn: str) -> None:
    store = PostgresStore(dsn, min_size=1, max_size=1)  # opening it migrates
    await store.open()
    await store.close()


if __name__ == "__main__":
    main()
