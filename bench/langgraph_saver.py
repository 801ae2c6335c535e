"""A LangGraph graph checkpointing every step: AgentStateSaver against LangGraph's own
PostgreSQL savers, on one PostgreSQL, in one run.

    .venv/bin/pip install -e '.[bench]'      # LangGraph's PostgreSQL saver and matplotlib
    .venv/bin/python -m bench.langgraph_saver [--sizes 8,64] [--steps 10] [--runs 30]
        [--durability sync,async] [--api async,sync] [--writers 2] [--users 200]
        [--service-workers 2] [--plots docs/img] [--json results.json]

- ours: `AgentStateSaver` (agentstate.integrations.langgraph) calling the state service,
  which runs as its own process (`python -m agentstate.state_service`, pool of 10) on
  database `via_service`.
- LangGraph: `AsyncPostgresSaver` (`ainvoke`, api "async") and `PostgresSaver` (`invoke`,
  api "sync"; langgraph-checkpoint-postgres) in this process, each over a pool of 10 on
  database `langgraph` of the same server. Ours is the same saver object for both APIs
  (its synchronous methods use the synchronous gRPC client: no event loop, no thread hop).

The graph is the same for both: a thread holding N messages (the source's 8-message
example repeated, each message as an AIMessage whose content is its JSON), and one node
that runs `--steps` super-steps, each replacing one message (so the messages channel, the
bulk of the state, changes and is stored at every step, as in an agent loop) and bumping a
counter. Measured with `durability="sync"` (every step's checkpoint is written before the
next step starts: the saver's whole cost is on the step) and `"async"` (LangGraph's default:
the write overlaps the next step). Time per step = the wall time of one `ainvoke` / its
steps; runs alternate between the savers, so machine load hits both alike. Ratio = ours /
LangGraph's, p50 of per-step times.

Two concurrent writers (`--writers 2`): that many graphs run at once, each on its own thread
id (asyncio tasks with `ainvoke`; OS threads with `invoke`), for `--runs` invokes each;
steps per second over all of them, the savers alternating round by round. `--users N`: the
method of langgraph issue 7259 (issue 26 item 6): N users at once, each 5 `ainvoke`s of a
two-node graph on its own thread, once with 20 ms of sleep per node and once (N/4 users,
10 invokes) with none; invokes per second and p99 latency, InMemorySaver as the ceiling.

`--service-workers N`: the state service runs N worker processes on its one port
(`STATE_WORKERS`, docs/scaling.md), a central deployment's configuration. The kernel spreads
connections, not calls, over the workers, and a saver holds one connection, so with N > 1
each of the `--writers` graphs gets its own `AgentStateSaver` (as separate agent processes
would), made afresh every round; each on its own connection (a local subchannel pool: gRPC
otherwise shares one connection among a process's channels to one address); the JSON
records, per round, how many of the writers' connections each worker held (two
connections land on one worker half the time).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import operator
import os
import shutil
import statistics
import threading
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Annotated, Any, TypedDict

import grpc
from langchain_core.messages import AIMessage, AnyMessage
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.graph import START, StateGraph
from langgraph.graph.message import add_messages

from agentstate.client import AsyncStateClient, ClientSettings, StateClient
from agentstate.client.channel import channel_options
from agentstate.common.embedded_postgres import EmbeddedPostgres
from agentstate.dev.processes import ServiceProcess
from agentstate.integrations.langgraph import AgentStateSaver
from bench.state_compare import POOL_SIZE, _database, _scratch_dir
from bench.state_latency import grown_state


@dataclass
class StepTime:
    durability: str
    messages: int
    saver: str
    state_bytes: int
    p50_ms: float
    p90_ms: float
    mean_ms: float
    api: str = "async"  # ainvoke (async) or invoke (sync)


@dataclass
class Concurrent:
    """Several graphs at once: `writers` threads of the graph, `invokes` each."""

    load: str
    api: str
    saver: str
    writers: int
    invokes: int
    steps_per_s: float  # checkpointed steps (or invokes, for the users load) per second
    p50_ms: float  # per invoke
    p99_ms: float
    service_workers: int = 1
    # per round: connections of this saver's writers on each worker (N > 1 only)
    spread: list[list[int]] | None = None


OURS = "AgentStateSaver"
THEIRS = {"async": "AsyncPostgresSaver", "sync": "PostgresSaver"}
SAVERS = (OURS, "AsyncPostgresSaver")


class State(TypedDict):
    messages: Annotated[list[AnyMessage], add_messages]
    step: Annotated[int, operator.add]


def build(saver: BaseCheckpointSaver[Any], steps: int) -> Any:
    def work(state: State) -> dict[str, Any]:
        done = state["step"] % steps + 1
        # Replace the last message (same id): the channel changes, its size does not.
        return {"messages": [AIMessage(id="m-last", content=f"step {done}")], "step": 1}

    def again(state: State) -> str:
        return "work" if state["step"] % steps else "__end__"

    builder = StateGraph(State)
    builder.add_node("work", work)
    builder.add_edge(START, "work")
    builder.add_conditional_edges("work", again)
    return builder.compile(checkpointer=saver)


def seed_messages(n: int) -> list[AnyMessage]:
    context = grown_state(n)["context"]
    messages: list[AnyMessage] = [
        AIMessage(id=f"m{i}", content=json.dumps(m, ensure_ascii=False))
        for i, m in enumerate(context[:-1])
    ]
    return [*messages, AIMessage(id="m-last", content="start")]


async def _invoke(graph: Any, api: str, value: Any, cfg: Any, durability: str) -> None:
    if api == "sync":
        graph.invoke(value, cfg, durability=durability)
    else:
        await graph.ainvoke(value, cfg, durability=durability)


async def measure(
    savers: dict[str, BaseCheckpointSaver[Any]],
    sizes: list[int],
    steps: int,
    runs: int,
    durability: str,
    api: str = "async",
) -> list[StepTime]:
    rows = []
    for n in sizes:
        graphs = {name: build(saver, steps) for name, saver in savers.items()}
        threads = {name: f"bench-{n}-{uuid.uuid4()}" for name in savers}
        messages = seed_messages(n)
        seed = {"messages": messages, "step": 0}
        state_bytes = len(json.dumps([m.content for m in messages]).encode())
        for name, graph in graphs.items():  # seed the thread, warm connections
            cfg = {"configurable": {"thread_id": threads[name]}}
            await _invoke(graph, api, seed, cfg, durability)
            for _ in range(3):
                await _invoke(graph, api, {"step": 0}, cfg, durability)
        samples: dict[str, list[float]] = {name: [] for name in savers}
        for _ in range(runs):
            for name, graph in graphs.items():  # alternate: load hits both alike
                cfg = {"configurable": {"thread_id": threads[name]}}
                started = time.perf_counter()
                await _invoke(graph, api, {"step": 0}, cfg, durability)
                samples[name].append((time.perf_counter() - started) * 1000 / steps)
        for name, values in samples.items():
            ordered = sorted(values)
            rows.append(
                StepTime(
                    durability=durability,
                    messages=n,
                    saver=name,
                    state_bytes=state_bytes,
                    p50_ms=statistics.median(ordered),
                    p90_ms=statistics.quantiles(ordered, n=10, method="inclusive")[8],
                    mean_ms=statistics.fmean(ordered),
                    api=api,
                )
            )
    return rows


def _summary(
    load: str, api: str, name: str, writers: int, invokes: int, per: float, lat: list[float]
) -> Concurrent:
    ordered = sorted(lat)
    return Concurrent(
        load=load,
        api=api,
        saver=name,
        writers=writers,
        invokes=invokes,
        steps_per_s=per,
        p50_ms=statistics.median(ordered) * 1000,
        p99_ms=statistics.quantiles(ordered, n=100, method="inclusive")[98] * 1000,
    )


def _workers_of(supervisor: int) -> list[int]:
    children = Path(f"/proc/{supervisor}/task/{supervisor}/children").read_text()
    return sorted(int(pid) for pid in children.split())


def _established(port: int) -> set[str]:
    """Socket inodes of the established TCP connections whose local port is `port`."""
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if int(fields[1].rsplit(":", 1)[1], 16) == port and fields[3] == "01":
                found.add(fields[9])
    return found


def connections_per_worker(supervisor: int, port: int) -> list[int]:
    """How many established connections of `port` each worker process holds."""
    served = _established(port)
    counts = []
    for pid in _workers_of(supervisor):
        inodes = set()
        for fd in Path(f"/proc/{pid}/fd").iterdir():
            with contextlib.suppress(OSError):
                target = os.readlink(fd)
                if target.startswith("socket:["):
                    inodes.add(target[8:-1])
        counts.append(len(inodes & served))
    return counts


@dataclass
class Workers:
    """The service's worker processes: `make_saver` gives each writer its own saver."""

    count: int
    supervisor: int
    port: int
    address: str
    writes_delay: float

    def saver(self) -> tuple[AgentStateSaver, Callable[[], Awaitable[None]]]:
        """A saver on its own connection, and what closes it. gRPC shares one connection
        among the channels of a process with the same target and arguments (its global
        subchannel pool), so each gets a local pool: a connection of its own, as an
        agent process of its own would have."""
        options = [*channel_options(ClientSettings().max_message_bytes)]
        options.append(("grpc.use_local_subchannel_pool", 1))
        aio = AsyncStateClient(
            grpc.aio.insecure_channel(self.address, options=options), owns_channel=True
        )
        sync = StateClient(grpc.insecure_channel(self.address, options=options), owns_channel=True)

        async def close() -> None:
            await aio.close()
            sync.close()

        return (
            AgentStateSaver(
                client=aio,
                sync_client=sync,
                user_id="bench",
                writes_delay_seconds=self.writes_delay,
            ),
            close,
        )


async def concurrent_writers(
    savers: dict[str, BaseCheckpointSaver[Any]],
    api: str,
    writers: int,
    invokes: int,
    steps: int,
    rounds: int = 3,
    service: Workers | None = None,
) -> list[Concurrent]:
    """`writers` graphs at once on their own threads ids, 8 messages each, sync
    durability; steps per second over all of them, best of `rounds` alternating rounds.
    With `service` (several workers), each of our writers has its own saver."""
    best: dict[str, tuple[float, list[float]]] = {}
    spread: dict[str, list[list[int]]] = {}
    for _ in range(rounds):
        for name, saver in savers.items():
            own = service if name == OURS else None
            before = connections_per_worker(own.supervisor, own.port) if own else []
            mine = [own.saver() for _ in range(writers)] if own else []
            graphs = [build(s, steps) for s, _ in mine] or [build(saver, steps)] * writers
            cfgs = [{"configurable": {"thread_id": f"w-{uuid.uuid4()}"}} for _ in range(writers)]
            seed = {"messages": seed_messages(8), "step": 0}
            for graph, cfg in zip(graphs, cfgs, strict=True):
                await _invoke(graph, api, seed, cfg, "sync")
            if own:
                after = connections_per_worker(own.supervisor, own.port)
                spread.setdefault(name, []).append(
                    [a - b for a, b in zip(after, before, strict=False)]
                )
            latencies: list[float] = []

            async def one_async(graph: Any, cfg: Any, latencies: list[float] = latencies) -> None:
                for _ in range(invokes):
                    t = time.perf_counter()
                    await graph.ainvoke({"step": 0}, cfg, durability="sync")
                    latencies.append(time.perf_counter() - t)

            def one_sync(graph: Any, cfg: Any, latencies: list[float] = latencies) -> None:
                for _ in range(invokes):
                    t = time.perf_counter()
                    graph.invoke({"step": 0}, cfg, durability="sync")
                    latencies.append(time.perf_counter() - t)

            started = time.perf_counter()
            if api == "async":
                await asyncio.gather(*(one_async(g, c) for g, c in zip(graphs, cfgs, strict=True)))
            else:
                threads = [
                    threading.Thread(target=one_sync, args=(g, c))
                    for g, c in zip(graphs, cfgs, strict=True)
                ]
                for t in threads:
                    t.start()
                for t in threads:
                    t.join()
            per = writers * invokes * steps / (time.perf_counter() - started)
            for _, close in mine:
                await close()
            if name not in best or per > best[name][0]:
                best[name] = (per, latencies)
    rows = []
    for name, (per, lat) in best.items():
        row = _summary("writers", api, name, writers, invokes, per, lat)
        row.service_workers = service.count if service else 1
        row.spread = spread.get(name)
        rows.append(row)
    return rows


class TwoNodes(TypedDict):
    messages: Annotated[list[AnyMessage], add_messages]


def two_nodes(saver: BaseCheckpointSaver[Any], sleep_s: float) -> Any:
    async def node(state: TwoNodes) -> dict[str, Any]:
        if sleep_s:
            await asyncio.sleep(sleep_s)
        return {"messages": [AIMessage(content="ok")]}

    builder = StateGraph(TwoNodes)
    builder.add_node("a", node)
    builder.add_node("b", node)
    builder.add_edge(START, "a")
    builder.add_edge("a", "b")
    return builder.compile(checkpointer=saver)


async def users_load(
    savers: dict[str, BaseCheckpointSaver[Any]], users: int, invokes: int, sleep_s: float
) -> list[Concurrent]:
    """langgraph issue 7259's method: `users` at once, `invokes` each on its own thread."""
    rows = []
    load = f"{users} users x {invokes}, {sleep_s * 1000:.0f} ms/node"
    for name, saver in savers.items():
        graph = two_nodes(saver, sleep_s)
        latencies: list[float] = []

        async def user(graph: Any = graph, latencies: list[float] = latencies) -> None:
            cfg = {"configurable": {"thread_id": f"u-{uuid.uuid4()}"}}
            for _ in range(invokes):
                t = time.perf_counter()
                await graph.ainvoke({"messages": [AIMessage(content="hi")]}, cfg)
                latencies.append(time.perf_counter() - t)

        started = time.perf_counter()
        await asyncio.gather(*(user() for _ in range(users)))
        per = users * invokes / (time.perf_counter() - started)
        rows.append(_summary(load, "async", name, users, invokes, per, latencies))
    return rows


def print_table(rows: list[StepTime]) -> None:
    print(
        "\n| API | durability | messages | state bytes | AgentStateSaver p50 / p90 ms "
        "| LangGraph's saver p50 / p90 ms | ratio p50 |"
    )
    print("|---|---|---:|---:|---:|---:|---:|")
    for api, mode, n in dict.fromkeys((r.api, r.durability, r.messages) for r in rows):
        ours, theirs = (
            next(
                r
                for r in rows
                if (r.api, r.durability, r.messages, r.saver) == (api, mode, n, name)
            )
            for name in (OURS, THEIRS[api])
        )
        print(
            f"| {api} ({theirs.saver}) | {mode} | {n} | {ours.state_bytes} | "
            f"{ours.p50_ms:.2f} / {ours.p90_ms:.2f} | "
            f"{theirs.p50_ms:.2f} / {theirs.p90_ms:.2f} | {ours.p50_ms / theirs.p50_ms:.2f}x |"
        )


def print_concurrent(rows: list[Concurrent]) -> None:
    if not rows:
        return
    print("\n| load | API | saver | service workers | per second | p50 / p99 ms per invoke |")
    print("|---|---|---|---:|---:|---:|")
    for r in rows:
        spread = f" (connections per worker by round: {r.spread})" if r.spread else ""
        print(
            f"| {r.load} ({r.writers} at once, {r.invokes} invokes each) | {r.api} | {r.saver} "
            f"| {r.service_workers}{spread} | {r.steps_per_s:.0f} | {r.p50_ms:.1f} / "
            f"{r.p99_ms:.1f} |"
        )


def plot(rows: list[StepTime], out_dir: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir.mkdir(parents=True, exist_ok=True)
    apis = list(dict.fromkeys(r.api for r in rows))
    panels = list(dict.fromkeys((r.api, r.durability) for r in rows))
    sizes = list(dict.fromkeys(r.messages for r in rows))
    fig, axes = plt.subplots(1, len(panels), figsize=(4.6 * len(panels), 4), squeeze=False)
    width = 0.38
    for ax, (api, mode) in zip(axes[0], panels, strict=True):
        names = (OURS, THEIRS[api])
        p50 = {
            (r.messages, r.saver): r.p50_ms for r in rows if (r.api, r.durability) == (api, mode)
        }
        for i, name in enumerate(names):
            values = [p50[(n, name)] for n in sizes]
            bars = ax.bar([x + i * width for x in range(len(sizes))], values, width, label=name)
            ax.bar_label(bars, fmt="%.2f", fontsize=8)
        for x, n in enumerate(sizes):
            ours, theirs = (p50[(n, name)] for name in names)
            ax.annotate(
                f"{ours / theirs:.2f}x", (x + width / 2, max(ours, theirs) * 1.12), ha="center"
            )
        ax.set_xticks([x + width / 2 for x in range(len(sizes))], [f"{n} messages" for n in sizes])
        ax.set_ylabel("p50 ms per checkpointed step")
        ax.set_title(f'{"invoke" if api == "sync" else "ainvoke"}, durability="{mode}"')
        ax.set_ylim(top=ax.get_ylim()[1] * 1.15)
        ax.grid(axis="y", alpha=0.3)
        ax.legend(fontsize=8)
    del apis
    fig.suptitle("A LangGraph graph checkpointing every step, one PostgreSQL")
    fig.tight_layout()
    path = out_dir / "langgraph_saver.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


async def run(args: argparse.Namespace) -> tuple[list[StepTime], list[Concurrent]]:
    from langgraph.checkpoint.memory import InMemorySaver
    from langgraph.checkpoint.postgres import PostgresSaver
    from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver
    from psycopg.rows import dict_row
    from psycopg_pool import AsyncConnectionPool, ConnectionPool

    root = _scratch_dir()
    server = EmbeddedPostgres(root / "pgdata")
    server.start()
    service = None
    closers: list[Callable[[], Awaitable[object]]] = []
    with contextlib.ExitStack() as stack:
        try:
            service = ServiceProcess(
                "agentstate.state_service",
                {
                    "STATE_LISTEN_ADDRESS": "127.0.0.1:0",
                    "STATE_STORE": "postgres",
                    "DATABASE_URL": _database(server, "via_service"),
                    "STATE_DB_POOL_MAX_SIZE": str(POOL_SIZE),
                    "STATE_WORKERS": str(args.service_workers),
                    **(
                        {"STATE_MAX_QUEUED_CALLS": str(args.max_queued)}
                        if args.max_queued is not None
                        else {}
                    ),
                },
            )
            address = service.wait_ready()
            ours = AgentStateSaver(address, user_id="bench", writes_delay_seconds=args.writes_delay)
            workers = (
                Workers(
                    args.service_workers,
                    service.proc.pid,
                    int(address.rsplit(":", 1)[1]),
                    address,
                    args.writes_delay,
                )
                if args.service_workers > 1
                else None
            )
            closers.append(ours.aclose)
            stack.callback(ours.close)
            kwargs = {"autocommit": True, "row_factory": dict_row, "prepare_threshold": 0}
            url = _database(server, "langgraph")
            pool: AsyncConnectionPool[Any] = AsyncConnectionPool(
                url, min_size=POOL_SIZE, max_size=POOL_SIZE, kwargs=kwargs, open=False
            )
            await pool.open(wait=True)
            closers.append(pool.close)
            theirs = AsyncPostgresSaver(pool)
            await theirs.setup()
            sync_pool: ConnectionPool[Any] = ConnectionPool(
                url, min_size=POOL_SIZE, max_size=POOL_SIZE, kwargs=kwargs, open=True
            )
            stack.callback(sync_pool.close)
            theirs_sync = PostgresSaver(sync_pool)
            by_api: dict[str, dict[str, BaseCheckpointSaver[Any]]] = {
                "async": {OURS: ours, THEIRS["async"]: theirs},
                "sync": {OURS: ours, THEIRS["sync"]: theirs_sync},
            }
            sizes = [int(s) for s in args.sizes.split(",")]
            rows: list[StepTime] = []
            for api in args.api.split(","):
                for mode in args.durability.split(","):
                    if api == "sync" and mode == "async":
                        continue  # invoke's async durability runs puts on threads: as sync
                    print(f"steps: {api} API, durability {mode}", flush=True)
                    rows += await measure(by_api[api], sizes, args.steps, args.runs, mode, api)
            many: list[Concurrent] = []
            if args.writers:
                for api in args.api.split(","):
                    print(f"{args.writers} writers at once: {api} API", flush=True)
                    many += await concurrent_writers(
                        by_api[api], api, args.writers, args.runs, args.steps, service=workers
                    )
            if args.users:
                print(f"{args.users} users at once", flush=True)
                with_memory = {"InMemorySaver": InMemorySaver(), **by_api["async"]}
                many += await users_load(with_memory, args.users, 5, 0.02)
                many += await users_load(with_memory, max(args.users // 4, 1), 10, 0.0)
            return rows, many
        finally:
            for close in reversed(closers):
                await close()
            if service is not None:
                service.terminate()
            server.stop()
            shutil.rmtree(root, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--sizes", default="8,64", help="messages in the thread's state")
    parser.add_argument("--steps", type=int, default=10, help="checkpointed steps per run")
    parser.add_argument("--runs", type=int, default=30, help="runs per saver and size")
    parser.add_argument(
        "--durability", default="sync,async", help="LangGraph durability modes to measure"
    )
    parser.add_argument("--api", default="async,sync", help="ainvoke (async), invoke (sync)")
    parser.add_argument("--writers", type=int, default=0, help="graphs at once (0: skip)")
    parser.add_argument("--users", type=int, default=0, help="issue 7259's users (0: skip)")
    parser.add_argument(
        "--writes-delay", type=float, default=0.02, help="AgentStateSaver writes_delay_seconds"
    )
    parser.add_argument(
        "--max-queued",
        type=int,
        help="the service's STATE_MAX_QUEUED_CALLS (default: its own, 32); a psycopg pool "
        "lets every caller queue, so the users load is run with 1000",
    )
    parser.add_argument(
        "--service-workers",
        type=int,
        default=1,
        help="the service's STATE_WORKERS (N > 1: each writer has its own saver)",
    )
    parser.add_argument("--plots", type=Path, help="write the PNG plot into this directory")
    parser.add_argument("--json", type=Path, help="write the results as JSON")
    parser.add_argument("--replot", type=Path, help="print and plot an earlier --json")
    args = parser.parse_args()
    if args.replot:
        saved = json.loads(args.replot.read_text())
        rows = [StepTime(**row) for row in saved["steps"]]
        many = [Concurrent(**row) for row in saved.get("concurrent", [])]
    else:
        print(
            f"{os.cpu_count()} cores; PostgreSQL embedded, fsync on; sizes {args.sizes}; "
            f"{args.steps} steps x {args.runs} runs per saver and size; "
            f"{args.service_workers} service worker(s)",
            flush=True,
        )
        load_before = os.getloadavg()
        rows, many = asyncio.run(run(args))
        if args.json:
            args.json.write_text(
                json.dumps(
                    {
                        "service_workers": args.service_workers,
                        "load_average_before": load_before,
                        "load_average_after": os.getloadavg(),
                        "steps": [asdict(r) for r in rows],
                        "concurrent": [asdict(r) for r in many],
                    },
                    indent=1,
                )
            )
    print_table(rows)
    print_concurrent(many)
    if args.plots:
        print(f"wrote {plot(rows, args.plots)}")


if __name__ == "__main__":
    main()
