"""A bounded soak: mixed turns at moderate load against 4 state-service processes.

Starts a throwaway PostgreSQL (system binaries) and 4 state-service processes on it,
then runs callers at a fixed total rate for `--minutes`: turns (BeginTurn + EndTurn,
growing conversations), compare-and-set writes, reads and deletes. Every `--every`
seconds it samples the processes' RSS and open file descriptors, the database's
connections and the p99 of turn latency in that window; at the end it compares the
samples after warm-up with the first one and writes a plot and a JSON file.

    .venv/bin/pip install -e '.[bench]'          # matplotlib
    .venv/bin/python -m bench.soak [--minutes 10] [--rate 40] [--out docs/img]

Targets: after warm-up, RSS and fds flat (<= 5 % growth) and p99 not rising.
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
from dataclasses import asdict, dataclass
from pathlib import Path

import grpc
import psycopg

from agentstate.common.embedded_postgres import EmbeddedPostgres
from agentstate.dev.processes import ServiceProcess
from agentstate.state.v1 import state_service_pb2 as pb
from agentstate.state.v1 import state_service_pb2_grpc as pb_grpc

PROCESSES = 4
USER = "soak"


@dataclass
class Sample:
    t: float  # seconds since the load started
    rss_mib: float  # the 4 processes together
    fds: int  # the 4 processes together
    db_connections: int
    turns: int  # in this window
    p50_ms: float
    p99_ms: float
    errors: int


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def fd_count(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def percentile(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


class Load:
    def __init__(
        self, stubs: list[pb_grpc.StateServiceAsyncStub], rate: float, callers: int
    ) -> None:
        self.stubs = stubs
        self.interval = callers / rate  # each caller's pace
        self.callers = callers
        self.latencies: list[float] = []
        self.errors = 0
        self.error_codes: dict[str, int] = {}
        self.conversations: list[str] = []

    async def turn(
        self, stub: pb_grpc.StateServiceAsyncStub, rng: random.Random, *, new: bool = False
    ) -> None:
        cid = "" if new or not self.conversations else rng.choice(self.conversations)
        start = time.perf_counter()
        begun = await stub.BeginTurn(
            pb.BeginTurnRequest(
                user_id=USER,
                conversation_id=cid,
                holder="soak",
                ttl_ms=10_000,
                new_messages=[
                    pb.NewMessage(
                        role=pb.MESSAGE_ROLE_USER,
                        blocks_json=b'[{"type":"text","text":"soak question"}]',
                    ),
                    pb.NewMessage(
                        role=pb.MESSAGE_ROLE_ASSISTANT, status=pb.MESSAGE_STATUS_STREAMING
                    ),
                ],
            ),
            timeout=10,
        )
        state = json.loads(begun.payload or b"{}")
        history = [*state.get("history", [])[-40:], "x" * 200]
        await stub.EndTurn(
            pb.EndTurnRequest(
                user_id=USER,
                conversation_id=begun.conversation.conversation_id,
                task_id=begun.lease.task_id,
                payload=json.dumps({"history": history}).encode(),
                expected_version=begun.version,
                message_writes=[
                    pb.MessageWrite(
                        update=pb.MessageUpdate(
                            message_id=begun.messages[1].message_id,
                            status=pb.MESSAGE_STATUS_NORMAL,
                            blocks_json=b'[{"type":"text","text":"soak answer"}]',
                        )
                    )
                ],
            ),
            timeout=10,
        )
        self.latencies.append((time.perf_counter() - start) * 1000)
        if not cid:
            self.conversations.append(begun.conversation.conversation_id)

    async def other(self, stub: pb_grpc.StateServiceAsyncStub, rng: random.Random) -> None:
        if not self.conversations:
            return
        roll = rng.random()
        if roll < 0.6:
            await stub.ListMessages(
                pb.ListMessagesRequest(
                    user_id=USER, conversation_id=rng.choice(self.conversations), page_size=20
                ),
                timeout=10,
            )
        elif len(self.conversations) > 200:
            # Keep the data set bounded: delete the oldest conversations.
            doomed = self.conversations[:5]
            del self.conversations[:5]
            await stub.BatchDeleteConversations(
                pb.BatchDeleteConversationsRequest(user_id=USER, conversation_ids=doomed),
                timeout=10,
            )

    async def caller(self, me: int, stop_at: float) -> None:
        rng = random.Random(me)
        stub = self.stubs[me % len(self.stubs)]
        next_at = time.monotonic() + rng.random() * self.interval
        while time.monotonic() < stop_at:
            await asyncio.sleep(max(0.0, next_at - time.monotonic()))
            next_at += self.interval
            try:
                if rng.random() < 0.2 and len(self.conversations) < 400:
                    # A new conversation now and then; most turns continue one.
                    await self.turn(stub, rng, new=True)
                elif rng.random() < 0.75:
                    await self.turn(stub, rng)
                else:
                    await self.other(stub, rng)
            except grpc.aio.AioRpcError as exc:
                if exc.code() != grpc.StatusCode.FAILED_PRECONDITION:  # lease held: expected
                    self.errors += 1
                    name = exc.code().name
                    self.error_codes[name] = self.error_codes.get(name, 0) + 1


async def soak(
    args: argparse.Namespace, addresses: list[str], pids: list[int], dsn: str
) -> list[Sample]:
    channels = [grpc.aio.insecure_channel(a) for a in addresses]
    stubs: list[pb_grpc.StateServiceAsyncStub] = [pb_grpc.StateServiceStub(c) for c in channels]
    load = Load(stubs, args.rate, args.callers)
    start = time.monotonic()
    stop_at = start + args.minutes * 60
    tasks = [asyncio.create_task(load.caller(i, stop_at)) for i in range(args.callers)]
    samples: list[Sample] = []
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        while time.monotonic() < stop_at:
            await asyncio.sleep(args.every)
            window, load.latencies = load.latencies, []
            errors, load.errors = load.errors, 0
            cur = await conn.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                "AND pid <> pg_backend_pid()"
            )
            row = await cur.fetchone()
            sample = Sample(
                t=round(time.monotonic() - start, 1),
                rss_mib=round(sum(rss_kib(p) for p in pids) / 1024, 1),
                fds=sum(fd_count(p) for p in pids),
                db_connections=int(row[0]) if row else 0,
                turns=len(window),
                p50_ms=round(percentile(window, 0.50), 2),
                p99_ms=round(percentile(window, 0.99), 2),
                errors=errors,
            )
            samples.append(sample)
            print(
                f"{sample.t:7.1f}s  rss {sample.rss_mib:7.1f} MiB  fds {sample.fds:4d}  "
                f"db conns {sample.db_connections:3d}  turns {sample.turns:5d}  "
                f"p50 {sample.p50_ms:6.2f} ms  p99 {sample.p99_ms:7.2f} ms  errors {errors}",
                flush=True,
            )
    await asyncio.gather(*tasks)
    print(f"errors by status: {load.error_codes}")
    for channel in channels:
        await channel.close(None)
    return samples


def verdict(samples: list[Sample], warmup_s: float) -> dict[str, object]:
    steady = [s for s in samples if s.t >= warmup_s]
    first, last = steady[0], steady[-1]
    half = len(steady) // 2
    p99_first = statistics.median(s.p99_ms for s in steady[:half])
    p99_second = statistics.median(s.p99_ms for s in steady[half:])
    return {
        "warmup_s": warmup_s,
        "rss_growth_pct": round((last.rss_mib / first.rss_mib - 1) * 100, 2),
        "rss_max_growth_pct": round((max(s.rss_mib for s in steady) / first.rss_mib - 1) * 100, 2),
        "fds_growth_pct": round((last.fds / first.fds - 1) * 100, 2),
        "p99_median_first_half_ms": p99_first,
        "p99_median_second_half_ms": p99_second,
        "turns": sum(s.turns for s in samples),
        "errors": sum(s.errors for s in samples),
    }


def plot(samples: list[Sample], warmup_s: float, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t = [s.t / 60 for s in samples]
    fig, axes = plt.subplots(4, 1, figsize=(8, 9), sharex=True)
    series = [
        ("RSS, 4 processes (MiB)", [s.rss_mib for s in samples]),
        ("open fds, 4 processes", [s.fds for s in samples]),
        ("database connections", [s.db_connections for s in samples]),
        ("turn latency p99 / p50 (ms)", [s.p99_ms for s in samples]),
    ]
    for ax, (label, values) in zip(axes, series, strict=True):
        ax.plot(t, values, marker=".")
        ax.set_ylabel(label, fontsize=8)
        ax.axvline(warmup_s / 60, color="grey", linestyle=":")
        ax.set_ylim(bottom=0)
    axes[3].plot(t, [s.p50_ms for s in samples], marker=".", color="tab:green")
    axes[3].set_xlabel("minutes (dotted: end of warm-up)")
    fig.suptitle("bench/soak.py: 4 state-service processes, mixed turns", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--rate", type=float, default=40.0, help="calls per second, all callers")
    parser.add_argument("--callers", type=int, default=16)
    parser.add_argument("--every", type=float, default=10.0, help="seconds between samples")
    parser.add_argument("--warmup", type=float, default=60.0, help="seconds")
    parser.add_argument("--out", type=Path, default=Path("docs/img"))
    args = parser.parse_args()

    root = Path(tempfile.mkdtemp(prefix="agentstate-soak-", dir="/var/tmp"))
    root.chmod(0o755)
    server = EmbeddedPostgres(root / "pgdata")
    dsn = server.start()
    processes: list[ServiceProcess] = []
    try:
        env = {
            "STATE_STORE": "postgres",
            "DATABASE_URL": dsn,
            "STATE_LISTEN_ADDRESS": "127.0.0.1:0",
            "STATE_DB_POOL_MAX_SIZE": "4",
        }
        processes = [ServiceProcess("agentstate.state_service", env, "serve")]
        processes[0].wait_ready()  # migrations first, then the rest
        processes += [ServiceProcess("agentstate.state_service", env, "serve") for _ in range(3)]
        addresses = [p.wait_ready() for p in processes]
        pids = [p.proc.pid for p in processes]
        samples = asyncio.run(soak(args, addresses, pids, dsn))
    finally:
        for p in processes:
            p.terminate()
        server.stop()
        shutil.rmtree(root, ignore_errors=True)
    result = verdict(samples, args.warmup)
    print(json.dumps(result, indent=2))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "soak.json").write_text(
        json.dumps({"result": result, "samples": [asdict(s) for s in samples]}, indent=1) + "\n"
    )
    plot(samples, args.warmup, args.out / "soak.png")
    print(f"wrote {args.out / 'soak.png'} and {args.out / 'soak.json'}")


if __name__ == "__main__":
    main()
