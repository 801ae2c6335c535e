"""Turn cost against conversation length, before and after delta saves, in one run.

    .venv/bin/pip install -e '.[bench]'                   # LangGraph's saver, matplotlib
    git archive <before-commit> --prefix=before/ | tar -x -C /var/tmp/x
    .venv/bin/python -m bench.delta_turns --before /var/tmp/x/before/src \\
        [--sizes 8,64,512] [--seconds 5] [--plots docs/img] [--json results.json]

One embedded PostgreSQL 15 (fsync on) and, on it, one database per contender:
- before: the state service of `--before` (a checkout's src/, run with PYTHONPATH) and
  the whole-state turn it supports: BeginTurn returns the whole state, EndTurn sends it;
- after: this checkout's state service and the delta turn: BeginTurn with
  `cached_version` (the caller saved that version itself: no payload comes back),
  EndTurn with a StateDelta holding only what the turn changed.
A turn is BeginTurn (lease, the question's record, a STREAMING reply record) + EndTurn
(the state, the reply record settled, the lease released), as the agent makes it.

Measured, each as a function of the state's size (messages of the source's example):
1. relation bytes per conversation after 200 turns of steady load (8 sessions over 20
   conversations, each turn adding a question and an answer; autovacuum as configured,
   no VACUUM FULL) against the bytes stored (GetState's payload + the records' JSON);
2. one caller: GetState p50, and a turn appending 4 messages: EndTurn p50, turn p50 (a
   fresh N-message conversation every 16 turns, so the state stays near N), WAL bytes
   per turn (pg_current_wal_lsn() over 100 turns after a CHECKPOINT and 10 turns, with
   autovacuum paused, the state growing from N)
   against the bytes the turn added (4 messages + the records' blocks);
3. turns/s with 8 sessions, a turn appending 4 messages and dropping 4 from the front
   (a constant-size context), and LangGraph's AsyncPostgresSaver shared by the sessions
   (one aget_tuple + one aput of the same state per turn), on the same server;
4. whole Chat turns through the agent service (scripted model, no profile, a context
   budget large enough that nothing is trimmed) on a conversation seeded with N messages.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shutil
import statistics
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import grpc
import psycopg

from agentstate.agent.v1 import agent_service_pb2 as apb
from agentstate.agent.v1 import agent_service_pb2_grpc as apb_grpc
from agentstate.client.metadata import USER_ID_METADATA_KEY
from agentstate.common.embedded_postgres import EmbeddedPostgres
from agentstate.dev.processes import ServiceProcess
from agentstate.state.v1 import state_service_pb2 as pb
from agentstate.state.v1 import state_service_pb2_grpc as pb_grpc
from bench.state_compare import LangGraph, _database, _langgraph, _service
from bench.state_latency import grown_state

USER = "bench"
QUESTION = json.dumps([{"type": "text", "text": "我的订单88235现在什么状态？"}]).encode()
REPLY = json.dumps([{"type": "text", "text": "订单88235目前是已支付待发货。"}]).encode()


def _encode(value: Any) -> bytes:
    return json.dumps(value, ensure_ascii=False).encode()


def _new_messages(turn: int, count: int) -> list[dict[str, Any]]:
    """`count` messages of the source's example, with ids of this turn."""
    base = grown_state(8)["context"]
    return [dict(base[(turn * count + i) % 8], id=f"t{turn}-{i}") for i in range(count)]


@dataclass
class Row:
    contender: str
    messages: int
    metric: str
    value: float


@dataclass
class Results:
    rows: list[Row] = field(default_factory=list)

    def add(self, contender: str, messages: int, metric: str, value: float) -> None:
        self.rows.append(Row(contender, messages, metric, value))
        print(f"  {contender:<9} N={messages:<4} {metric:<34} {value:12.2f}", flush=True)

    def get(self, contender: str, messages: int, metric: str) -> float:
        for r in self.rows:
            if (r.contender, r.messages, r.metric) == (contender, messages, metric):
                return r.value
        return float("nan")


class Conversation:
    """One conversation's state as the client knows it, and its turns."""

    def __init__(self, stub: Any, delta: bool, state: dict[str, Any]) -> None:
        self.stub = stub
        self.delta = delta
        self.state = state
        self.cid = ""
        self.version = 0

    async def create(self) -> None:
        created = await self.stub.CreateConversation(pb.CreateConversationRequest(user_id=USER))
        self.cid = created.conversation.conversation_id
        self.state = dict(self.state, session_id=self.cid)
        await self.reseed()

    async def reseed(self, state: dict[str, Any] | None = None) -> None:
        if state is not None:
            self.state = dict(state, session_id=self.cid)
        saved = await self.stub.UpsertState(
            pb.UpsertStateRequest(
                user_id=USER, conversation_id=self.cid, payload=_encode(self.state)
            )
        )
        self.version = saved.version

    async def turn(self, added: list[dict[str, Any]], drop: int = 0) -> tuple[float, float]:
        """One turn; (BeginTurn ms, EndTurn ms)."""
        begin = pb.BeginTurnRequest(
            user_id=USER, conversation_id=self.cid, holder="bench", ttl_ms=60_000,
            require_none_awaiting=True,
            new_messages=[
                pb.NewMessage(role=pb.MESSAGE_ROLE_USER, blocks_json=QUESTION),
                pb.NewMessage(role=pb.MESSAGE_ROLE_ASSISTANT, status=pb.MESSAGE_STATUS_STREAMING),
            ],
        )  # fmt: skip
        if self.delta:
            begin.cached_version = self.version
        started = time.perf_counter()
        begun = await self.stub.BeginTurn(begin)
        began = time.perf_counter()
        if not self.delta:
            json.loads(begun.payload)  # what a caller does with it (the agent decodes it)
        context = self.state["context"][drop:] + added
        self.state = dict(self.state, context=context, cur_iter=self.version + 1)
        end = pb.EndTurnRequest(
            user_id=USER, conversation_id=self.cid, task_id=begun.lease.task_id,
            message_writes=[pb.MessageWrite(update=pb.MessageUpdate(
                message_id=begun.messages[1].message_id, status=pb.MESSAGE_STATUS_NORMAL,
                blocks_json=REPLY))],
        )  # fmt: skip
        if self.delta:
            fields = {k: v for k, v in self.state.items() if k != "context"}
            end.delta.CopyFrom(
                pb.StateDelta(
                    base_version=begun.version, drop_head=drop,
                    messages=[_encode(m) for m in added], fields_json=_encode(fields),
                )
            )  # fmt: skip
        else:
            end.payload = _encode(self.state)
            end.expected_version = begun.version
        ended = await self.stub.EndTurn(end)
        done = time.perf_counter()
        self.version = ended.version
        return (began - started) * 1000, (done - began) * 1000


async def _wal_lsn(dsn: str) -> int:
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        cur = await conn.execute("SELECT pg_current_wal_lsn() - '0/0'::pg_lsn")
        row = await cur.fetchone()
        assert row is not None
        return int(row[0])


async def _autovacuum(dsn: str, *, on: bool) -> None:
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        await conn.execute(f"ALTER SYSTEM SET autovacuum = {'on' if on else 'off'}")
        await conn.execute("SELECT pg_reload_conf()")
    await asyncio.sleep(0.2)


async def relation_bytes(
    name: str, stub: Any, dsn: str, delta: bool, results: Results, turns: int, sessions: int
) -> None:
    """Part 1: 20 conversations, `turns` turns each, `sessions` at a time."""
    conversations = [Conversation(stub, delta, grown_state(2)) for _ in range(20)]
    for c in conversations:
        await c.create()
    queue: asyncio.Queue[Conversation] = asyncio.Queue()
    for _ in range(turns):
        for c in conversations:
            queue.put_nowait(c)
    busy: set[str] = set()

    async def worker() -> None:
        while not queue.empty():
            c = queue.get_nowait()
            if c.cid in busy:  # one turn at a time per conversation
                queue.put_nowait(c)
                await asyncio.sleep(0)
                continue
            busy.add(c.cid)
            try:
                await c.turn(_new_messages(c.version, 2))
            finally:
                busy.discard(c.cid)

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(sessions)))
    elapsed = time.perf_counter() - started
    stored = 0
    for c in conversations:
        got = await stub.GetState(pb.GetStateRequest(user_id=USER, conversation_id=c.cid))
        stored += len(got.payload)
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        cur = await conn.execute(
            "SELECT coalesce(sum(octet_length(blocks::text) + octet_length(metadata::text)), 0) "
            "FROM t_agent_message"
        )
        row = await cur.fetchone()
        assert row is not None
        stored += int(row[0])
        cur = await conn.execute(
            "SELECT sum(pg_total_relation_size(c.oid)) FROM pg_class c "
            "JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE c.relkind = 'r' AND n.nspname = 'public'"
        )
        row = await cur.fetchone()
        assert row is not None
        total = int(row[0])
    messages = len(conversations[0].state["context"])
    results.add(name, messages, "relation KB per conversation", total / 20 / 1024)
    results.add(name, messages, "stored KB per conversation", stored / 20 / 1024)
    results.add(name, messages, "relation / stored", total / stored)
    results.add(name, messages, "turns/s (steady load)", turns * 20 / elapsed)


def _p50(values: list[float]) -> float:
    return statistics.median(values)


async def one_caller(
    contenders: dict[str, tuple[Any, str, bool]], sizes: list[int], results: Results, turns: int
) -> None:
    """Part 2. The latency cells are interleaved (each round does one call of every
    contender at every size), so a change in the machine's load hits them all alike."""
    conversations: dict[tuple[str, int], Conversation] = {}
    for size in sizes:
        for name, (stub, _, delta) in contenders.items():
            c = Conversation(stub, delta, grown_state(size))
            await c.create()
            conversations[(name, size)] = c
    gets: dict[tuple[str, int], list[float]] = {k: [] for k in conversations}
    begins: dict[tuple[str, int], list[float]] = {k: [] for k in conversations}
    ends: dict[tuple[str, int], list[float]] = {k: [] for k in conversations}
    order = random.Random(16)
    cells = list(conversations.items())
    for i in range(turns + 10):
        # Every cell once per round, in a new order each round: no cell always follows
        # the same (heavy or light) call. Reads first, then turns.
        order.shuffle(cells)
        for key, c in cells:
            if i % 16 == 0:
                # Keep the state near N messages: a new conversation with the N-message
                # state (a real conversation grows; it is never rewound).
                c.state = grown_state(key[1])
                await c.create()
            started = time.perf_counter()
            await c.stub.GetState(pb.GetStateRequest(user_id=USER, conversation_id=c.cid))
            if i >= 10:
                gets[key].append((time.perf_counter() - started) * 1000)
        order.shuffle(cells)
        for key, c in cells:
            begin_ms, end_ms = await c.turn(_new_messages(i, 4))
            if i >= 10:
                begins[key].append(begin_ms)
                ends[key].append(end_ms)
    for key in conversations:
        name, size = key
        results.add(name, size, "GetState p50 ms", _p50(gets[key]))
        results.add(name, size, "BeginTurn p50 ms", _p50(begins[key]))
        results.add(name, size, "EndTurn p50 ms (append 4)", _p50(ends[key]))
        whole = [b + e for b, e in zip(begins[key], ends[key], strict=True)]
        results.add(name, size, "turn p50 ms (append 4)", _p50(whole))
    # WAL: one conversation at a time, nothing else running on the server.
    for (name, size), c in conversations.items():
        dsn = contenders[name][1]
        c.state = grown_state(size)
        await c.create()
        # The WAL position is the cluster's: no checkpoint and no autovacuum inside the
        # window (their full-page images and vacuum records would land on whichever cell
        # they fell in; they come on top, per page per checkpoint interval).
        await _autovacuum(dsn, on=False)
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
            await conn.execute("CHECKPOINT")
        for i in range(10):
            await c.turn(_new_messages(1000 + i, 4))
        added = 0
        lsn = await _wal_lsn(dsn)
        for i in range(100):
            new = _new_messages(i, 4)
            added += sum(len(_encode(m)) for m in new) + len(QUESTION) + len(REPLY)
            await c.turn(new)
        wal = await _wal_lsn(dsn) - lsn
        await _autovacuum(dsn, on=True)
        results.add(name, size, "WAL bytes per turn (append 4)", wal / 100)
        results.add(name, size, "bytes added per turn", added / 100)
        results.add(name, size, "WAL / added", wal / added)


class Sessions:
    """`sessions` callers running back-to-back turns, in slices of time."""

    def __init__(self, turn: Any, sessions: int) -> None:
        self.turn = turn  # async (session number) -> None
        self.sessions = sessions
        self.count = 0
        self.elapsed = 0.0

    async def slice(self, seconds: float) -> None:
        deadline = time.perf_counter() + seconds

        async def loop(session: int) -> None:
            while time.perf_counter() < deadline:
                await self.turn(session)
                self.count += 1

        started = time.perf_counter()
        await asyncio.gather(*(loop(s) for s in range(self.sessions)))
        self.elapsed += time.perf_counter() - started


async def throughput(
    contenders: dict[str, tuple[Any, bool]],
    saver: LangGraph | None,
    size: int,
    sessions: int,
    seconds: float,
    results: Results,
) -> None:
    """Part 3: constant-size contexts (append 4, drop 4). The contenders take turns in
    one-second slices, so a change in the machine's load hits them all alike."""
    runs: dict[str, Sessions] = {}
    for name, (stub, delta) in contenders.items():
        conversations = [Conversation(stub, delta, grown_state(size)) for _ in range(sessions)]
        for c in conversations:
            await c.create()
            await c.turn(_new_messages(0, 4), drop=4)
        turn_no = [1] * sessions

        async def ours(
            session: int, cs: list[Conversation] = conversations, n: list[int] = turn_no
        ) -> None:
            await cs[session].turn(_new_messages(n[session], 4), drop=4)
            n[session] += 1

        runs[name] = Sessions(ours, sessions)
    if saver is not None:
        state = grown_state(size)
        threads = [f"thread-{size}-{s}-{time.monotonic_ns()}" for s in range(sessions)]
        for s in range(sessions):
            await saver.turn(s, threads[s], state)

        async def theirs(session: int, lg: LangGraph = saver) -> None:
            await lg.turn(session, threads[session], state)

        runs["langgraph"] = Sessions(theirs, sessions)
    for _ in range(max(1, round(seconds))):
        for run in runs.values():
            await run.slice(1.0)
    for name, run in runs.items():
        results.add(name, size, f"turns/s c={sessions}", run.count / run.elapsed)


async def chat_turns(
    agents: dict[str, tuple[Any, str]], sizes: list[int], turns: int, results: Results
) -> None:
    """Part 4: whole Chat turns on conversations seeded with N messages, interleaved
    (each round one turn of every contender at every size)."""
    md = ((USER_ID_METADATA_KEY, USER),)
    channels = {name: grpc.aio.insecure_channel(address) for name, (_, address) in agents.items()}
    try:
        cells = []
        for size in sizes:
            for name, (state_stub, _) in agents.items():
                c = Conversation(state_stub, False, grown_state(size))
                await c.create()
                cells.append((name, size, c.cid, apb_grpc.AgentServiceStub(channels[name])))
        samples: dict[tuple[str, int], list[float]] = {(n, z): [] for n, z, _, _ in cells}
        for i in range(turns + 5):
            for name, size, cid, stub in cells:
                started = time.perf_counter()
                events = [
                    r.event
                    async for r in stub.Chat(
                        apb.ChatRequest(conversation_id=cid, question=f"第{i}个问题：我叫什么？"),
                        metadata=md,
                    )
                ]
                assert events[-2].HasField("finish"), events[-2]
                if i >= 5:
                    samples[(name, size)].append((time.perf_counter() - started) * 1000)
        for (name, size), values in samples.items():
            results.add(name, size, "Chat turn p50 ms", _p50(values))
    finally:
        for channel in channels.values():
            await channel.close(None)


def _agent_service(state_address: str, src: str | None) -> ServiceProcess:
    env = {
        "AGENT_LISTEN_ADDRESS": "127.0.0.1:0",
        "AGENT_STATE_ADDRESS": state_address,
        "AGENT_PROFILE": "",
        "AGENT_MODEL": "scripted",
        "AGENT_CONTEXT_BUDGET_TOKENS": "100000000",
        "AGENT_AUTH_MODE": "dev-header",  # the user from metadata (ignored by older code)
    }
    if src:
        env["PYTHONPATH"] = src
    return ServiceProcess("agentstate.agent_service", env)


async def run(args: argparse.Namespace) -> Results:
    sizes = [int(s) for s in args.sizes.split(",")]
    root = Path(tempfile.mkdtemp(prefix="agentstate-delta-", dir=args.scratch))
    os.chmod(root, 0o755)  # the postgres user must reach the data directory
    server = EmbeddedPostgres(root / "pgdata")
    server.start()
    results = Results()
    services: list[ServiceProcess] = []
    closers: list[Any] = []
    try:
        contenders = {"before": (args.before, False), "after": (None, True)}
        stubs: dict[str, Any] = {}
        dsns: dict[str, str] = {}
        addresses: dict[str, str] = {}
        for name, (src, _) in contenders.items():
            dsns[name] = _database(server, name)
            service = _service(dsns[name], src)
            services.append(service)
            addresses[name] = service.wait_ready()
            channel = grpc.aio.insecure_channel(
                addresses[name],
                options=[("grpc.max_receive_message_length", 64 * 1024 * 1024)],
            )
            closers.append(lambda ch=channel: ch.close(None))
            stubs[name] = pb_grpc.StateServiceStub(channel)
        print("1. relation bytes after steady load", flush=True)
        for name, (_, delta) in contenders.items():
            await relation_bytes(name, stubs[name], dsns[name], delta, results, args.load_turns, 8)
        print("2. one caller", flush=True)
        await one_caller(
            {name: (stubs[name], dsns[name], delta) for name, (_, delta) in contenders.items()},
            sizes,
            results,
            args.calls,
        )
        print("3. throughput", flush=True)
        savers = (
            []
            if args.no_langgraph
            else await _langgraph(_database(server, "langgraph"), 8, closers)
        )
        for size in sizes:
            await throughput(
                {name: (stubs[name], delta) for name, (_, delta) in contenders.items()},
                savers[0] if savers else None,
                size,
                8,
                args.seconds,
                results,
            )
        print("4. whole Chat turns", flush=True)
        agents: dict[str, tuple[Any, str]] = {}
        for name, (src, _) in contenders.items():
            agent = _agent_service(addresses[name], src)
            services.append(agent)
            agents[name] = (stubs[name], agent.wait_ready())
        await chat_turns(agents, sizes, args.chat_turns, results)
        return results
    finally:
        for close in reversed(closers):
            await close()
        for service in reversed(services):
            service.terminate()
        server.stop()
        shutil.rmtree(root, ignore_errors=True)


TARGETS = [
    ("EndTurn p50 at max N / at 8 (append 4)", "EndTurn p50 ms (append 4)", "ratio", 1.5),
    ("WAL / added at max N", "WAL / added", "value", 3.0),
    ("GetState p50 at max N, after / before", "GetState p50 ms", "after/before", 1.0),
    ("Chat turn p50 at max N / at 8", "Chat turn p50 ms", "ratio", 1.5),
]


def print_summary(results: Results) -> None:
    sizes = sorted({r.messages for r in results.rows if r.metric == "GetState p50 ms"})
    metrics = list(dict.fromkeys(r.metric for r in results.rows))
    print(f"\n{'metric':<34} {'N':>4} {'before':>10} {'after':>10} {'langgraph':>10}")
    for metric in metrics:
        for n in sorted({r.messages for r in results.rows if r.metric == metric}):
            cells = [results.get(c, n, metric) for c in ("before", "after", "langgraph")]
            print(
                f"{metric:<34} {n:>4} "
                + " ".join("".rjust(10) if v != v else f"{v:10.2f}" for v in cells)
            )
    if not sizes:
        return
    small, big = sizes[0], sizes[-1]
    print(f"\nTargets (N={big} against N={small}, same run)")
    for c in ("before", "after"):
        end = results.get(c, big, "EndTurn p50 ms (append 4)") / results.get(
            c, small, "EndTurn p50 ms (append 4)"
        )
        chat = results.get(c, big, "Chat turn p50 ms") / results.get(c, small, "Chat turn p50 ms")
        print(
            f"  {c:<7} EndTurn {end:.2f}x (<= 1.5)   WAL/added "
            f"{results.get(c, big, 'WAL / added'):.2f} (<= 3)   Chat turn {chat:.2f}x (<= 1.5)"
        )
    rate = {c: results.get(c, big, "turns/s c=8") for c in ("before", "after", "langgraph")}
    print(
        f"  turns/s c=8 at N={big}: after/before {rate['after'] / rate['before']:.2f}x (>= 3), "
        f"after/langgraph {rate['after'] / rate['langgraph']:.2f}x (> 1)"
    )
    get = {c: results.get(c, big, "GetState p50 ms") for c in ("before", "after")}
    print(f"  GetState at N={big}: after/before {get['after'] / get['before']:.2f}x (<= 1)")
    for c in ("before", "after"):
        rows = [r for r in results.rows if r.contender == c and r.metric == "relation / stored"]
        if rows:
            print(f"  {c:<7} relation bytes / stored after the load: {rows[0].value:.2f} (<= 2)")


def plot(results: Results, out: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out.mkdir(parents=True, exist_ok=True)
    panels = [
        "EndTurn p50 ms (append 4)",
        "turn p50 ms (append 4)",
        "GetState p50 ms",
        "WAL bytes per turn (append 4)",
        "turns/s c=8",
        "Chat turn p50 ms",
    ]
    fig, axes = plt.subplots(2, 3, figsize=(13, 7))
    for ax, metric in zip(axes.flat, panels, strict=True):
        for c in ("before", "after", "langgraph"):
            rows = sorted(
                (r.messages, r.value)
                for r in results.rows
                if r.contender == c and r.metric == metric
            )
            if rows:
                ax.plot([n for n, _ in rows], [v for _, v in rows], marker="o", label=c)
        sizes = sorted({r.messages for r in results.rows if r.metric == metric})
        ax.set_xscale("log", base=2)
        ax.set_xticks(sizes, [str(n) for n in sizes])
        ax.set_xlabel("messages in the AgentState")
        ax.set_title(metric, fontsize=10)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    path = out / "delta_turns.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return [path]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", required=False, help="src/ of the checkout to compare with")
    parser.add_argument("--sizes", default="8,64,512")
    parser.add_argument("--calls", type=int, default=100, help="turns per latency cell")
    parser.add_argument("--seconds", type=float, default=5.0, help="per throughput cell")
    parser.add_argument("--load-turns", type=int, default=200, help="turns per conversation")
    parser.add_argument("--chat-turns", type=int, default=40)
    parser.add_argument("--no-langgraph", action="store_true")
    parser.add_argument("--scratch", default=None, help="where the throwaway PostgreSQL lives")
    parser.add_argument("--plots", type=Path)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--replot", type=Path, help="print and plot an earlier --json")
    args = parser.parse_args()
    if args.replot:
        results = Results([Row(**r) for r in json.loads(args.replot.read_text())["rows"]])
    else:
        if not args.before:
            parser.error("--before is required (the src/ of the code to compare with)")
        print(f"{os.cpu_count()} cores; sizes {args.sizes}; before = {args.before}", flush=True)
        results = asyncio.run(run(args))
        if args.json:
            args.json.write_text(json.dumps({"rows": [asdict(r) for r in results.rows]}, indent=1))
    print_summary(results)
    if args.plots:
        for path in plot(results, args.plots):
            print(f"wrote {path}")


if __name__ == "__main__":
    main()
