"""Latency of GetState and UpsertState through gRPC, as a client sees it.

Starts the state service as its own process (on a throwaway embedded
PostgreSQL, or DATABASE_URL if set) and calls it over 127.0.0.1 from this
process with the synchronous Python client, one call at a time.

    .venv/bin/python -m bench.state_latency [--calls 1000] [--store postgres|memory]

Prints a table; results are recorded in docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc

from agentstate.dev.processes import ServiceProcess
from agentstate.state.v1 import state_service_pb2 as pb
from agentstate.state.v1 import state_service_pb2_grpc as pb_grpc
from tests.support.source_example import source_agent_state


def grown_state(messages: int) -> dict[str, Any]:
    """The source's state with its context repeated up to `messages` messages."""
    state = source_agent_state()
    base = state["context"]
    state["context"] = [dict(base[i % len(base)], id=f"m{i}") for i in range(messages)]
    return state


def percentiles(samples_ms: list[float]) -> tuple[float, float, float]:
    ordered = sorted(samples_ms)
    q = statistics.quantiles(ordered, n=100, method="inclusive")
    return statistics.median(ordered), q[89], q[98]


def timed(calls: int, fn: Callable[[], object]) -> list[float]:
    for _ in range(min(50, calls)):  # warm up connections and prepared statements
        fn()
    samples = []
    for _ in range(calls):
        start = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - start) * 1000)
    return samples


def run(
    address: str, calls: int, sizes: list[int]
) -> list[tuple[str, int, int, float, float, float]]:
    rows = []
    with grpc.insecure_channel(address) as channel:
        stub = pb_grpc.StateServiceStub(channel)
        for messages in sizes:
            payload = json.dumps(grown_state(messages), ensure_ascii=False).encode()
            cid = stub.CreateConversation(
                pb.CreateConversationRequest(user_id="bench")
            ).conversation.conversation_id
            version = stub.UpsertState(
                pb.UpsertStateRequest(user_id="bench", conversation_id=cid, payload=payload)
            ).version

            def upsert(payload: bytes = payload, cid: str = cid) -> None:
                nonlocal version
                version = stub.UpsertState(
                    pb.UpsertStateRequest(
                        user_id="bench",
                        conversation_id=cid,
                        payload=payload,
                        expected_version=version,
                    )
                ).version

            def get(cid: str = cid) -> None:
                stub.GetState(pb.GetStateRequest(user_id="bench", conversation_id=cid))

            n = calls if messages <= 8 else max(50, calls // 10)
            for name, fn in (("GetState", get), ("UpsertState (CAS)", upsert)):
                p50, p90, p99 = percentiles(timed(n, fn))
                rows.append((name, messages, len(payload), p50, p90, p99))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=1000)
    database_url = os.environ.get("DATABASE_URL", "")
    parser.add_argument(
        "--store",
        choices=["embedded", "postgres", "memory"],
        default="postgres" if database_url else "embedded",
    )
    parser.add_argument("--sizes", default="8,200", help="context sizes in messages")
    args = parser.parse_args()
    data_root = Path(tempfile.mkdtemp(prefix="agentstate-bench-"))
    data_root.chmod(0o755)
    env = {
        "STATE_LISTEN_ADDRESS": "127.0.0.1:0",
        "STATE_STORE": args.store,
        "STATE_EMBEDDED_PG_DIR": str(data_root / "pgdata"),
        "DATABASE_URL": database_url if args.store == "postgres" else "",
    }
    service = ServiceProcess("agentstate.state_service", env)
    try:
        address = service.wait_ready()
        rows = run(address, args.calls, [int(s) for s in args.sizes.split(",")])
    finally:
        service.terminate()
        shutil.rmtree(data_root, ignore_errors=True)
    print(f"store={args.store} calls={args.calls} (fewer for large states), sequential, 127.0.0.1")
    print(
        f"{'RPC':<18} {'messages':>8} {'payload B':>10} {'p50 ms':>8} {'p90 ms':>8} {'p99 ms':>8}"
    )
    for name, messages, size, p50, p90, p99 in rows:
        print(f"{name:<18} {messages:>10} {size:>10} {p50:>10.2f} {p90:>10.2f} {p99:>10.2f}")


if __name__ == "__main__":
    main()
