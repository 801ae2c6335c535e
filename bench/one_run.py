"""Every side-by-side table of docs/benchmarks.md in one run, old and new (issue 26 item 6).

    .venv/bin/pip install -e '.[bench]'      # LangGraph's savers and matplotlib
    git archive <old commit> src | tar -x -C /tmp/old       # the old code's src/
    .venv/bin/python -m bench.one_run --before /tmp/old/src --out /tmp/one-run
        [--plots /tmp/one-run-img]

One bench after the other, on this machine, nothing else running (each starts its own
embedded PostgreSQL, fsync on, and interleaves or alternates its contenders within itself):

1. bench.state_compare: GetState, UpsertState and EndTurn p50 at 8, 64 and 512 messages,
   ours over gRPC (new, and old with `--before`) against the same store in-process, a
   plain JSONB row and LangGraph's AsyncPostgresSaver; turns per second at 1, 8 and 32
   callers.
2. bench.small_state (save, turns): the save function in-process against a plain JSONB
   upsert; the runtime's turn at 8 callers against LangGraph's shared saver; CPU per
   call with its floors (a bare gRPC server, the guards, the memory store) and old's.
3. bench.capacity: CPU per call from separate load processes, workers 1 and 2, and the
   overload run (5x capacity for `--overload-seconds`).
4. bench.langgraph_saver: a LangGraph step against AsyncPostgresSaver and PostgresSaver,
   two graphs at once, and issue 7259's 200 concurrent users.
5. bench.encryption: GetState, BeginTurn and EndTurn with encryption at rest on and off.

Each bench's output goes to OUT/NAME.txt and its results to OUT/NAME.json; OUT/run.json
says what ran, when, for how long and at what load. `--plots` writes the benches' own
plots there under their own names, and one_run_capacity.png (CPU per call, workers, the
overload phases). docs/benchmarks.md keeps them as docs/img/one_run_*.png, since the
benches' own names there belong to earlier runs."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any


def steps(args: argparse.Namespace) -> list[tuple[str, list[str]]]:
    """(name, the bench's module and arguments), in the order they run."""
    out: Path = args.out
    before = ["--before", args.before] if args.before else []
    plots = ["--plots", str(args.plots)] if args.plots else []
    return [
        ("state_compare", ["bench.state_compare", *before, *plots,
                           "--json", str(out / "state_compare.json")]),
        ("small_state", ["bench.small_state", "--parts", "save,turns", "--floor", *before,
                         "--json", str(out / "small_state.json")]),
        ("capacity", ["bench.capacity", "--overload-seconds", str(args.overload_seconds),
                      "--json", str(out / "capacity.json")]),
        ("langgraph_saver", ["bench.langgraph_saver", "--writers", "2", "--users", "200",
                             *plots, "--json", str(out / "langgraph_saver.json")]),
        ("encryption", ["bench.encryption", "--json", str(out / "encryption.json")]),
    ]  # fmt: skip


def run_step(name: str, command: list[str], out: Path) -> dict[str, Any]:
    started = time.time()
    load_before = os.getloadavg()
    with (out / f"{name}.txt").open("w") as log:
        done = subprocess.run(
            [sys.executable, "-m", *command], stdout=log, stderr=subprocess.STDOUT, check=False
        )
    return {
        "bench": name,
        "command": " ".join(["python", "-m", *command]),
        "returncode": done.returncode,
        "started": datetime.fromtimestamp(started, UTC).isoformat(timespec="seconds"),
        "seconds": round(time.time() - started, 1),
        "load_average_before": load_before,
        "load_average_after": os.getloadavg(),
    }


def plot_capacity(report: dict[str, Any], out_dir: Path) -> Path:
    """CPU per call, workers 1 and 2, and the overload run's phases, from bench.capacity."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    cpu = axes[0]
    workers = report.get("workers", [])
    labels = [f"{w['workers']} worker{'s' if w['workers'] > 1 else ''}" for w in workers]
    cpu_rows = ([("8 callers", report["cpu"])] if "cpu" in report else []) + list(
        zip(labels, workers, strict=True)
    )
    cpu.bar([label for label, _ in cpu_rows], [r["service_cpu_ms_per_call"] for _, r in cpu_rows])
    cpu.axhline(0.5, color="red", linestyle="--", label="target 0.5 ms")
    cpu.set_ylabel("state-service CPU ms per call")
    cpu.set_title("CPU per call")
    cpu.legend()
    rate = axes[1]
    rate.bar(labels, [w["calls_per_s"] for w in workers])
    rate.set_ylabel("calls per second")
    rate.set_title("workers (target: 2 give 1.7x)")
    phases = report.get("overload", {}).get("phases", [])
    names = [p["phase"] for p in phases]
    latency = axes[2]
    x = range(len(names))
    latency.bar([i - 0.2 for i in x], [p["p50_ms"] or 0 for p in phases], 0.4, label="p50")
    latency.bar([i + 0.2 for i in x], [p["p99_ms"] or 0 for p in phases], 0.4, label="p99")
    latency.set_xticks(list(x), names)
    latency.legend()
    latency.set_ylabel("admitted calls, ms")
    latency.set_title("overload: 0.2x, 5x, 0.2x capacity")
    for ax in axes:
        ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "one_run_capacity.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def main() -> None:
    parser = argparse.ArgumentParser(prog="bench.one_run", description=__doc__)
    parser.add_argument("--out", type=Path, required=True, help="a directory for the results")
    parser.add_argument("--before", help="the old code's src/ (git archive of a commit)")
    parser.add_argument("--plots", type=Path, help="write the PNG plots into this directory")
    parser.add_argument("--overload-seconds", type=float, default=60.0)
    parser.add_argument("--only", default="", help="run only these benches (comma-separated)")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    only = set(filter(None, args.only.split(",")))
    ran = []
    for name, command in steps(args):
        if only and name not in only:
            continue
        print(f"{name}: {' '.join(command)}", flush=True)
        ran.append(run_step(name, command, args.out))
        print(f"  {ran[-1]['seconds']} s, exit {ran[-1]['returncode']}", flush=True)
    (args.out / "run.json").write_text(
        json.dumps({"cores": os.cpu_count(), "before": args.before, "benches": ran}, indent=1)
    )
    capacity = args.out / "capacity.json"
    if args.plots and capacity.exists():
        print(f"wrote {plot_capacity(json.loads(capacity.read_text()), args.plots)}")
    if any(step["returncode"] for step in ran):
        sys.exit(1)


if __name__ == "__main__":
    main()
