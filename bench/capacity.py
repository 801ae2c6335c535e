"""The state service's capacity: CPU per call, workers 1 and 2, and a run past capacity.

    .venv/bin/python -m bench.capacity [--seconds 20] [--overload-seconds 60]
                                       [--only cpu,workers,overload]

Each measurement starts its own state-service process (on one embedded PostgreSQL) and
drives it with bench.load processes (the load generator; its CPU is not the service's):

- **cpu**: 8 callers, closed loop, the runtime's turn (BeginTurn with `cached_version` +
  EndTurn with a delta) at 8 messages. The service's process CPU time (user + system, of
  every worker, from /proc) over the measured window, divided by the calls served.
- **workers**: STATE_WORKERS=1 and 2, the same offered load (2 load processes x 16
  callers on 8 connections each, closed loop), calls per second.
- **overload**: one worker with the default caps (32 in flight, 32 queued). Its capacity
  is what the workers run measured for one worker; the load is open loop (Poisson
  arrivals), 0.2x capacity for 10 s, 5x for `--overload-seconds`, 0.2x for 10 s. Per
  phase: statuses, the admitted calls' p50/p99, the refusals' latency; then every
  conversation's stored version against the last one the generator was acknowledged.

Prints tables (and `uptime`), writes bench/capacity-<date>.json (or `--json FILE`).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
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

TICKS = os.sysconf("SC_CLK_TCK")


def process_cpu_seconds(pid: int) -> float:
    """user + system CPU of `pid` and of its live children (the workers)."""
    pids = [pid]
    children = Path(f"/proc/{pid}/task/{pid}/children")
    if children.exists():
        pids += [int(p) for p in children.read_text().split()]
    total = 0.0
    for p in pids:
        try:
            fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
        except FileNotFoundError:
            continue
        total += (int(fields[11]) + int(fields[12])) / TICKS  # utime, stime
    return total


def uptime() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True, check=False).stdout.strip()


class Bench:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.pg = EmbeddedPostgres(root / "pgdata")
        self.pg.start()
        self.n = 0

    def database(self) -> str:
        self.n += 1
        name = f"capacity_{self.n}"
        with psycopg.connect(self.pg.dsn, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            conn.execute(f'CREATE DATABASE "{name}"')
        return self.pg.dsn.replace("dbname=postgres", f"dbname={name}")

    def service(self, **settings: str) -> tuple[ServiceProcess, str]:
        process = ServiceProcess(
            "agentstate.state_service",
            {
                "STATE_LISTEN_ADDRESS": "127.0.0.1:0",
                "STATE_STORE": "postgres",
                "DATABASE_URL": self.database(),
                **settings,
            },
        )
        return process, process.wait_ready(120)

    def load(
        self, address: str, *args: str, count: int = 1, service_pid: int = 0
    ) -> tuple[list[dict[str, Any]], float]:
        """`count` bench.load processes with `args`, started together: their results, and
        the CPU seconds `service_pid` (with its workers) used from the moment every
        generator finished its warm-up to the end."""
        ready = [self.root / f"ready-{self.n}-{i}" for i in range(count)]
        procs = [
            subprocess.Popen(
                [sys.executable, "-m", "bench.load", address, *args, "--ready-file", str(r)],
                stdout=subprocess.PIPE,
                text=True,
            )
            for r in ready
        ]
        while not all(r.exists() for r in ready):
            if any(p.poll() is not None for p in procs):
                raise RuntimeError("a load generator exited before it was ready")
            time.sleep(0.02)
        cpu0 = process_cpu_seconds(service_pid) if service_pid else 0.0
        outputs = [p.communicate()[0] for p in procs]
        cpu = process_cpu_seconds(service_pid) - cpu0 if service_pid else 0.0
        return [json.loads(o.strip().splitlines()[-1]) for o in outputs], cpu


def _ok(result: dict[str, Any]) -> int:
    return sum(int(p["statuses"].get("OK", 0)) for p in result["phases"])


def measure_cpu(bench: Bench, seconds: float) -> dict[str, Any]:
    service, address = bench.service(STATE_DB_POOL_MAX_SIZE="8")
    try:
        results, cpu = bench.load(
            address, "--op", "turn", "--callers", "8", "--seconds", str(seconds),
            service_pid=service.proc.pid,
        )  # fmt: skip
        result = results[0]
        calls = _ok(result)
        phase = result["phases"][0]
        return {
            "calls": calls,
            "wall_s": result["wall_s"],
            "calls_per_s": calls / result["wall_s"],
            "service_cpu_s": cpu,
            "service_cpu_ms_per_call": cpu * 1000 / calls,
            "generator_cpu_ms_per_call": result["cpu_s"] * 1000 / calls,
            "p50_ms": phase.get("p50_ms"),
            "p99_ms": phase.get("p99_ms"),
            "statuses": phase["statuses"],
        }
    finally:
        service.terminate()


def measure_workers(bench: Bench, workers: int, seconds: float) -> dict[str, Any]:
    service, address = bench.service(STATE_WORKERS=str(workers), STATE_DB_POOL_MAX_SIZE="6")
    try:
        results, cpu = bench.load(
            address, "--op", "turn", "--callers", "16", "--channels", "8",
            "--seconds", str(seconds), count=2, service_pid=service.proc.pid,
        )  # fmt: skip
        calls = sum(_ok(r) for r in results)
        wall = max(r["wall_s"] for r in results)
        statuses: dict[str, int] = {}
        for r in results:
            for k, v in r["phases"][0]["statuses"].items():
                statuses[k] = statuses.get(k, 0) + v
        return {
            "workers": workers,
            "calls": calls,
            "calls_per_s": calls / wall,
            "p50_ms": [r["phases"][0].get("p50_ms") for r in results],
            "p99_ms": [r["phases"][0].get("p99_ms") for r in results],
            "service_cpu_ms_per_call": cpu * 1000 / calls,
            "statuses": statuses,
        }
    finally:
        service.terminate()


def measure_overload(
    bench: Bench, capacity_calls_per_s: float, seconds: float, caps: tuple[int, int]
) -> dict[str, Any]:
    service, address = bench.service(
        STATE_DB_POOL_MAX_SIZE="8",
        STATE_MAX_CALLS_IN_FLIGHT=str(caps[0]),
        STATE_MAX_QUEUED_CALLS=str(caps[1]),
    )
    try:
        turns_per_s = capacity_calls_per_s / 2  # a turn is two calls
        rates = [0.2 * turns_per_s, 5 * turns_per_s, 0.2 * turns_per_s]
        # Two generators, each half the rate: one Python process cannot offer 5x alone.
        results, _ = bench.load(
            address, "--op", "turn", "--conversations", "512", "--outstanding", "1024",
            "--rate", ",".join(f"{r / 2:.1f}" for r in rates),
            "--phases", f"10,{seconds:.0f},10", "--channels", "4", count=2,
        )  # fmt: skip
        lost = _lost(address, results)
        phases = []
        for i, name in enumerate(["before (0.2x)", "overload (5x)", "after (0.2x)"]):
            merged: dict[str, Any] = {"phase": name, "offered_turns_per_s": rates[i]}
            statuses: dict[str, int] = {}
            for r in results:
                for k, v in r["phases"][i]["statuses"].items():
                    statuses[k] = statuses.get(k, 0) + v
            merged["statuses"] = statuses
            merged["errors"] = [e for r in results for e in r["phases"][i]["errors"]]
            merged["ok_calls_per_s"] = sum(r["phases"][i]["ok_per_s"] for r in results)
            for key in ("p50_ms", "p99_ms", "refused_p50_ms", "refused_p99_ms"):
                values = [r["phases"][i][key] for r in results if key in r["phases"][i]]
                merged[key] = max(values) if values else None
            phases.append(merged)
        return {
            "capacity_calls_per_s": capacity_calls_per_s,
            "max_calls_in_flight": caps[0],
            "max_queued_calls": caps[1],
            "phases": phases,
            "not_started": sum(r["not_started"] for r in results),
            "lost": lost,
            "conversations": sum(len(r["acknowledged"]) for r in results),
        }
    finally:
        service.terminate()


def _lost(address: str, results: list[dict[str, Any]]) -> list[str]:
    """Conversations whose stored version is not the last one acknowledged."""
    lost = []
    with grpc.insecure_channel(address) as channel:
        stub = pb_grpc.StateServiceStub(channel)
        for r in results:
            for cid, version in r["acknowledged"].items():
                got = stub.GetState(pb.GetStateRequest(user_id="bench", conversation_id=cid))
                if got.version != version:
                    lost.append(f"{cid}: stored {got.version}, acknowledged {version}")
    return lost


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--overload-seconds", type=float, default=60.0)
    parser.add_argument("--only", default="cpu,workers,overload")
    parser.add_argument(
        "--caps", default="32,32", help="overload: STATE_MAX_CALLS_IN_FLIGHT,STATE_MAX_QUEUED_CALLS"
    )
    parser.add_argument(
        "--capacity", type=float, default=0.0, help="overload: calls/s (else measured)"
    )
    parser.add_argument(
        "--json", type=Path, help="where to write the report (else bench/capacity-DATE.json)"
    )
    args = parser.parse_args()
    only = set(args.only.split(","))
    root = Path(tempfile.mkdtemp(prefix="agentstate-capacity-"))
    root.chmod(0o755)  # the postgres user must reach the data directory
    bench = Bench(root)
    report: dict[str, Any] = {"uptime_before": uptime(), "cores": os.cpu_count()}
    print(report["uptime_before"], flush=True)
    try:
        if "cpu" in only:
            report["cpu"] = cpu = measure_cpu(bench, args.seconds)
            print(
                f"CPU per call (8 callers, turn, 8 messages): service "
                f"{cpu['service_cpu_ms_per_call']:.3f} ms, {cpu['calls_per_s']:.0f} calls/s, "
                f"p50 {cpu['p50_ms']:.2f} ms p99 {cpu['p99_ms']:.2f} ms",
                flush=True,
            )
        report["workers"] = []
        if "workers" in only or ("overload" in only and not args.capacity):
            for count in (1, 2) if "workers" in only else (1,):
                w = measure_workers(bench, count, args.seconds)
                report["workers"].append(w)
                print(
                    f"workers {count}: {w['calls_per_s']:.0f} calls/s, service CPU "
                    f"{w['service_cpu_ms_per_call']:.3f} ms/call, statuses {w['statuses']}",
                    flush=True,
                )
            if len(report["workers"]) == 2:
                ratio = report["workers"][1]["calls_per_s"] / report["workers"][0]["calls_per_s"]
                report["workers_ratio"] = ratio
                print(f"workers 2 / 1: {ratio:.2f}x", flush=True)
        if "overload" in only:
            capacity = args.capacity or report["workers"][0]["calls_per_s"]
            in_flight, queued = (int(x) for x in args.caps.split(","))
            report["overload"] = o = measure_overload(
                bench, capacity, args.overload_seconds, (in_flight, queued)
            )
            print(f"overload, capacity {capacity:.0f} calls/s, caps {args.caps}:", flush=True)
            for p in o["phases"]:
                print(
                    f"  {p['phase']}: offered {p['offered_turns_per_s']:.0f} turns/s, "
                    f"served {p['ok_calls_per_s']:.0f} calls/s, p50 {p['p50_ms']} p99 "
                    f"{p['p99_ms']} ms, refusals p99 {p['refused_p99_ms']} ms, {p['statuses']}",
                    flush=True,
                )
            for p in o["phases"]:
                if p["errors"]:
                    print(f"  {p['phase']} errors: {p['errors']}", flush=True)
            print(
                f"  not started (generator's own bound): {o['not_started']}; lost: "
                f"{len(o['lost'])} of {o['conversations']} conversations",
                flush=True,
            )
        report["uptime_after"] = uptime()
        print(report["uptime_after"], flush=True)
    finally:
        bench.pg.stop()
        shutil.rmtree(root, ignore_errors=True)
    out = args.json or Path(__file__).with_name(f"capacity-{datetime.now(UTC):%Y-%m-%d}.json")
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
