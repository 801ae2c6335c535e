"""Small states against the anchors (issue 26 items 1, 2 and 5), in one run on one PostgreSQL.

    .venv/bin/pip install -e '.[bench]'      # LangGraph's saver
    .venv/bin/python -m bench.small_state [--sizes 8,64,512] [--calls 300] [--seconds 2]
        [--slices 4] [--before SRC] [--json bench/small-state-….json]

One embedded PostgreSQL 15 (fsync on), one database per contender. Every part
interleaves its contenders (shuffled rounds of one call each, or alternating slices), so a
change in the machine's load hits them alike: compare the ratios, not the milliseconds.

1. save, one caller, in-process: a plain JSONB upsert of the same state with
   compare-and-set (`INSERT ... ON CONFLICT DO UPDATE ... WHERE version = expected`,
   psycopg, prepared) against the state service's own `PostgresStore.save_state`, a whole
   state with compare-and-set, and a delta (drop 4, append 4, the rest of the state).
2. turns per second at `--concurrency` callers over gRPC, the runtime's turn: BeginTurn
   with `cached_version` (lease, two records, no payload) + EndTurn with a delta (drop 4,
   append 4, fields_json; a record update, the lease released), against LangGraph's
   `AsyncPostgresSaver` shared by the callers (`aget_tuple` + `aput` of the state).
   The state service's CPU time (/proc/PID/stat utime + stime, the process's every
   thread) over our slices, divided by the calls it served: CPU per call. `--before SRC`
   adds the state service of another checkout's src/ (PYTHONPATH) as a third contender;
   `--floor` a bare gRPC server (a process answering the same RPCs with fixed responses:
   the floor of CPU per call in Python gRPC), the same bare server behind the state
   service's guards (identity, policy, audit line, admission, request decoding; with
   `--before`, also behind before's), and our service on its in-memory store (the same
   service without psycopg and PostgreSQL).
3. storage: `--conversations` conversations grown by 32 turns of 4 messages (delta
   EndTurns, 8 sessions at a time) to 128 messages: live bytes per conversation
   (pg_column_size of the state's rows) against the state's JSON size; then 200 more
   turns each adding 2 messages (as bench.delta_turns): WAL bytes per turn, and the state
   tables' relation bytes (heap, TOAST, indexes; autovacuum as configured) against live.
   Those 200 turns take this bench seconds, a user hours: with PostgreSQL's naptime of
   60 s autovacuum runs at most once in between, so `--autovacuum-naptime 1` shows the
   relations as vacuum keeps them when turns are spread out (report both).
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import os
import random
import shutil
import statistics
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import grpc
import psycopg
from psycopg_pool import AsyncConnectionPool

from agentstate.common.embedded_postgres import EmbeddedPostgres
from agentstate.dev.processes import ServiceProcess
from agentstate.state.v1 import state_service_pb2 as pb
from agentstate.state.v1 import state_service_pb2_grpc as pb_grpc
from agentstate.state_service.domain import StateDelta
from agentstate.state_service.storage.postgres import PostgresStore
from bench.delta_turns import Conversation, _new_messages
from bench.state_compare import (
    ANCHOR_TABLE,
    ANCHOR_UPSERT,
    POOL_SIZE,
    LangGraph,
    _database,
    _langgraph,
    _scratch_dir,
    _service,
)
from bench.state_latency import grown_state

USER = "bench"


@dataclass
class Row:
    part: str
    messages: int
    contender: str
    metric: str
    value: float


@dataclass
class Results:
    rows: list[Row] = field(default_factory=list)

    def add(self, part: str, messages: int, contender: str, metric: str, value: float) -> None:
        self.rows.append(Row(part, messages, contender, metric, value))
        print(f"  {part:<8} N={messages:<4} {contender:<22} {metric:<28} {value:10.3f}", flush=True)

    def get(self, part: str, messages: int, contender: str, metric: str) -> float:
        for r in self.rows:
            if (r.part, r.messages, r.contender, r.metric) == (part, messages, contender, metric):
                return r.value
        return float("nan")


def _encode(value: Any) -> bytes:
    return json.dumps(value, ensure_ascii=False).encode()


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


# ------------------------------------------------------------------ 1. in-process saves


class InProcessDelta:
    """A conversation of the in-process store kept at N messages by delta saves."""

    def __init__(self, store: PostgresStore, cid: int, state: dict[str, Any]) -> None:
        self.store, self.cid, self.state = store, cid, state
        self.version = 0
        self.turn = 0

    async def save(self) -> None:
        added = _new_messages(self.turn, 4)
        self.turn += 1
        self.state = dict(self.state, context=self.state["context"][4:] + added)
        fields = {k: v for k, v in self.state.items() if k != "context"}
        result = await self.store.save_state(
            user_id=USER,
            conversation_id=self.cid,
            state_key="agent_state",
            payload=None,
            expected_version=None,
            delta=StateDelta(
                base_version=self.version,
                drop_head=4,
                messages=tuple(_encode(m) for m in added),
                fields_json=_encode(fields),
            ),
            max_state_bytes=64 * 1024 * 1024,
        )
        self.version = result.version


async def saves(
    store: PostgresStore, anchor: AsyncConnectionPool[Any], sizes: list[int], calls: int
) -> list[Row]:
    results = Results()
    for n in sizes:
        await _saves_at(store, anchor, n, calls, results)
    return results.rows


async def _saves_at(
    store: PostgresStore, anchor: AsyncConnectionPool[Any], n: int, calls: int, results: Results
) -> None:
    state = grown_state(n)
    payload = _encode(state)
    conversation = await store.create_conversation(user_id=USER, title="bench")
    cid = conversation.conversation_id
    whole_version = (
        await store.save_state(
            user_id=USER,
            conversation_id=cid,
            state_key="agent_state",
            payload=payload,
            expected_version=0,
        )
    ).version
    other = await store.create_conversation(user_id=USER, title="bench")
    delta = InProcessDelta(store, other.conversation_id, state)
    first = await store.save_state(
        user_id=USER,
        conversation_id=delta.cid,
        state_key="agent_state",
        payload=payload,
        expected_version=0,
    )
    delta.version = first.version
    anchor_version = 0
    session = random.randrange(1 << 40)

    async def plain() -> None:
        nonlocal anchor_version
        async with anchor.connection() as conn:
            cur = await conn.execute(
                ANCHOR_UPSERT,
                {"user_id": USER, "session_id": session, "payload": payload.decode(),
                 "expected": anchor_version},
            )  # fmt: skip
            row = await cur.fetchone()
            assert row is not None
            anchor_version = int(row[0])

    async def whole() -> None:
        nonlocal whole_version
        result = await store.save_state(
            user_id=USER,
            conversation_id=cid,
            state_key="agent_state",
            payload=payload,
            expected_version=whole_version,
        )
        whole_version = result.version

    contenders: dict[str, Callable[[], Awaitable[None]]] = {
        "plain JSONB upsert": plain,
        "ours, whole (CAS)": whole,
        "ours, delta": delta.save,
    }
    samples: dict[str, list[float]] = {name: [] for name in contenders}
    rounds = calls if n <= 64 else max(60, calls // 3)
    for i in range(rounds + 20):
        order = list(contenders.items())
        random.shuffle(order)
        for name, fn in order:
            started = time.perf_counter()
            await fn()
            if i >= 20:  # warm-up: connections, prepared statements
                samples[name].append((time.perf_counter() - started) * 1000)
    for name, values in samples.items():
        results.add("save", n, name, "p50 ms", statistics.median(values))
    base = statistics.median(samples["plain JSONB upsert"])
    for name in ("ours, whole (CAS)", "ours, delta"):
        results.add("save", n, name, "x plain JSONB", statistics.median(samples[name]) / base)
    results.add("save", n, "state", "bytes", len(payload))


# ------------------------------------------------------------------ 2. turns per second


async def turns(
    services: dict[str, tuple[Any, int]],
    langgraph: LangGraph | None,
    sizes: list[int],
    concurrency: int,
    seconds: float,
    slices: int,
) -> list[Row]:
    """services: name -> (stub, pid)."""
    results = Results()
    for n in sizes:
        await _turns_at(services, langgraph, n, concurrency, seconds, slices, results)
    return results.rows


async def _turns_at(
    services: dict[str, tuple[Any, int]],
    langgraph: LangGraph | None,
    n: int,
    concurrency: int,
    seconds: float,
    slices: int,
    results: Results,
) -> None:
    ours: dict[str, list[Conversation]] = {}
    for name, (stub, _pid) in services.items():
        ours[name] = [Conversation(stub, True, grown_state(n)) for _ in range(concurrency)]
        for c in ours[name]:
            await c.create()
    threads = [f"thread-{random.randrange(1 << 60)}" for _ in range(concurrency)]
    state = grown_state(n)
    done: dict[str, int] = dict.fromkeys([*services, "langgraph"], 0)
    spent: dict[str, float] = dict.fromkeys(done, 0.0)
    cpu: dict[str, float] = dict.fromkeys(services, 0.0)

    async def slice_of(name: str, one: Callable[[int], Awaitable[object]]) -> None:
        deadline = time.perf_counter() + seconds
        count = 0

        async def loop(session: int) -> None:
            nonlocal count
            while time.perf_counter() < deadline:
                await one(session)
                count += 1

        started = time.perf_counter()
        await asyncio.gather(*(loop(s) for s in range(concurrency)))
        spent[name] += time.perf_counter() - started
        done[name] += count

    def ours_turn(name: str) -> Callable[[int], Awaitable[object]]:
        async def one(session: int) -> None:
            c = ours[name][session]
            await c.turn(_new_messages(c.version, 4), drop=4)

        return one

    async def theirs(session: int) -> None:
        assert langgraph is not None
        await langgraph.turn(session, threads[session], state)

    for warm in range(concurrency):  # one turn each: connections, prepared statements
        for name in services:
            await ours_turn(name)(warm)
        if langgraph is not None:
            await theirs(warm)
    for _ in range(slices):
        order: list[str] = [*services] + (["langgraph"] if langgraph else [])
        random.shuffle(order)
        for name in order:
            if name == "langgraph":
                await slice_of(name, theirs)
                continue
            pid = services[name][1]
            before = _cpu_seconds(pid)
            await slice_of(name, ours_turn(name))
            cpu[name] += _cpu_seconds(pid) - before
    for name in done:
        if name == "langgraph" and langgraph is None:
            continue
        rate = done[name] / spent[name]
        results.add("turns", n, name, f"turns/s c={concurrency}", rate)
    for name in services:
        results.add("turns", n, name, "CPU ms per call", cpu[name] * 1000 / (2 * done[name]))
        if langgraph is not None:
            results.add(
                "turns", n, name, "x LangGraph shared",
                (done[name] / spent[name]) / (done["langgraph"] / spent["langgraph"]),
            )  # fmt: skip


# ------------------------------------------------------- the floor: gRPC alone


class _Bare(pb_grpc.StateServiceServicer):
    """The state service's turn RPCs answered with fixed responses, nothing else: what
    Python gRPC (grpc.aio, protobuf) costs a call in a process of its own."""

    def __init__(self) -> None:
        self.version = 0

    async def CreateConversation(self, request: Any, context: Any) -> Any:
        return pb.CreateConversationResponse(conversation=pb.Conversation(conversation_id="1"))

    async def UpsertState(self, request: Any, context: Any) -> Any:
        self.version += 1
        return pb.UpsertStateResponse(version=self.version)

    async def BeginTurn(self, request: Any, context: Any) -> Any:
        return pb.BeginTurnResponse(
            lease=pb.Lease(task_id="7"),
            messages=[pb.MessageRecord(message_id="1"), pb.MessageRecord(message_id="2")],
            version=self.version,
            payload_omitted=True,
        )

    async def EndTurn(self, request: Any, context: Any) -> Any:
        self.version += 1
        return pb.EndTurnResponse(version=self.version, lease_released=True)


def _has_guards(src: str) -> bool:
    """Whether the code in `src` has the guards _serve_bare puts in front (code older than
    admission control has not)."""
    return "def admission_of" in Path(src, "agentstate/state_service/server.py").read_text()


async def _serve_bare(guards: bool = False) -> None:
    """`guards`: behind the state service's own guards (identity, policy and audit,
    admission, request decoding; agentstate.common.grpc_server), its audit line written
    to stderr as the service writes it: what they cost a call."""
    server = grpc.aio.server()
    if guards:
        from agentstate.common import telemetry
        from agentstate.common.grpc_server import create_server
        from agentstate.state_service.config import StateServiceSettings
        from agentstate.state_service.server import admission_of, caller_interceptor

        telemetry.configure_logging("agentstate-state", coalesce=True)
        settings = StateServiceSettings.from_env()
        server = create_server(
            max_message_bytes=settings.grpc_max_message_bytes,
            interceptors=[caller_interceptor(settings)],
            admission=admission_of(settings),
        )
    pb_grpc.add_StateServiceServicer_to_server(_Bare(), server)  # type: ignore[abstract]
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    print(f"listening on 127.0.0.1:{port}", flush=True)
    await server.wait_for_termination()


# ------------------------------------------------------------------------ 3. storage


_LIVE = """
SELECT (SELECT coalesce(sum(pg_column_size(s.*)), 0) FROM t_agent_state AS s
        WHERE s.session_id = ANY(%(ids)s))
     + (SELECT coalesce(sum(pg_column_size(m.*)), 0) FROM t_agent_state_message AS m
        WHERE m.session_id = ANY(%(ids)s))
"""
_PARTS = """
SELECT c.relname, pg_relation_size(c.oid) AS heap,
       coalesce(pg_total_relation_size(c.reltoastrelid), 0) AS toast,
       pg_indexes_size(c.oid) AS indexes, s.n_live_tup, s.n_dead_tup
FROM pg_class AS c JOIN pg_stat_user_tables AS s ON s.relid = c.oid
WHERE c.relname IN ('t_agent_state', 't_agent_state_message')
ORDER BY c.relname
"""
_WAL = "SELECT pg_current_wal_lsn() - '0/0'::pg_lsn"
_RELATIONS = """
SELECT sum(pg_total_relation_size(c.oid)) FROM pg_class AS c
WHERE c.relname IN ('t_agent_state', 't_agent_state_message') AND c.relkind = 'r'
"""


async def storage(name: str, stub: Any, dsn: str, conversations: int) -> list[Row]:
    results = Results()
    states = [Conversation(stub, True, grown_state(0)) for _ in range(conversations)]
    for c in states:
        await c.create()

    async def run_turns(count: int, drop: int, add: int = 4) -> None:
        async def one(c: Conversation) -> None:
            for _ in range(count):
                await c.turn(_new_messages(c.version, add), drop=drop)

        for start in range(0, len(states), 8):  # 8 sessions at a time
            await asyncio.gather(*(one(c) for c in states[start : start + 8]))

    async def measure() -> tuple[float, float, float]:
        size = 0
        for c in states:
            got = await stub.GetState(pb.GetStateRequest(user_id=USER, conversation_id=c.cid))
            size += len(got.payload)
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
            ids = {"ids": [int(c.cid) for c in states]}
            live = int((await (await conn.execute(_LIVE, ids)).fetchone() or [0])[0])
            relations = int((await (await conn.execute(_RELATIONS)).fetchone() or [0])[0])
        return size / conversations, live / conversations, relations / conversations

    await run_turns(32, 0, 4)
    size, live, _ = await measure()
    n = len(states[0].state["context"])
    results.add("storage", n, name, "state JSON KB", size / 1024)
    results.add("storage", n, name, "live KB", live / 1024)
    results.add("storage", n, name, "live / JSON", live / size)
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        wal_before = int((await (await conn.execute(_WAL)).fetchone() or [0])[0])
    await run_turns(200, 0, 2)
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        wal = int((await (await conn.execute(_WAL)).fetchone() or [0])[0]) - wal_before
    size, live, relations = await measure()
    n = len(states[0].state["context"])
    results.add("storage", n, name, "WAL bytes per turn (+2)", wal / (200 * len(states)))
    results.add("storage", n, name, "after 200: live KB", live / 1024)
    results.add("storage", n, name, "after 200: relations KB", relations / 1024)
    results.add("storage", n, name, "after 200: relations/live", relations / live)
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        for row in await (await conn.execute(_PARTS)).fetchall():
            table, *sizes, _live_rows, dead_rows = row
            for part, value in zip(("heap", "TOAST", "indexes"), sizes, strict=True):
                results.add("storage", n, name, f"{table} {part} KB", value / conversations / 1024)
            results.add("storage", n, name, f"{table} dead rows", dead_rows / conversations)
    return results.rows


# --------------------------------------------------------------------------- run


async def run(args: argparse.Namespace) -> list[Row]:
    sizes = [int(s) for s in args.sizes.split(",")]
    root = _scratch_dir()
    server = EmbeddedPostgres(root / "pgdata")
    server.start()
    if args.autovacuum_naptime:
        with psycopg.connect(server.dsn, autocommit=True) as conn:
            conn.execute(f"ALTER SYSTEM SET autovacuum_naptime = '{args.autovacuum_naptime:g}s'")
            conn.execute("SELECT pg_reload_conf()")
    processes = []
    closers: list[Callable[[], Awaitable[object]]] = []
    rows: list[Row] = []
    try:
        dsns = {"ours": _database(server, "ours")}
        if args.before:
            dsns["before"] = _database(server, "before")
        services: dict[str, tuple[Any, int]] = {}
        for name, dsn in dsns.items():
            process = _service(dsn, args.before if name == "before" else None)
            processes.append(process)
            channel = grpc.aio.insecure_channel(process.wait_ready())
            closers.append(functools.partial(channel.close, None))
            services[name] = (pb_grpc.StateServiceStub(channel), process.proc.pid)
        if args.floor:
            bare = ServiceProcess("bench.small_state", {"PYTHONPATH": "."}, "--bare-server")
            processes.append(bare)
            channel = grpc.aio.insecure_channel(bare.wait_ready())
            closers.append(functools.partial(channel.close, None))
            floor = {"gRPC alone": (pb_grpc.StateServiceStub(channel), bare.proc.pid)}
            # The same fixed answers behind our guards (and before's, with --before).
            guarded = {"gRPC + our guards": "."}
            if args.before and _has_guards(args.before):
                guarded["gRPC + before's guards"] = f"{args.before}:."
            for name, path in guarded.items():
                process = ServiceProcess(
                    "bench.small_state", {"PYTHONPATH": path}, "--bare-server", "--guards"
                )
                processes.append(process)
                channel = grpc.aio.insecure_channel(process.wait_ready())
                closers.append(functools.partial(channel.close, None))
                floor[name] = (pb_grpc.StateServiceStub(channel), process.proc.pid)
            memory = ServiceProcess(
                "agentstate.state_service",
                {"STATE_LISTEN_ADDRESS": "127.0.0.1:0", "STATE_STORE": "memory"},
            )
            processes.append(memory)
            channel = grpc.aio.insecure_channel(memory.wait_ready())
            closers.append(functools.partial(channel.close, None))
            floor["ours, memory store"] = (pb_grpc.StateServiceStub(channel), memory.proc.pid)
        # First, so the state tables hold only its conversations.
        if "storage" in args.parts:
            for name, (stub, _pid) in services.items():
                rows += await storage(name, stub, dsns[name], args.conversations)
        if "save" in args.parts:
            store = PostgresStore(
                _database(server, "in_process"), min_size=POOL_SIZE, max_size=POOL_SIZE
            )
            await store.open()
            closers.append(store.close)
            anchor_dsn = _database(server, "anchor")
            with psycopg.connect(anchor_dsn, autocommit=True) as conn:
                conn.execute(ANCHOR_TABLE)
            anchor: AsyncConnectionPool[Any] = AsyncConnectionPool(
                anchor_dsn, min_size=POOL_SIZE, max_size=POOL_SIZE, open=False,
                kwargs={"autocommit": True},
            )  # fmt: skip
            await anchor.open(wait=True)
            closers.append(anchor.close)
            rows += await saves(store, anchor, sizes, args.calls)
        if "turns" in args.parts:
            langgraph = None
            if not args.no_langgraph:
                made = await _langgraph(_database(server, "langgraph"), args.concurrency, closers)
                langgraph = made[0]  # the shared saver, one checkpoint per turn
            contenders = services | (floor if args.floor else {})
            rows += await turns(
                contenders, langgraph, sizes, args.concurrency, args.seconds, args.slices
            )
        return rows
    finally:
        for close in reversed(closers):
            await close()
        for process in processes:
            process.terminate()
        server.stop()
        shutil.rmtree(root, ignore_errors=True)


def print_table(rows: list[Row]) -> None:
    print("\n| part | N | contender | metric | value |\n|---|---:|---|---|---:|")
    for r in rows:
        print(f"| {r.part} | {r.messages} | {r.contender} | {r.metric} | {r.value:.3f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="8,64,512", help="AgentState sizes in messages")
    parser.add_argument("--parts", default="save,turns,storage")
    parser.add_argument("--calls", type=int, default=300, help="rounds per save cell")
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=2.0, help="per throughput slice")
    parser.add_argument("--slices", type=int, default=4, help="slices per contender")
    parser.add_argument("--conversations", type=int, default=20)
    parser.add_argument("--before", help="another checkout's src/: its state service too")
    parser.add_argument(
        "--autovacuum-naptime",
        type=float,
        default=0,
        help="seconds between autovacuum runs (0: PostgreSQL's 60); the storage part's "
        "200 turns take about 20 s here, far less than they take a user, so autovacuum "
        "passes that real time would give them happen only with a short naptime",
    )
    parser.add_argument("--no-langgraph", action="store_true")
    parser.add_argument(
        "--floor", action="store_true", help="add a bare gRPC server answering the turn RPCs"
    )
    parser.add_argument("--bare-server", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--guards", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--json", type=Path, help="write the results as JSON")
    parser.add_argument("--replot", type=Path, help="print an earlier --json, measure nothing")
    args = parser.parse_args()
    if args.bare_server:
        asyncio.run(_serve_bare(args.guards))
        return
    if args.replot:
        print_table([Row(**r) for r in json.loads(args.replot.read_text())["rows"]])
        return
    print(f"{os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f}", flush=True)
    rows = asyncio.run(run(args))
    print_table(rows)
    if args.json:
        args.json.write_text(
            json.dumps({"load_average": os.getloadavg(), "rows": [asdict(r) for r in rows]},
                       indent=1)
        )  # fmt: skip


if __name__ == "__main__":
    main()
