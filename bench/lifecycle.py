"""Data lifecycle (issue 23): erasing a user, and a listing page against the user's size.

    .venv/bin/python -m bench.lifecycle [--conversations 10000] [--records 20]
                                        [--sizes 1000,10000,100000] [--pages 200]

On its own embedded PostgreSQL (a temporary directory), through PostgresStore in this
process (no gRPC: the numbers are the store's):

- **erase**: a user with `--conversations` conversations of `--records` message records
  each (and a state per conversation) is erased with the default settings (100
  conversations per batch, 5 ms between batches). Meanwhile another user's GetState runs in
  a closed loop; its p50/p99 is compared with the same loop without the erase.
- **list**: for users with each of `--sizes` conversations (labelled, half of them with an
  `adk:shop:` key), the p50/p99 of a first page (50, newest first) and of a page deep in the
  listing (by page token), unfiltered, by key prefix and by label selector.

Rows are loaded with generate_series (INSERT ... SELECT), not through the API, so that the
sizes are reachable in minutes. Prints tables (and `uptime`).
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import psycopg

from agentstate.common.embedded_postgres import EmbeddedPostgres
from agentstate.state_service import domain as d
from agentstate.state_service.storage.base.lifecycle import EraseSettings
from agentstate.state_service.storage.postgres import PostgresStore


def load_user(dsn: str, user_id: str, conversations: int, records: int) -> None:
    """`conversations` conversations with `records` records and one state each."""
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
        conn.execute(
            """
            INSERT INTO t_agent_state (user_id, session_id, state_key, payload, version)
            SELECT user_id, id, 'agent_state', '{"context": [], "cur_iter": 1}', 1
            FROM t_conversation WHERE user_id = %(u)s
            """,
            {"u": user_id},
        )
        conn.execute("ANALYZE")


def quantiles(samples: list[float]) -> tuple[float, float]:
    ordered = sorted(samples)
    return statistics.median(ordered), ordered[max(0, int(len(ordered) * 0.99) - 1)]


async def get_state_loop(
    store: PostgresStore, user_id: str, cid: int, stop: asyncio.Event
) -> list[float]:
    samples = []
    while not stop.is_set():
        started = time.perf_counter()
        await store.get_state(user_id=user_id, conversation_id=cid, state_key="agent_state")
        samples.append((time.perf_counter() - started) * 1000)
    return samples


async def bench_erase(dsn: str, conversations: int, records: int) -> None:
    load_user(dsn, "erased", conversations, records)
    load_user(dsn, "bystander", 10, 5)
    store = PostgresStore(dsn, min_size=2, max_size=4)
    await store.open()
    try:
        page = await store.list_conversations(user_id="bystander", page_size=1, before_id=None)
        cid = page.items[0].conversation_id
        stop = asyncio.Event()
        task = asyncio.create_task(get_state_loop(store, "bystander", cid, stop))
        await asyncio.sleep(5)
        stop.set()
        alone = await task

        stop = asyncio.Event()
        task = asyncio.create_task(get_state_loop(store, "bystander", cid, stop))
        started = time.perf_counter()
        receipt = await store.erase_user(user_id="erased", settings=EraseSettings())
        took = time.perf_counter() - started
        stop.set()
        during = await task
    finally:
        await store.close()
    a50, a99 = quantiles(alone)
    d50, d99 = quantiles(during)
    print(f"\n## erase: {conversations} conversations x {records} records")
    print(f"erase took {took:.1f} s; receipt counts: {dict(receipt.counts)}")
    print("| bystander GetState | p50 ms | p99 ms | calls |")
    print("|---|---|---|---|")
    print(f"| without the erase | {a50:.2f} | {a99:.2f} | {len(alone)} |")
    print(f"| during the erase | {d50:.2f} | {d99:.2f} | {len(during)} |")


async def bench_list(dsn: str, sizes: list[int], pages: int) -> None:
    store = PostgresStore(dsn, min_size=1, max_size=2)
    await store.open()
    print("\n## list: page of 50, p50 / p99 ms")
    print("| conversations | first page | deep page | key prefix | label selector |")
    print("|---|---|---|---|---|")
    try:
        for size in sizes:
            user = f"lister-{size}"
            load_user(dsn, user, size, 0)
            # A token deep in the listing: the id at 90% of the way.
            with psycopg.connect(dsn) as conn:
                row = conn.execute(
                    "SELECT id FROM t_conversation WHERE user_id = %s ORDER BY id DESC "
                    "OFFSET %s LIMIT 1",
                    (user, int(size * 0.9)),
                ).fetchone()
            assert row is not None
            deep = int(row[0])
            results = []
            for before, where in (
                (None, d.ConversationFilter(user_id=user)),
                (deep, d.ConversationFilter(user_id=user)),
                (None, d.ConversationFilter(user_id=user, key_prefix="adk:shop:")),
                (
                    None,
                    d.ConversationFilter(user_id=user, selector=d.parse_label_selector("team=ops")),
                ),
            ):
                samples = []
                for _ in range(pages):
                    started = time.perf_counter()
                    await store.search_conversations(where=where, page_size=50, before_id=before)
                    samples.append((time.perf_counter() - started) * 1000)
                p50, p99 = quantiles(samples)
                results.append(f"{p50:.2f} / {p99:.2f}")
            print(f"| {size:,} | " + " | ".join(results) + " |")
    finally:
        await store.close()


async def run(dsn: str, args: argparse.Namespace) -> None:
    migrate = PostgresStore(dsn, min_size=1, max_size=1)  # opening it migrates
    await migrate.open()
    await migrate.close()
    await bench_erase(dsn, args.conversations, args.records)
    await bench_list(dsn, [int(s) for s in args.sizes.split(",")], args.pages)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--conversations", type=int, default=10_000)
    parser.add_argument("--records", type=int, default=20)
    parser.add_argument("--sizes", default="1000,10000,100000")
    parser.add_argument("--pages", type=int, default=200)
    args = parser.parse_args()
    print(subprocess.run(["uptime"], capture_output=True, text=True, check=False).stdout)
    root = Path(tempfile.mkdtemp(prefix="agentstate-lifecycle-"))
    root.chmod(0o755)  # the postgres user must reach the data directory
    pg = EmbeddedPostgres(root / "pgdata")
    dsn = pg.start()
    try:
        asyncio.run(run(dsn, args))
    finally:
        pg.stop()
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
