"""A LangGraph graph checkpointing every step: AgentStateSaver against AsyncPostgresSaver,
on one PostgreSQL, in one run.

    .venv/bin/pip install -e '.[bench]'      # LangGraph's PostgreSQL saver and matplotlib
    .venv/bin/python -m bench.langgraph_saver [--sizes 8,64] [--steps 10] [--runs 30]
        [--durability sync,async] [--plots docs/img] [--json results.json]

- ours: `AgentStateSaver` (agentstate.integrations.langgraph) calling the state service,
  which runs as its own process (`python -m agentstate.state_service`, pool of 10) on
  database `via_service`.
- LangGraph: `AsyncPostgresSaver` (langgraph-checkpoint-postgres) in this process over a
  pool of 10 on database `langgraph` of the same server.

The graph is the same for both: a thread holding N messages (the source's 8-message
example repeated, each message as an AIMessage whose content is its JSON), and one node
that runs `--steps` super-steps, each replacing one message (so the messages channel, the
bulk of the state, changes and is stored at every step, as in an agent loop) and bumping a
counter. Measured with `durability="sync"` (every step's checkpoint is written before the
next step starts: the saver's whole cost is on the step) and `"async"` (LangGraph's default:
the write overlaps the next step). Time per step = the wall time of one `ainvoke` / its
steps; runs alternate between the savers, so machine load hits both alike. Ratio = ours /
LangGraph's, p50 of per-step times.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import operator
import os
import shutil
import statistics
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Annotated, Any, TypedDict

from langchain_core.messages import AIMessage, AnyMessage
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.graph import START, StateGraph
from langgraph.graph.message import add_messages

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


SAVERS = ("AgentStateSaver", "AsyncPostgresSaver")


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


async def measure(
    savers: dict[str, BaseCheckpointSaver[Any]],
    sizes: list[int],
    steps: int,
    runs: int,
    durability: str,
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
            await graph.ainvoke(seed, cfg, durability=durability)
            for _ in range(3):
                await graph.ainvoke({"step": 0}, cfg, durability=durability)
        samples: dict[str, list[float]] = {name: [] for name in savers}
        for _ in range(runs):
            for name, graph in graphs.items():  # alternate: load hits both alike
                cfg = {"configurable": {"thread_id": threads[name]}}
                started = time.perf_counter()
                await graph.ainvoke({"step": 0}, cfg, durability=durability)
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
                )
            )
    return rows


def print_table(rows: list[StepTime]) -> None:
    print(
        "\n| durability | messages | state bytes | AgentStateSaver p50 / p90 ms "
        "| AsyncPostgresSaver p50 / p90 ms | ratio p50 |"
    )
    print("|---|---:|---:|---:|---:|---:|")
    for mode, n in dict.fromkeys((r.durability, r.messages) for r in rows):
        ours, theirs = (
            next(r for r in rows if (r.durability, r.messages, r.saver) == (mode, n, name))
            for name in SAVERS
        )
        print(
            f"| {mode} | {n} | {ours.state_bytes} | {ours.p50_ms:.2f} / {ours.p90_ms:.2f} | "
            f"{theirs.p50_ms:.2f} / {theirs.p90_ms:.2f} | {ours.p50_ms / theirs.p50_ms:.2f}x |"
        )


def plot(rows: list[StepTime], out_dir: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir.mkdir(parents=True, exist_ok=True)
    modes = list(dict.fromkeys(r.durability for r in rows))
    sizes = list(dict.fromkeys(r.messages for r in rows))
    fig, axes = plt.subplots(1, len(modes), figsize=(5 * len(modes), 4), squeeze=False)
    width = 0.38
    for ax, mode in zip(axes[0], modes, strict=True):
        p50 = {(r.messages, r.saver): r.p50_ms for r in rows if r.durability == mode}
        for i, name in enumerate(SAVERS):
            values = [p50[(n, name)] for n in sizes]
            bars = ax.bar([x + i * width for x in range(len(sizes))], values, width, label=name)
            ax.bar_label(bars, fmt="%.2f", fontsize=8)
        for x, n in enumerate(sizes):
            ours, theirs = (p50[(n, name)] for name in SAVERS)
            ax.annotate(
                f"{ours / theirs:.2f}x", (x + width / 2, max(ours, theirs) * 1.12), ha="center"
            )
        ax.set_xticks([x + width / 2 for x in range(len(sizes))], [f"{n} messages" for n in sizes])
        ax.set_ylabel("p50 ms per checkpointed step")
        ax.set_title(f'durability="{mode}"')
        ax.set_ylim(top=ax.get_ylim()[1] * 1.15)
        ax.grid(axis="y", alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle("A LangGraph graph checkpointing every step, one PostgreSQL")
    fig.tight_layout()
    path = out_dir / "langgraph_saver.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


async def run(args: argparse.Namespace) -> list[StepTime]:
    from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver
    from psycopg.rows import dict_row
    from psycopg_pool import AsyncConnectionPool

    root = _scratch_dir()
    server = EmbeddedPostgres(root / "pgdata")
    server.start()
    service = None
    closers: list[Callable[[], Awaitable[object]]] = []
    try:
        service = ServiceProcess(
            "agentstate.state_service",
            {
                "STATE_LISTEN_ADDRESS": "127.0.0.1:0",
                "STATE_STORE": "postgres",
                "DATABASE_URL": _database(server, "via_service"),
                "STATE_DB_POOL_MAX_SIZE": str(POOL_SIZE),
            },
        )
        ours = AgentStateSaver(service.wait_ready(), user_id="bench")
        closers.append(ours.aclose)
        kwargs = {"autocommit": True, "row_factory": dict_row, "prepare_threshold": 0}
        pool: AsyncConnectionPool[Any] = AsyncConnectionPool(
            _database(server, "langgraph"),
            min_size=POOL_SIZE,
            max_size=POOL_SIZE,
            kwargs=kwargs,
            open=False,
        )
        await pool.open(wait=True)
        closers.append(pool.close)
        theirs = AsyncPostgresSaver(pool)
        await theirs.setup()
        sizes = [int(s) for s in args.sizes.split(",")]
        savers: dict[str, BaseCheckpointSaver[Any]] = dict(zip(SAVERS, (ours, theirs), strict=True))
        rows = []
        for mode in args.durability.split(","):
            rows += await measure(savers, sizes, args.steps, args.runs, mode)
        return rows
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
    parser.add_argument("--plots", type=Path, help="write the PNG plot into this directory")
    parser.add_argument("--json", type=Path, help="write the results as JSON")
    parser.add_argument("--replot", type=Path, help="print and plot an earlier --json")
    args = parser.parse_args()
    if args.replot:
        rows = [StepTime(**row) for row in json.loads(args.replot.read_text())["steps"]]
    else:
        print(
            f"{os.cpu_count()} cores; PostgreSQL embedded, fsync on; sizes {args.sizes}; "
            f"{args.steps} steps x {args.runs} runs per saver and size",
            flush=True,
        )
        rows = asyncio.run(run(args))
        if args.json:
            args.json.write_text(json.dumps({"steps": [asdict(r) for r in rows]}, indent=1))
    print_table(rows)
    if args.plots:
        print(f"wrote {plot(rows, args.plots)}")


if __name__ == "__main__":
    main()
