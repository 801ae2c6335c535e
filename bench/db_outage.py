"""What a client of the state service sees when its PostgreSQL goes away and comes back.

Starts a throwaway PostgreSQL (system binaries) and the state service as its own process
on it, keeps 4 callers busy (UpsertState then GetState, each with a 10 s deadline) and a
health watcher (grpc.health.v1 Check every 50 ms), stops PostgreSQL (`pg_ctl stop -m fast`)
for --outage seconds, starts it again and reports:

- how long each call made during the outage waited before failing, and with which status;
- recovery: from `pg_ctl start` returning (the server accepts connections) to the first
  successful call, and to health SERVING again;
- when health went NOT_SERVING after the stop.

    .venv/bin/python -m bench.db_outage [--outage 60] [--rounds 1]

Results are recorded in docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import functools
import shutil
import statistics
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from agentstate.common.embedded_postgres import EmbeddedPostgres
from agentstate.dev.processes import ServiceProcess
from agentstate.state.v1 import state_service_pb2 as pb
from agentstate.state.v1 import state_service_pb2_grpc as pb_grpc

SERVICE = "agentstate.state.v1.StateService"
CALLERS = 4


@dataclass
class Call:
    start: float
    end: float
    code: grpc.StatusCode
    details: str = ""


@dataclass
class Recorder:
    calls: list[Call] = field(default_factory=list)
    health: list[tuple[float, str]] = field(default_factory=list)  # transitions
    stop: threading.Event = field(default_factory=threading.Event)
    lock: threading.Lock = field(default_factory=threading.Lock)


def caller(address: str, cid: str, rec: Recorder) -> None:
    with grpc.insecure_channel(address) as channel:
        stub = pb_grpc.StateServiceStub(channel)
        n = 0
        while not rec.stop.is_set():
            n += 1
            upsert = pb.UpsertStateRequest(
                user_id="bench", conversation_id=cid, payload=b'{"n": %d}' % n
            )
            get = pb.GetStateRequest(user_id="bench", conversation_id=cid)
            calls: list[Callable[[], object]] = [
                functools.partial(stub.UpsertState, upsert, timeout=10),
                functools.partial(stub.GetState, get, timeout=10),
            ]
            for call in calls:
                started = time.monotonic()
                try:
                    call()
                    code, details = grpc.StatusCode.OK, ""
                except grpc.RpcError as exc:
                    code, details = exc.code(), exc.details() or ""
                with rec.lock:
                    rec.calls.append(Call(started, time.monotonic(), code, details))
                if code is not grpc.StatusCode.OK:
                    time.sleep(0.02)  # a client retrying in a loop, not spinning


def health_watcher(address: str, rec: Recorder) -> None:
    last = None
    with grpc.insecure_channel(address) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        while not rec.stop.is_set():
            try:
                status = health_pb2.HealthCheckResponse.ServingStatus.Name(
                    stub.Check(health_pb2.HealthCheckRequest(service=SERVICE), timeout=1).status
                )
            except grpc.RpcError as exc:
                status = f"error {exc.code().name}"
            if status != last:
                rec.health.append((time.monotonic(), status))
                last = status
            time.sleep(0.05)


def summarize(rec: Recorder, t_stop: float, t_back: float) -> dict[str, object]:
    during = [c for c in rec.calls if t_stop <= c.start < t_back]
    failed = [c for c in during if c.code is not grpc.StatusCode.OK]
    waits = sorted(c.end - c.start for c in failed)
    after_ok = [c.end for c in rec.calls if c.code is grpc.StatusCode.OK and c.end > t_back]
    serving_again = [
        t for t, s in rec.health if t > t_back and s == "SERVING"
    ]  # first SERVING after the database returned
    not_serving = [t for t, s in rec.health if t > t_stop and s == "NOT_SERVING"]
    # The status in force when the database stopped, and every one it changed to until back.
    seen = {s for t, s in rec.health if t_stop < t < t_back}
    seen |= {s for t, s in rec.health if t <= t_stop}.intersection(
        [s for t, s in rec.health if t <= t_stop][-1:]
    )
    details = Counter(c.details.splitlines()[0][:90] if c.details else "" for c in failed)
    multiline = sum(1 for c in failed if "\n" in c.details)
    return {
        "calls during outage": len(during),
        "failed": len(failed),
        "statuses": dict(Counter(c.code.name for c in during)),
        "failed call wait p50 s": round(statistics.median(waits), 3) if waits else None,
        "failed call wait max s": round(waits[-1], 3) if waits else None,
        "multi-line error messages": multiline,
        "first call ok after db back s": round(min(after_ok) - t_back, 3) if after_ok else None,
        "health SERVING after db back s": (
            round(serving_again[0] - t_back, 3) if serving_again else None
        ),
        "health statuses while down": sorted(seen),
        "health NOT_SERVING after stop s": (
            round(not_serving[0] - t_stop, 3) if not_serving else None
        ),
        "error messages": dict(details.most_common(3)),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--outage", type=float, default=60.0, help="seconds the database is down")
    parser.add_argument("--rounds", type=int, default=1, help="outages in a row")
    args = parser.parse_args()

    root = Path(tempfile.mkdtemp(prefix="agentstate-outage-"))
    root.chmod(0o755)
    pg = EmbeddedPostgres(root / "pgdata", "system")
    dsn = pg.start()
    service = ServiceProcess(
        "agentstate.state_service",
        {"STATE_LISTEN_ADDRESS": "127.0.0.1:0", "STATE_STORE": "postgres", "DATABASE_URL": dsn},
    )
    rec = Recorder()
    threads: list[threading.Thread] = []
    try:
        address = service.wait_ready()
        with grpc.insecure_channel(address) as channel:
            cid = (
                pb_grpc.StateServiceStub(channel)
                .CreateConversation(pb.CreateConversationRequest(user_id="bench"))
                .conversation.conversation_id
            )
        threads = [
            threading.Thread(target=caller, args=(address, cid, rec)) for _ in range(CALLERS)
        ]
        threads.append(threading.Thread(target=health_watcher, args=(address, rec)))
        for t in threads:
            t.start()
        for round_no in range(1, args.rounds + 1):
            time.sleep(3)
            t_stop = time.monotonic()
            pg.stop()
            print(f"round {round_no}: database stopped for {args.outage:g}s", flush=True)
            time.sleep(args.outage)
            pg.start()
            t_back = time.monotonic()
            time.sleep(35)  # long enough to see the old, slow recovery
            for key, value in summarize(rec, t_stop, t_back).items():
                print(f"  {key}: {value}")
    finally:
        rec.stop.set()
        for t in threads:
            t.join(15)
        service.terminate()
        pg.stop()
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
