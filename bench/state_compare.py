"""Side by side, in one run on one PostgreSQL: the state service over gRPC, the same
SQL in-process, and LangGraph's AsyncPostgresSaver.

    .venv/bin/pip install -e '.[bench]'      # LangGraph's saver and matplotlib
    .venv/bin/python -m bench.state_compare [--sizes 8,64,512] [--concurrency 1,8,32]
        [--seconds 3] [--calls 300] [--before SRC] [--plots docs/img] [--json results.json]

- gRPC: the state service as its own process (`python -m state_service`, pool of 10),
  called from this process with the asyncio gRPC client.
- in-process: `PostgresStore` (the state service's own storage class, the same SQL and
  pool size) called directly from this process: what the service costs on top of it.
- LangGraph: one `AsyncPostgresSaver` over a pool of 10 shared by every session (as an
  application shares its checkpointer; the saver serialises its calls with a lock), a turn
  being `aget_tuple` + `aput` of a checkpoint whose one channel holds the same state: the
  least a turn can cost it. `langgraph (shared, per step)` checkpoints the way LangGraph's
  agent loop does, after each of the example's 5 steps (`aput_writes` + `aput`);
  `langgraph (per session)` gives every session a saver (and connection) of its own.

Part 1, latency (one caller): GetState and a compare-and-set UpsertState of an
N-message AgentState (the source's 8-message example repeated), for ours and for two
anchors: a plain JSONB row in this process (a SELECT; an upsert with compare-and-set) and
LangGraph's shared saver (`aget_tuple`; `aput`). Over gRPC also EndTurn, the runtime's
turn: BeginTurn with `cached_version`, then EndTurn with a delta (drop 4, append 4),
EndTurn timed. `--before SRC` adds the state service of another checkout's src/
(PYTHONPATH) as `gRPC before`, in parts 1 and 2. Part 2, throughput:
`c` sessions, each running turns on its own conversation for `--seconds`. Our turn is
BeginTurn (lease, two records, state) + EndTurn (state with compare-and-set, a record
update, lease release): everything a real turn costs; LangGraph's has no lease and no
records. Ratios are taken within the run. PostgreSQL keeps fsync on.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import os
import shutil
import statistics
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import grpc
import psycopg

from agentstate.common.embedded_postgres import EmbeddedPostgres
from agentstate.dev.processes import ServiceProcess
from agentstate.state.v1 import state_service_pb2 as pb
from agentstate.state.v1 import state_service_pb2_grpc as pb_grpc
from agentstate.state_service.domain import (
    MessageRole,
    MessageStatus,
    MessageUpdate,
    NewMessage,
    TurnStart,
)
from agentstate.state_service.storage.postgres import PostgresStore
from bench.state_latency import grown_state

POOL_SIZE = 10
USER = "bench"
ANCHOR_TABLE = """
CREATE TABLE IF NOT EXISTS anchor_state (
    user_id text NOT NULL, session_id bigint NOT NULL, state_key text NOT NULL,
    payload jsonb NOT NULL, version bigint NOT NULL,
    update_time timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (user_id, session_id, state_key))
"""
ANCHOR_SELECT = """
SELECT payload::text, version FROM anchor_state
WHERE user_id = %(user_id)s AND session_id = %(session_id)s AND state_key = 'agent_state'
"""
# Compare-and-set: a row at another version is left as it is and nothing is returned.
ANCHOR_UPSERT = """
INSERT INTO anchor_state AS s (user_id, session_id, state_key, payload, version)
VALUES (%(user_id)s, %(session_id)s, 'agent_state', %(payload)s::jsonb, 1)
ON CONFLICT (user_id, session_id, state_key) DO UPDATE
SET payload = EXCLUDED.payload, version = s.version + 1, update_time = now()
WHERE s.version = %(expected)s
RETURNING s.version
"""
QUESTION_BLOCKS = json.dumps([{"type": "text", "text": "我的订单88235现在什么状态？"}]).encode()
REPLY_BLOCKS = json.dumps([{"type": "text", "text": "订单88235目前是已支付待发货。"}]).encode()


@dataclass
class Latency:
    op: str
    messages: int
    payload_bytes: int
    contender: str
    p50_ms: float
    p90_ms: float
    p99_ms: float


@dataclass
class Throughput:
    messages: int
    concurrency: int
    contender: str
    turns_per_s: float
    p50_turn_ms: float


# ------------------------------------------------------------------ contenders


class Ours:
    """Our turn and calls, through gRPC or in-process: the same operations either way."""

    def __init__(self, name: str) -> None:
        self.name = name

    async def new_conversation(self) -> str:
        raise NotImplementedError

    async def get(self, cid: str) -> None:
        raise NotImplementedError

    async def upsert(self, cid: str, payload: bytes, version: int) -> int:
        raise NotImplementedError

    async def turn(self, cid: str, payload: bytes, version: int) -> int:
        raise NotImplementedError


class OverGrpc(Ours):
    def __init__(self, stub: pb_grpc.StateServiceAsyncStub, name: str = "gRPC") -> None:
        super().__init__(name)
        self.stub = stub

    async def new_conversation(self) -> str:
        response = await self.stub.CreateConversation(pb.CreateConversationRequest(user_id=USER))
        return response.conversation.conversation_id

    async def get(self, cid: str) -> None:
        await self.stub.GetState(pb.GetStateRequest(user_id=USER, conversation_id=cid))

    async def upsert(self, cid: str, payload: bytes, version: int) -> int:
        request = pb.UpsertStateRequest(user_id=USER, conversation_id=cid, payload=payload)
        request.expected_version = version
        return int((await self.stub.UpsertState(request)).version)

    async def turn(self, cid: str, payload: bytes, version: int) -> int:
        begun = await self.stub.BeginTurn(
            pb.BeginTurnRequest(
                user_id=USER,
                conversation_id=cid,
                holder="bench",
                ttl_ms=60_000,
                require_none_awaiting=True,
                new_messages=[
                    pb.NewMessage(role=pb.MESSAGE_ROLE_USER, blocks_json=QUESTION_BLOCKS),
                    pb.NewMessage(
                        role=pb.MESSAGE_ROLE_ASSISTANT, status=pb.MESSAGE_STATUS_STREAMING
                    ),
                ],
            )
        )
        ended = await self.stub.EndTurn(
            pb.EndTurnRequest(
                user_id=USER,
                conversation_id=cid,
                task_id=begun.lease.task_id,
                payload=payload,
                expected_version=begun.version,
                message_writes=[
                    pb.MessageWrite(
                        update=pb.MessageUpdate(
                            message_id=begun.messages[1].message_id,
                            status=pb.MESSAGE_STATUS_NORMAL,
                            blocks_json=REPLY_BLOCKS,
                        )
                    )
                ],
            )
        )
        return int(ended.version)


class InProcess(Ours):
    def __init__(self, store: PostgresStore) -> None:
        super().__init__("in-process")
        self.store = store
        self.start = TurnStart(
            holder="bench",
            ttl_ms=60_000,
            new_messages=(
                NewMessage(MessageRole.USER, QUESTION_BLOCKS),
                NewMessage(MessageRole.ASSISTANT, status=MessageStatus.STREAMING),
            ),
        )

    async def new_conversation(self) -> str:
        conversation = await self.store.create_conversation(user_id=USER, title="bench")
        return str(conversation.conversation_id)

    async def get(self, cid: str) -> None:
        await self.store.get_state(user_id=USER, conversation_id=int(cid), state_key="agent_state")

    async def upsert(self, cid: str, payload: bytes, version: int) -> int:
        result = await self.store.save_state(
            user_id=USER,
            conversation_id=int(cid),
            state_key="agent_state",
            payload=payload,
            expected_version=version,
        )
        return result.version

    async def turn(self, cid: str, payload: bytes, version: int) -> int:
        begun = await self.store.begin_turn(
            user_id=USER, conversation_id=int(cid), start=self.start
        )
        ended = await self.store.save_state(
            user_id=USER,
            conversation_id=int(cid),
            state_key="agent_state",
            payload=payload,
            expected_version=begun.state.version if begun.state else 0,
            task_id=begun.lease.task_id,
            message_writes=[
                MessageUpdate(
                    begun.messages[1].message_id,
                    status=MessageStatus.NORMAL,
                    blocks_json=REPLY_BLOCKS,
                )
            ],
        )
        return ended.version


class PlainJsonb(Ours):
    """The anchor of the latency part: the state as one JSONB row, read with a SELECT and
    saved with a compare-and-set upsert (psycopg, prepared, in this process). It has no
    turn (no lease, no records)."""

    def __init__(self, pool: Any) -> None:
        super().__init__("plain JSONB")
        self.pool = pool
        self.sessions = 0

    async def new_conversation(self) -> str:
        self.sessions += 1
        return str(self.sessions)

    async def get(self, cid: str) -> None:
        async with self.pool.connection() as conn:
            cur = await conn.execute(ANCHOR_SELECT, {"user_id": USER, "session_id": int(cid)})
            await cur.fetchone()

    async def upsert(self, cid: str, payload: bytes, version: int) -> int:
        async with self.pool.connection() as conn:
            cur = await conn.execute(
                ANCHOR_UPSERT,
                {"user_id": USER, "session_id": int(cid), "payload": payload.decode(),
                 "expected": version},
            )  # fmt: skip
            row = await cur.fetchone()
            assert row is not None, "the anchor's compare-and-set refused its own version"
            return int(row[0])


class LangGraphCalls(Ours):
    """LangGraph's shared AsyncPostgresSaver in the latency part: GetState is `aget_tuple`
    of the thread's latest checkpoint, UpsertState an `aput` of a checkpoint whose one
    channel holds the state (its own compare-and-set is none: it appends)."""

    def __init__(self, saver: Any) -> None:
        super().__init__("LangGraph")
        self.saver = saver
        self.parents: dict[str, Any] = {}

    async def new_conversation(self) -> str:
        thread = f"thread-{uuid.uuid4()}"
        self.parents[thread] = {"configurable": {"thread_id": thread, "checkpoint_ns": ""}}
        return thread

    async def get(self, cid: str) -> None:
        await self.saver.aget_tuple({"configurable": {"thread_id": cid, "checkpoint_ns": ""}})

    async def upsert(self, cid: str, payload: bytes, version: int) -> int:
        self.parents[cid], _ = await _put_state(
            self.saver, self.parents[cid], version or None, json.loads(payload), version
        )
        return version + 1


async def _put_state(
    saver: Any, parent: Any, current: Any, state: dict[str, Any], step: int
) -> tuple[Any, Any]:
    """A checkpoint after `parent` whose one channel holds `state` (`aput`): its config
    and the channel's version (the next after `current`)."""
    from langgraph.checkpoint.base import empty_checkpoint

    checkpoint = empty_checkpoint()
    version = saver.get_next_version(current, None)
    checkpoint["channel_values"] = {"state": state}
    checkpoint["channel_versions"] = {"state": version}
    config = await saver.aput(
        parent, checkpoint, {"source": "loop", "step": step}, {"state": version}
    )
    return config, version


class LangGraph:
    """LangGraph's AsyncPostgresSaver: a turn loads the latest checkpoint, then saves
    `steps` checkpoints. With steps=1 that is the least a turn can cost it (one save per
    turn, as we do); LangGraph's own agent loop checkpoints after every step (each model
    call and each tool node), and the source's example Chat turn is 5 steps, each saving
    the node's writes and a checkpoint with the whole message list (`steps=5`)."""

    def __init__(self, name: str, saver_for: Callable[[int], Any], steps: int = 1) -> None:
        self.name = name
        self.saver_for = saver_for  # session number -> saver
        self.steps = steps

    async def turn(self, session: int, thread: str, state: dict[str, Any]) -> None:
        saver = self.saver_for(session)
        config: dict[str, Any] = {"configurable": {"thread_id": thread, "checkpoint_ns": ""}}
        latest = await saver.aget_tuple(config)
        current = latest.checkpoint["channel_versions"].get("state") if latest else None
        parent = latest.config if latest else config
        for step in range(self.steps):
            parent, current = await _put_state(saver, parent, current, state, step)
            if self.steps > 1:  # the next node's output, recorded against this checkpoint
                await saver.aput_writes(
                    parent, [("state", state["context"][-1])], task_id=f"step-{step}"
                )


# --------------------------------------------------------------------- measuring


def _percentiles(samples: list[float]) -> tuple[float, float, float]:
    q = statistics.quantiles(samples, n=100, method="inclusive")
    return statistics.median(samples), q[89], q[98]


async def _timed(calls: int, fn: Callable[[], Awaitable[object]]) -> list[float]:
    for _ in range(min(30, calls)):  # connections, prepared statements
        await fn()
    samples = []
    for _ in range(calls):
        start = time.perf_counter()
        await fn()
        samples.append((time.perf_counter() - start) * 1000)
    return samples


async def latency(contenders: list[Ours], sizes: list[int], calls: int) -> list[Latency]:
    """GetState and UpsertState p50 of every contender; EndTurn's of those over gRPC."""
    from bench.delta_turns import Conversation  # (delta_turns imports this module)

    rows = []
    for messages in sizes:
        state = grown_state(messages)
        payload = json.dumps(state, ensure_ascii=False).encode()
        n = calls if messages <= 64 else max(60, calls // 3)
        for contender in contenders:
            if isinstance(contender, OverGrpc):
                # The runtime's turn: BeginTurn with cached_version, then EndTurn with a
                # delta (drop the 4 oldest, append 4: the state stays at N); EndTurn timed.
                conversation = Conversation(contender.stub, True, state)
                await conversation.create()
                base = state["context"]
                turn = 0

                async def end_turn(c: Any = conversation, base: list[Any] = base) -> float:
                    nonlocal turn
                    turn += 1
                    added = [dict(base[i % len(base)], id=f"t{turn}-{i}") for i in range(4)]
                    ended: float = (await c.turn(added, drop=4))[1]
                    return ended

                for _ in range(min(30, n)):
                    await end_turn()
                p50, p90, p99 = _percentiles([await end_turn() for _ in range(n)])
                rows.append(
                    Latency(
                        "EndTurn (delta)", messages, len(payload), contender.name, p50, p90, p99
                    )
                )
            cid = await contender.new_conversation()
            version = await contender.upsert(cid, payload, 0)

            async def upsert(c: Ours = contender, cid: str = cid, body: bytes = payload) -> None:
                nonlocal version
                version = await c.upsert(cid, body, version)

            async def get(c: Ours = contender, cid: str = cid) -> None:
                await c.get(cid)

            for op, fn in (("GetState", get), ("UpsertState (CAS)", upsert)):
                p50, p90, p99 = _percentiles(await _timed(n, fn))
                rows.append(Latency(op, messages, len(payload), contender.name, p50, p90, p99))
    return rows


async def _sessions(
    concurrency: int, seconds: float, one_turn: Callable[[int], Awaitable[object]]
) -> tuple[float, float]:
    """Run `concurrency` sessions of back-to-back turns; (turns/s, p50 turn ms)."""
    for session in range(concurrency):  # warm-up: one turn each
        await one_turn(session)
    samples: list[float] = []
    deadline = time.perf_counter() + seconds

    async def session_loop(session: int) -> None:
        while time.perf_counter() < deadline:
            start = time.perf_counter()
            await one_turn(session)
            samples.append((time.perf_counter() - start) * 1000)

    started = time.perf_counter()
    await asyncio.gather(*(session_loop(s) for s in range(concurrency)))
    elapsed = time.perf_counter() - started
    return len(samples) / elapsed, statistics.median(samples)


async def throughput(
    ours: list[Ours],
    langgraph: list[LangGraph],
    sizes: list[int],
    levels: list[int],
    seconds: float,
) -> list[Throughput]:
    rows = []
    for messages in sizes:
        state = grown_state(messages)
        payload = json.dumps(state, ensure_ascii=False).encode()
        for concurrency in levels:
            for contender in ours:
                cids = [await contender.new_conversation() for _ in range(concurrency)]

                async def our_turn(
                    session: int, c: Ours = contender, cids: list[str] = cids, body: bytes = payload
                ) -> None:
                    await c.turn(cids[session], body, 0)

                rate, p50 = await _sessions(concurrency, seconds, our_turn)
                rows.append(Throughput(messages, concurrency, contender.name, rate, p50))
            for saver in langgraph:
                threads = [f"thread-{uuid.uuid4()}" for _ in range(concurrency)]

                async def lg_turn(
                    session: int,
                    s: LangGraph = saver,
                    threads: list[str] = threads,
                    value: dict[str, Any] = state,
                ) -> None:
                    await s.turn(session, threads[session], value)

                rate, p50 = await _sessions(concurrency, seconds, lg_turn)
                rows.append(Throughput(messages, concurrency, saver.name, rate, p50))
            print(f"  measured N={messages} c={concurrency}", flush=True)
    return rows


# ------------------------------------------------------------------------ output


def print_tables(lat: list[Latency], thr: list[Throughput]) -> None:
    print("\nLatency, one caller (ms)")
    print(f"{'op':<18} {'N':>4} {'bytes':>7} {'contender':<12} {'p50':>6} {'p90':>6} {'p99':>6}")
    for r in lat:
        print(
            f"{r.op:<18} {r.messages:>4} {r.payload_bytes:>7} {r.contender:<12} "
            f"{r.p50_ms:>6.2f} {r.p90_ms:>6.2f} {r.p99_ms:>6.2f}"
        )
    print("\nRatios of gRPC's p50 (EndTurn against the others' save)")
    for n in dict.fromkeys(r.messages for r in lat):
        for op in ("GetState", "UpsertState (CAS)", "EndTurn (delta)"):
            ours = next(
                (r for r in lat if r.op == op and r.messages == n and r.contender == "gRPC"), None
            )
            if ours is None:
                continue
            against = "GetState" if op == "GetState" else "UpsertState (CAS)"
            parts = [
                f"/{r.contender} {ours.p50_ms / r.p50_ms:.2f}x"
                for r in lat
                if r.op == (op if r.contender.startswith("gRPC") else against)
                and r.messages == n
                and r.contender != "gRPC"
            ]
            print(f"{op:<18} N={n:<4} " + "  ".join(parts))

    print("\nTurns per second (p50 turn ms)")
    names = list(dict.fromkeys(r.contender for r in thr))
    print(f"{'N':>4} {'c':>3} " + " ".join(f"{n:>24}" for n in names))
    for n in dict.fromkeys(r.messages for r in thr):
        for c in dict.fromkeys(r.concurrency for r in thr):
            by = {r.contender: r for r in thr if r.messages == n and r.concurrency == c}
            cells = [
                f"{by[name].turns_per_s:>13.0f} ({by[name].p50_turn_ms:>6.1f})"
                if name in by
                else ""
                for name in names
            ]
            print(f"{n:>4} {c:>3} " + " ".join(f"{cell:>24}" for cell in cells))
    print("\nRatios of turns/s")
    for n in dict.fromkeys(r.messages for r in thr):
        for c in dict.fromkeys(r.concurrency for r in thr):
            rate = {
                r.contender: r.turns_per_s for r in thr if r.messages == n and r.concurrency == c
            }
            parts = [f"gRPC/in-process {rate['gRPC'] / rate['in-process']:.2f}x"]
            for name in names:
                if name.startswith("langgraph"):
                    parts.append(f"gRPC/{name} {rate['gRPC'] / rate[name]:.2f}x")
            print(f"N={n:<4} c={c:<3} " + "   ".join(parts))


def plot(lat: list[Latency], thr: list[Throughput], out_dir: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    sizes = list(dict.fromkeys(r.messages for r in lat))
    ops = list(dict.fromkeys(r.op for r in lat))
    fig, axes = plt.subplots(1, len(ops), figsize=(5 * len(ops), 4), squeeze=False)
    for ax, op in zip(axes[0], ops, strict=True):
        for contender in dict.fromkeys(r.contender for r in lat if r.op == op):
            values = [
                next(
                    r.p50_ms
                    for r in lat
                    if r.op == op and r.messages == n and r.contender == contender
                )
                for n in sizes
            ]
            ax.plot(sizes, values, marker="o", label=contender)
        ax.set_xscale("log", base=2)
        ax.set_xticks(sizes, [str(n) for n in sizes])
        ax.set_xlabel("messages in the AgentState")
        ax.set_ylabel("p50 latency, ms")
        ax.set_title(op)
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    path = out_dir / "state_latency.png"
    fig.savefig(path, dpi=110)
    written.append(path)
    plt.close(fig)

    sizes = list(dict.fromkeys(r.messages for r in thr))
    levels = list(dict.fromkeys(r.concurrency for r in thr))
    names = list(dict.fromkeys(r.contender for r in thr))
    fig, axes = plt.subplots(1, len(sizes), figsize=(4 * len(sizes), 4), squeeze=False)
    for ax, n in zip(axes[0], sizes, strict=True):
        width = 0.8 / len(names)
        for i, name in enumerate(names):
            values = [
                next(
                    r.turns_per_s
                    for r in thr
                    if r.messages == n and r.concurrency == c and r.contender == name
                )
                for c in levels
            ]
            ax.bar([x + i * width for x in range(len(levels))], values, width, label=name)
        ax.set_xticks(
            [x + width * (len(names) - 1) / 2 for x in range(len(levels))],
            [f"c={c}" for c in levels],
        )
        ax.set_title(f"{n} messages")
        ax.set_ylabel("turns per second")
        ax.grid(axis="y", alpha=0.3)
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=len(names), fontsize=8)
    fig.tight_layout(rect=(0, 0.08, 1, 1))
    path = out_dir / "turn_throughput.png"
    fig.savefig(path, dpi=110)
    written.append(path)
    plt.close(fig)
    return written


# --------------------------------------------------------------------------- run


def _scratch_dir() -> Path:
    root = Path(tempfile.mkdtemp(prefix="agentstate-compare-"))
    root.chmod(0o755)  # the postgres user must reach the data directory
    return root


def _database(server: EmbeddedPostgres, name: str) -> str:
    with psycopg.connect(server.dsn, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')
    return server.dsn.replace("dbname=postgres", f"dbname={name}")


def _service(dsn: str, src: str | None = None) -> ServiceProcess:
    """The state service as its own process on `dsn`; from another checkout's src/ with
    `src` (PYTHONPATH)."""
    env = {
        "STATE_LISTEN_ADDRESS": "127.0.0.1:0",
        "STATE_STORE": "postgres",
        "DATABASE_URL": dsn,
        "STATE_DB_POOL_MAX_SIZE": str(POOL_SIZE),
        "STATE_MAX_PAYLOAD_BYTES": str(64 * 1024 * 1024),
        "STATE_GRPC_MAX_MESSAGE_BYTES": str(64 * 1024 * 1024),
    }
    if src:
        env["PYTHONPATH"] = src
    return ServiceProcess("agentstate.state_service", env)


async def run(args: argparse.Namespace) -> tuple[list[Latency], list[Throughput]]:
    from psycopg_pool import AsyncConnectionPool

    sizes = [int(s) for s in args.sizes.split(",")]
    levels = [int(c) for c in args.concurrency.split(",")]
    root = _scratch_dir()
    server = EmbeddedPostgres(root / "pgdata")
    server.start()
    services: list[ServiceProcess] = []
    closers: list[Callable[[], Awaitable[object]]] = []
    try:
        ours: list[Ours] = []
        for name, database, src in (
            ("gRPC", "via_grpc", None),
            ("gRPC before", "before", args.before),
        ):
            if name == "gRPC before" and not src:
                continue
            services.append(_service(_database(server, database), src))
            channel = grpc.aio.insecure_channel(services[-1].wait_ready())
            closers.append(functools.partial(channel.close, None))
            ours.append(OverGrpc(pb_grpc.StateServiceStub(channel), name))
        store = PostgresStore(
            _database(server, "in_process"), min_size=POOL_SIZE, max_size=POOL_SIZE
        )
        await store.open()
        closers.append(store.close)
        ours.append(InProcess(store))
        anchor_dsn = _database(server, "anchor")
        with psycopg.connect(anchor_dsn, autocommit=True) as conn:
            conn.execute(ANCHOR_TABLE)
        anchor: AsyncConnectionPool[Any] = AsyncConnectionPool(
            anchor_dsn, min_size=2, max_size=2, kwargs={"autocommit": True}, open=False
        )
        await anchor.open(wait=True)
        closers.append(anchor.close)
        anchors: list[Ours] = [PlainJsonb(anchor)]
        langgraph: list[LangGraph] = []
        if not args.no_langgraph:
            langgraph = await _langgraph(_database(server, "langgraph"), max(levels), closers)
            anchors.append(LangGraphCalls(langgraph[0].saver_for(0)))
        lat = await latency(ours + anchors, sizes, args.calls)
        thr = await throughput(ours, langgraph, sizes, levels, args.seconds)
        return lat, thr
    finally:
        for close in reversed(closers):
            await close()
        for service in services:
            service.terminate()
        server.stop()
        shutil.rmtree(root, ignore_errors=True)


async def _langgraph(
    url: str, sessions: int, closers: list[Callable[[], Awaitable[object]]]
) -> list[LangGraph]:
    from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver
    from psycopg.rows import dict_row
    from psycopg_pool import AsyncConnectionPool

    kwargs = {"autocommit": True, "row_factory": dict_row, "prepare_threshold": 0}
    pool: AsyncConnectionPool[Any] = AsyncConnectionPool(
        url, min_size=POOL_SIZE, max_size=POOL_SIZE, kwargs=kwargs, open=False
    )
    await pool.open(wait=True)
    closers.append(pool.close)
    shared = AsyncPostgresSaver(pool)
    await shared.setup()
    own = []
    for _ in range(sessions):
        conn = await psycopg.AsyncConnection.connect(url, autocommit=True, row_factory=dict_row)
        closers.append(conn.close)
        own.append(AsyncPostgresSaver(conn))
    return [
        LangGraph("langgraph (shared saver)", lambda _session: shared),
        LangGraph("langgraph (shared, per step)", lambda _session: shared, steps=5),
        LangGraph("langgraph (per session)", lambda session: own[session]),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="8,64,512", help="AgentState sizes in messages")
    parser.add_argument("--concurrency", default="1,8,32", help="concurrent sessions")
    parser.add_argument("--seconds", type=float, default=3.0, help="per throughput cell")
    parser.add_argument("--calls", type=int, default=300, help="per latency cell")
    parser.add_argument("--no-langgraph", action="store_true")
    parser.add_argument("--before", help="another checkout's src/: its state service too")
    parser.add_argument("--plots", type=Path, help="write PNG plots into this directory")
    parser.add_argument("--json", type=Path, help="write the results as JSON")
    parser.add_argument(
        "--replot",
        type=Path,
        help="print and plot the results of an earlier --json, measure nothing",
    )
    args = parser.parse_args()
    if args.replot:
        saved = json.loads(args.replot.read_text())
        lat = [Latency(**row) for row in saved["latency"]]
        thr = [Throughput(**row) for row in saved["throughput"]]
        print_tables(lat, thr)
        if args.plots:
            for path in plot(lat, thr, args.plots):
                print(f"wrote {path}")
        return
    print(
        f"{os.cpu_count()} cores; PostgreSQL embedded, fsync on; sizes {args.sizes}; "
        f"concurrency {args.concurrency}; {args.seconds:g}s per throughput cell",
        flush=True,
    )
    lat, thr = asyncio.run(run(args))
    print_tables(lat, thr)
    if args.json:
        args.json.write_text(
            json.dumps(
                {"latency": [asdict(r) for r in lat], "throughput": [asdict(r) for r in thr]},
                indent=1,
            )
        )
    if args.plots:
        for path in plot(lat, thr, args.plots):
            print(f"wrote {path}")


if __name__ == "__main__":
    main()
