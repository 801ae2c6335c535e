"""A whole ADK and OpenAI Agents `Runner` turn with one tool call: our session stores
against each framework's own PostgreSQL store, on one PostgreSQL, in one run.

    .venv/bin/pip install -e '.[bench]'      # SQLAlchemy + asyncpg, matplotlib
    .venv/bin/python -m bench.sessions [--runs 40] [--history 0,20] [--seconds 5]
        [--frameworks adk,openai] [--plots docs/img] [--json results.json]

- ours: `AgentStateSessionService` (agentstate.integrations.adk) and `AgentStateSession`
  (agentstate.integrations.openai_agents), calling the state service, which runs as its
  own process (`python -m agentstate.state_service`, pool of 10) on database `via_service`.
- ADK: `DatabaseSessionService` ("postgresql+asyncpg://", SQLAlchemy's async engine) on
  database `adk` of the same server; `InMemorySessionService` as the floor.
- OpenAI Agents: `SQLAlchemySession` (agents.extensions.memory, one shared
  "postgresql+asyncpg://" engine) on database `openai` of the same server; `SQLiteSession`
  (a file in the scratch directory) as the floor.

A turn is the framework's real `Runner` loop with a scripted model, so that a turn costs
only the framework and its session store: the model first calls the tool `lookup_order`,
then answers with text once it sees the tool's output. An ADK turn stores 4 events (the
user's message, the call, the response, the answer); an OpenAI turn stores 4 items. Each
session first gets `history` such turns, then the measured turns alternate between the
stores (one turn each, round robin), so machine load hits them alike. Ratio = ours / the
framework's PostgreSQL store, p50 of the turn times.

Throughput: two writers (two asyncio tasks in this process, each running turns on its own
session, as two requests of one application server) for `--seconds` per store; turns per
second of both together.

RPCs per turn: every state-service call our adapters make is counted (and timed, client
side) during the measured turns; the breakdown table says where a turn's time goes.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import time
import uuid
from collections import Counter
from collections.abc import AsyncGenerator, Awaitable, Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from agentstate.client import AsyncStateClient
from agentstate.common.embedded_postgres import EmbeddedPostgres
from agentstate.dev.processes import ServiceProcess
from bench.state_compare import POOL_SIZE, _database, _scratch_dir

APP = "shop"
USER = "bench"
QUESTION = "我的订单88235现在什么状态？ Where is order 88235?"
ORDER = {
    "orderNo": "88235",
    "items": ["Apple Watch Series 12", "strap"],
    "paid": "3378.00",
    "status": "已支付待发货",
    "placed": "2026-09-13 14:56",
}
ANSWER = "订单88235目前是已支付待发货 (paid, awaiting shipment)."


def lookup_order(order_no: str) -> dict[str, Any]:
    """Look an order up by its number."""
    return {**ORDER, "orderNo": order_no}


@dataclass
class TurnTime:
    framework: str
    store: str
    history_turns: int
    p50_ms: float
    p90_ms: float
    mean_ms: float
    turns: int


@dataclass
class Throughput:
    framework: str
    store: str
    writers: int
    turns_per_s: float


@dataclass
class Rpcs:
    framework: str
    history_turns: int
    turns: int
    # method -> (calls per turn, client-side ms per call, p50)
    per_turn: dict[str, tuple[float, float]] = field(default_factory=dict)


class CountingClient:
    """Counts and times every state-service call of a client (by RPC name)."""

    def __init__(self, client: AsyncStateClient) -> None:
        self.calls: Counter[str] = Counter()
        self.times: dict[str, list[float]] = {}
        self.enabled = False
        original = client._call

        async def counted(op: Any, timeout: float | None) -> Any:  # noqa: ASYNC109
            if not self.enabled:
                return await original(op, timeout)
            started = time.perf_counter()
            try:
                return await original(op, timeout)
            finally:
                self.calls[op.method] += 1
                self.times.setdefault(op.method, []).append((time.perf_counter() - started) * 1000)

        client._call = counted  # type: ignore[method-assign]

    def reset(self) -> None:
        self.calls.clear()
        self.times.clear()

    def summary(self, turns: int) -> dict[str, tuple[float, float]]:
        return {
            method: (n / turns, statistics.median(self.times[method]))
            for method, n in sorted(self.calls.items())
        }


# --------------------------------------------------------------------------- ADK


def adk_agent() -> Any:
    from google.adk.agents.llm_agent import LlmAgent
    from google.adk.models.base_llm import BaseLlm
    from google.adk.models.llm_request import LlmRequest
    from google.adk.models.llm_response import LlmResponse
    from google.genai import types

    class ScriptedLlm(BaseLlm):
        """Calls lookup_order, then answers once the request holds its response."""

        model: str = "scripted"

        async def generate_content_async(
            self, llm_request: LlmRequest, stream: bool = False
        ) -> AsyncGenerator[LlmResponse, None]:
            last = llm_request.contents[-1]
            if any(p.function_response for p in last.parts or []):
                part = types.Part(text=ANSWER)
            else:
                part = types.Part(
                    function_call=types.FunctionCall(
                        name="lookup_order", args={"order_no": "88235"}
                    )
                )
            yield LlmResponse(content=types.Content(role="model", parts=[part]))

    return LlmAgent(
        name="assistant", model=ScriptedLlm(), tools=[lookup_order], output_key="last_reply"
    )


class AdkTurns:
    def __init__(self, service: Any) -> None:
        from google.adk.runners import Runner

        self.service = service
        self.runner = Runner(agent=adk_agent(), app_name=APP, session_service=service)

    async def new_session(self) -> str:
        session = await self.service.create_session(
            app_name=APP, user_id=USER, state={"topic": "orders", "user:lang": "zh"}
        )
        return str(session.id)

    async def turn(self, session_id: str) -> None:
        from google.genai import types

        message = types.Content(role="user", parts=[types.Part(text=QUESTION)])
        async for _ in self.runner.run_async(
            user_id=USER, session_id=session_id, new_message=message
        ):
            pass


# ------------------------------------------------------------------------ OpenAI


def openai_agent() -> Any:
    from agents import Agent, function_tool
    from agents.items import ModelResponse
    from agents.models.interface import Model
    from agents.usage import Usage
    from openai.types.responses import (
        ResponseFunctionToolCall,
        ResponseOutputMessage,
        ResponseOutputText,
    )

    class ScriptedModel(Model):
        """Calls lookup_order, then answers once the input ends with its output."""

        async def get_response(
            self, system_instructions: str | None, input: Any, *args: Any, **kwargs: Any
        ) -> ModelResponse:
            last = input[-1] if isinstance(input, list) and input else {}
            if isinstance(last, dict) and last.get("type") == "function_call_output":
                output: list[Any] = [
                    ResponseOutputMessage(
                        id=f"msg-{uuid.uuid4().hex[:12]}",
                        type="message",
                        role="assistant",
                        status="completed",
                        content=[
                            ResponseOutputText(type="output_text", text=ANSWER, annotations=[])
                        ],
                    )
                ]
            else:
                output = [
                    ResponseFunctionToolCall(
                        id=f"fc-{uuid.uuid4().hex[:12]}",
                        call_id=f"call-{uuid.uuid4().hex[:12]}",
                        type="function_call",
                        name="lookup_order",
                        arguments='{"order_no": "88235"}',
                        status="completed",
                    )
                ]
            return ModelResponse(output=output, usage=Usage(), response_id=None)

        def stream_response(self, *args: Any, **kwargs: Any) -> Any:
            raise NotImplementedError

    return Agent(
        name="assistant",
        instructions="Answer briefly.",
        model=ScriptedModel(),
        tools=[function_tool(lookup_order)],
    )


class OpenAiTurns:
    def __init__(self, make_session: Callable[[str], Any]) -> None:
        self.agent = openai_agent()
        self.make_session = make_session
        self.sessions: dict[str, Any] = {}

    async def new_session(self) -> str:
        session_id = f"bench-{uuid.uuid4()}"
        self.sessions[session_id] = self.make_session(session_id)
        return session_id

    async def turn(self, session_id: str) -> None:
        from agents import Runner

        result = await Runner.run(self.agent, QUESTION, session=self.sessions[session_id])
        assert result.final_output == ANSWER, result.final_output


# ------------------------------------------------------------------------- runs


Turns = AdkTurns | OpenAiTurns


async def measure(
    framework: str,
    stores: dict[str, Turns],
    counter: CountingClient,
    histories: list[int],
    runs: int,
) -> tuple[list[TurnTime], list[Rpcs]]:
    rows, rpcs = [], []
    for history in histories:
        sessions = {name: await t.new_session() for name, t in stores.items()}
        for name, t in stores.items():  # the history, and warm connections
            for _ in range(max(history, 2)):
                await t.turn(sessions[name])
        samples: dict[str, list[float]] = {name: [] for name in stores}
        counter.reset()
        counter.enabled = True
        for _ in range(runs):
            for name, t in stores.items():  # alternate: load hits them alike
                started = time.perf_counter()
                await t.turn(sessions[name])
                samples[name].append((time.perf_counter() - started) * 1000)
        counter.enabled = False
        rpcs.append(Rpcs(framework, max(history, 2), runs, counter.summary(runs)))
        for name, values in samples.items():
            rows.append(
                TurnTime(
                    framework=framework,
                    store=name,
                    history_turns=max(history, 2),
                    p50_ms=statistics.median(values),
                    p90_ms=statistics.quantiles(values, n=10, method="inclusive")[8],
                    mean_ms=statistics.fmean(values),
                    turns=runs,
                )
            )
    return rows, rpcs


async def throughput(
    framework: str, stores: dict[str, Turns], writers: int, seconds: float
) -> list[Throughput]:
    rows = []
    for name, t in stores.items():
        sessions = [await t.new_session() for _ in range(writers)]
        for session_id in sessions:
            await t.turn(session_id)
        done = 0
        stop = time.perf_counter() + seconds

        async def writer(session_id: str, t: Turns = t, stop: float = stop) -> None:
            nonlocal done
            while time.perf_counter() < stop:
                await t.turn(session_id)
                done += 1

        started = time.perf_counter()
        await asyncio.gather(*(writer(s) for s in sessions))
        rows.append(Throughput(framework, name, writers, done / (time.perf_counter() - started)))
    return rows


async def run(args: argparse.Namespace) -> dict[str, Any]:
    from sqlalchemy.ext.asyncio import create_async_engine

    root = _scratch_dir()
    server = EmbeddedPostgres(root / "pgdata")
    server.start()
    service = None
    closers: list[Callable[[], Awaitable[object]]] = []
    frameworks = args.frameworks.split(",")
    histories = [int(h) for h in args.history.split(",")]
    result: dict[str, Any] = {"turns": [], "throughput": [], "rpcs": []}
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
        client = AsyncStateClient.connect(service.wait_ready())
        closers.append(client.close)
        counter = CountingClient(client)

        def sqlalchemy_url(name: str) -> str:
            dsn = dict(p.split("=", 1) for p in _database(server, name).split())
            return (
                f"postgresql+asyncpg://{dsn['user']}@/{dsn['dbname']}"
                f"?host={dsn['host']}&port={dsn['port']}"
            )

        all_stores: dict[str, dict[str, Turns]] = {}
        if "adk" in frameworks:
            from google.adk.sessions import DatabaseSessionService, InMemorySessionService

            from agentstate.integrations.adk import AgentStateSessionService

            database = DatabaseSessionService(
                sqlalchemy_url("adk"), pool_size=POOL_SIZE, max_overflow=0
            )
            closers.append(database.close)
            all_stores["adk"] = {
                "AgentStateSessionService": AdkTurns(AgentStateSessionService(client)),
                "DatabaseSessionService": AdkTurns(database),
                "InMemorySessionService": AdkTurns(InMemorySessionService()),
            }
        if "openai" in frameworks:
            from agents import SQLiteSession, set_tracing_disabled
            from agents.extensions.memory.sqlalchemy_session import SQLAlchemySession

            from agentstate.integrations.openai_agents import AgentStateSession

            set_tracing_disabled(True)
            engine = create_async_engine(
                sqlalchemy_url("openai"), pool_size=POOL_SIZE, max_overflow=0
            )
            closers.append(engine.dispose)
            sqlite_path = root / "sessions.sqlite3"
            all_stores["openai"] = {
                "AgentStateSession": OpenAiTurns(
                    lambda sid: AgentStateSession(sid, client=client, user_id=USER)
                ),
                "SQLAlchemySession": OpenAiTurns(
                    lambda sid: SQLAlchemySession(sid, engine=engine, create_tables=True)
                ),
                "SQLiteSession": OpenAiTurns(lambda sid: SQLiteSession(sid, str(sqlite_path))),
            }
        for framework, stores in all_stores.items():
            rows, rpcs = await measure(framework, stores, counter, histories, args.runs)
            result["turns"] += [asdict(r) for r in rows]
            result["rpcs"] += [asdict(r) for r in rpcs]
            postgres = {
                n: t for n, t in stores.items() if "InMemory" not in n and "SQLite" not in n
            }
            for writers in (1, 2):
                result["throughput"] += [
                    asdict(r) for r in await throughput(framework, postgres, writers, args.seconds)
                ]
        if "adk" in frameworks:
            result["list_sessions"] = await list_sessions_calls(client, counter)
        return result
    finally:
        for close in reversed(closers):
            await close()
        if service is not None:
            service.terminate()
        server.stop()
        shutil.rmtree(root, ignore_errors=True)


async def list_sessions_calls(
    client: AsyncStateClient, counter: CountingClient
) -> list[dict[str, Any]]:
    """ADK list_sessions: the calls and the time for a user holding N sessions."""
    from agentstate.integrations.adk import AgentStateSessionService

    service = AgentStateSessionService(client)
    rows = []
    for n in (10, 200, 1000):
        user = f"lister-{n}-{uuid.uuid4().hex[:8]}"
        for i in range(n):
            await service.create_session(
                app_name=APP, user_id=user, session_id=f"s{i}", state={"i": i}
            )
        counter.reset()
        counter.enabled = True
        started = time.perf_counter()
        listed = await service.list_sessions(app_name=APP, user_id=user)
        elapsed = (time.perf_counter() - started) * 1000
        counter.enabled = False
        assert len(listed.sessions) == n
        rows.append({"sessions": n, "calls": dict(counter.calls), "ms": elapsed})
    return rows


# ------------------------------------------------------------------------ output

OURS = {"adk": "AgentStateSessionService", "openai": "AgentStateSession"}
THEIRS = {"adk": "DatabaseSessionService", "openai": "SQLAlchemySession"}
FLOOR = {"adk": "InMemorySessionService", "openai": "SQLiteSession"}


def print_tables(result: dict[str, Any]) -> None:
    turns = [TurnTime(**r) for r in result["turns"]]
    for framework in dict.fromkeys(t.framework for t in turns):
        ours, theirs, floor = OURS[framework], THEIRS[framework], FLOOR[framework]
        print(
            f"\n{framework}: a Runner turn with one tool call (p50 / p90 ms)\n\n"
            f"| history turns | {ours} | {theirs} | {floor} | ratio p50 ours / {theirs} |\n"
            "|---:|---:|---:|---:|---:|"
        )
        for history in dict.fromkeys(t.history_turns for t in turns if t.framework == framework):
            by = {
                t.store: t for t in turns if (t.framework, t.history_turns) == (framework, history)
            }
            print(
                f"| {history} | {by[ours].p50_ms:.2f} / {by[ours].p90_ms:.2f} "
                f"| {by[theirs].p50_ms:.2f} / {by[theirs].p90_ms:.2f} "
                f"| {by[floor].p50_ms:.2f} / {by[floor].p90_ms:.2f} "
                f"| {by[ours].p50_ms / by[theirs].p50_ms:.2f}x |"
            )
    print("\nThroughput, turns per second (one session per writer)\n")
    print(
        "| framework | writers | ours | theirs (PostgreSQL) | ours / theirs |\n"
        "|---|---:|---:|---:|---:|"
    )
    thr = [Throughput(**r) for r in result["throughput"]]
    for framework, writers in dict.fromkeys((t.framework, t.writers) for t in thr):
        rate = {
            t.store: t.turns_per_s for t in thr if (t.framework, t.writers) == (framework, writers)
        }
        o, th = rate[OURS[framework]], rate[THEIRS[framework]]
        print(f"| {framework} | {writers} | {o:.1f} | {th:.1f} | {o / th:.2f} |")
    print("\nOur RPCs per turn (client-side p50 ms per call)\n")
    print(
        "| framework | history turns | RPC | calls per turn | p50 ms per call |\n"
        "|---|---:|---|---:|---:|"
    )
    for r in result["rpcs"]:
        for method, (per_turn, ms) in r["per_turn"].items():
            print(
                f"| {r['framework']} | {r['history_turns']} | {method} "
                f"| {per_turn:.2f} | {ms:.2f} |"
            )
    if result.get("list_sessions"):
        print("\nADK list_sessions of one user\n\n| sessions | calls | ms |\n|---:|---|---:|")
        for r in result["list_sessions"]:
            calls = ", ".join(f"{m} {n}" for m, n in sorted(r["calls"].items()))
            print(f"| {r['sessions']} | {calls} | {r['ms']:.1f} |")


def plot(result: dict[str, Any], out_dir: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir.mkdir(parents=True, exist_ok=True)
    turns = [TurnTime(**r) for r in result["turns"]]
    frameworks = list(dict.fromkeys(t.framework for t in turns))
    fig, axes = plt.subplots(1, len(frameworks), figsize=(5.5 * len(frameworks), 4), squeeze=False)
    for ax, framework in zip(axes[0], frameworks, strict=True):
        stores = [OURS[framework], THEIRS[framework], FLOOR[framework]]
        histories = list(dict.fromkeys(t.history_turns for t in turns if t.framework == framework))
        p50 = {(t.history_turns, t.store): t.p50_ms for t in turns if t.framework == framework}
        width = 0.27
        for i, store in enumerate(stores):
            values = [p50[(h, store)] for h in histories]
            bars = ax.bar(
                [x + i * width for x in range(len(histories))], values, width, label=store
            )
            ax.bar_label(bars, fmt="%.1f", fontsize=8)
        ax.set_xticks(
            [x + width for x in range(len(histories))], [f"{h} turns before" for h in histories]
        )
        ax.set_ylabel("p50 ms per Runner turn")
        ax.set_title(f"{framework}: a Runner turn with one tool call")
        ax.set_ylim(top=ax.get_ylim()[1] * 1.15)
        ax.grid(axis="y", alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    path = out_dir / "sessions.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--runs", type=int, default=40, help="measured turns per store")
    parser.add_argument("--history", default="0,20", help="turns in the session before")
    parser.add_argument("--seconds", type=float, default=5.0, help="per throughput run")
    parser.add_argument("--frameworks", default="adk,openai")
    parser.add_argument("--plots", type=Path, help="write the PNG plot into this directory")
    parser.add_argument("--json", type=Path, help="write the results as JSON")
    parser.add_argument("--replot", type=Path, help="print and plot an earlier --json")
    args = parser.parse_args()
    if args.replot:
        result = json.loads(args.replot.read_text())
    else:
        print(
            f"{os.cpu_count()} cores; PostgreSQL embedded, fsync on; {args.runs} turns per "
            f"store, histories {args.history}",
            flush=True,
        )
        result = asyncio.run(run(args))
        if args.json:
            args.json.write_text(json.dumps(result, indent=1))
    print_tables(result)
    if args.plots:
        print(f"wrote {plot(result, args.plots)}")


if __name__ == "__main__":
    main()
