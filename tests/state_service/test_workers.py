"""STATE_WORKERS=2: two worker processes on one port, as real processes (issue 26, item 3).

The kernel spreads connections over the workers (SO_REUSEPORT); which worker holds a
connection is read from /proc (the worker whose socket is the connection's server end).
"""

from __future__ import annotations

import json
import os
import re
import signal
import time
import uuid
from collections.abc import Iterator
from concurrent import futures
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import grpc
import psycopg
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from agentstate.state.v1 import state_service_pb2 as pb
from agentstate.state.v1 import state_service_pb2_grpc as pb_grpc
from tests.support.state_process import StateServices, on_postgres, run_command
from tests.support.telemetry_tools import OtlpReceiver

CHANNELS = 16  # 16 connections all on one of two workers: a chance of 2**-15


def _workers_of(supervisor: int) -> list[int]:
    children = Path(f"/proc/{supervisor}/task/{supervisor}/children").read_text()
    return sorted(int(pid) for pid in children.split())


def _socket_inodes(pid: int) -> set[str]:
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:  # closed meanwhile
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    return inodes


def _served_connections(port: int) -> dict[str, int]:
    """inode -> 1 for each established TCP connection whose local port is `port`."""
    established = {}
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            local_port = int(fields[1].rsplit(":", 1)[1], 16)
            if local_port == port and fields[3] == "01":  # 01: ESTABLISHED
                established[fields[9]] = 1
    return established


def connections_per_worker(supervisor: int, port: int) -> dict[int, int]:
    served = _served_connections(port)
    return {pid: len(_socket_inodes(pid) & served.keys()) for pid in _workers_of(supervisor)}


def _channels(address: str, stack: ExitStack) -> list[grpc.Channel]:
    """CHANNELS connected channels, each with its own connection (a local subchannel pool)."""
    channels = [
        stack.enter_context(
            grpc.insecure_channel(address, options=[("grpc.use_local_subchannel_pool", 1)])
        )
        for _ in range(CHANNELS)
    ]
    for channel in channels:
        grpc.channel_ready_future(channel).result(timeout=10)
    return channels


@pytest.fixture
def otlp() -> Iterator[tuple[OtlpReceiver, dict[str, str]]]:
    receiver = OtlpReceiver()
    endpoint = receiver.start()
    yield (
        receiver,
        {
            "OTEL_METRICS_EXPORTER": "otlp",
            "OTEL_EXPORTER_OTLP_ENDPOINT": endpoint,
            "OTEL_EXPORTER_OTLP_INSECURE": "true",
            "OTEL_METRIC_EXPORT_INTERVAL": "300",
        },
    )
    receiver.stop()


def _loads_per_worker(receiver: OtlpReceiver) -> dict[str, int]:
    """Per agentstate.worker.index, the state service's latest cumulative count of state
    loads (one per GetState)."""
    counts: dict[str, int] = {}
    for resource_metrics in receiver.snapshot():
        attributes = {a.key: a.value.string_value for a in resource_metrics.resource.attributes}
        index = attributes.get("agentstate.worker.index")
        for scope in resource_metrics.scope_metrics:
            for metric in scope.metrics:
                if metric.name != "agentstate.state.load.duration" or index is None:
                    continue
                points = [
                    p
                    for p in metric.histogram.data_points
                    if {a.key: a.value.string_value for a in p.attributes}.get("side") == "server"
                ]
                counts[index] = max(counts.get(index, 0), sum(int(p.count) for p in points))
    return counts


def test_two_workers_serve_one_port_each_with_its_health_and_metrics(
    state_services: StateServices,
    database_url: str,
    user_id: str,
    otlp: tuple[OtlpReceiver, dict[str, str]],
) -> None:
    receiver, otel = otlp
    process = state_services.start(on_postgres(database_url, STATE_WORKERS="2", **otel))
    address = process.wait_ready()
    assert re.search(r"listening on \S+ \(2 workers\)", process.output), process.output
    port = int(address.rsplit(":", 1)[1])
    with ExitStack() as stack:
        channels = _channels(address, stack)
        cids = []
        for channel in channels:
            stub = pb_grpc.StateServiceStub(channel)
            cid = stub.CreateConversation(
                pb.CreateConversationRequest(user_id=user_id)
            ).conversation.conversation_id
            stub.UpsertState(
                pb.UpsertStateRequest(user_id=user_id, conversation_id=cid, payload=b'{"n":1}')
            )
            cids.append(cid)
            # Health answers on every connection, i.e. in every worker.
            health = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest())
            assert health.status == health_pb2.HealthCheckResponse.SERVING
        per_worker = connections_per_worker(process.proc.pid, port)
        assert len(per_worker) == 2 and all(n > 0 for n in per_worker.values()), per_worker
        # Any worker reads what any other wrote: one database.
        gets = 0
        for channel in channels:
            stub = pb_grpc.StateServiceStub(channel)
            for cid in cids:
                got = stub.GetState(pb.GetStateRequest(user_id=user_id, conversation_id=cid))
                assert json.loads(got.payload) == {"n": 1}
                gets += 1
    # Metrics per worker (its own series, by agentstate.worker.index), and in aggregate
    # (their sum) every call counted once.
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        loads = _loads_per_worker(receiver)
        if sum(loads.values()) >= gets:
            break
        time.sleep(0.2)
    assert set(loads) == {"0", "1"} and all(loads.values()), loads
    assert sum(loads.values()) == gets, loads
    # The JSON log lines say which worker wrote them.
    logged = [json.loads(line) for line in process.lines if line.startswith("{")]
    serving = {entry.get("worker") for entry in logged if "serving on" in entry["message"]}
    assert serving == {0, 1}, process.output


def test_a_killed_worker_is_replaced_while_the_other_serves_on(
    state_services: StateServices, database_url: str, user_id: str
) -> None:
    process = state_services.start(on_postgres(database_url, STATE_WORKERS="2"))
    address = process.wait_ready()
    port = int(address.rsplit(":", 1)[1])
    with ExitStack() as stack:
        channels = _channels(address, stack)
        stubs = [pb_grpc.StateServiceStub(channel) for channel in channels]
        cids = [
            s.CreateConversation(
                pb.CreateConversationRequest(user_id=user_id)
            ).conversation.conversation_id
            for s in stubs
        ]
        before = connections_per_worker(process.proc.pid, port)
        victim, survivor = sorted(before, key=lambda pid: -before[pid])
        os.kill(victim, signal.SIGKILL)
        # The survivor's connections go on serving at once.
        survivor_inodes = _socket_inodes(survivor)
        served = _served_connections(port)
        for stub, cid in zip(stubs, cids, strict=True):
            try:
                stub.GetConversation(
                    pb.GetConversationRequest(user_id=user_id, conversation_id=cid), timeout=10
                )
            except grpc.RpcError as exc:  # only a connection of the victim may fail
                assert exc.code() == grpc.StatusCode.UNAVAILABLE, exc
        assert any(inode in served for inode in survivor_inodes)
        # A new worker takes the victim's place.
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            workers = _workers_of(process.proc.pid)
            if len(workers) == 2 and victim not in workers and _serving(process) == 3:
                break
            time.sleep(0.2)
        workers = _workers_of(process.proc.pid)
        assert len(workers) == 2 and victim not in workers and survivor in workers
        assert re.search(r"worker \d exited with -9: starting a new one", process.output)
    # New connections reach both workers again, and everything written is there.
    with ExitStack() as stack:
        channels = _channels(address, stack)
        for channel, cid in zip(channels, cids, strict=True):
            pb_grpc.StateServiceStub(channel).GetConversation(
                pb.GetConversationRequest(user_id=user_id, conversation_id=cid), timeout=10
            )
        after = connections_per_worker(process.proc.pid, port)
        assert len(after) == 2 and all(n > 0 for n in after.values()), after


def _serving(process: Any) -> int:
    """How many workers have said they serve, so far."""
    return sum("serving on" in line for line in process.lines)


def test_a_worker_that_keeps_dying_stops_the_replica(
    state_services: StateServices, database_url: str
) -> None:
    """5 deaths within 60 s: no more restarts; the supervisor stops the other worker and
    exits 1, so the container restarts and the fault shows."""
    process = state_services.start(on_postgres(database_url, STATE_WORKERS="2"))
    process.wait_ready()
    killed: set[int] = set()
    deadline = time.monotonic() + 90
    while process.proc.poll() is None and time.monotonic() < deadline:
        alive = [pid for pid in _workers_of(process.proc.pid) if pid not in killed]
        ready = _serving(process)
        if alive and ready >= 2 + len(killed):  # the last replacement serves
            os.kill(alive[0], signal.SIGKILL)
            killed.add(alive[0])
        time.sleep(0.05)
    assert process.wait(30) == 1, process.output
    assert len(killed) == 5, (killed, process.output)
    assert "the 5. death within 60 s: stopping" in process.output


def test_sigterm_drains_the_calls_in_flight_in_every_worker(
    state_services: StateServices, database_url: str, user_id: str
) -> None:
    """Calls held in the database (a row lock the test holds) on both workers when SIGTERM
    comes: each worker stops taking calls, finishes its own once the lock goes, and the
    supervisor exits 0. Every acknowledged write is in the database."""
    process = state_services.start(
        on_postgres(
            database_url,
            STATE_WORKERS="2",
            STATE_SHUTDOWN_GRACE_SECONDS="20",
            # The kernel may give one worker more than the default pool of 10 of the 16
            # connections; every held call must reach the lock, not wait for a pool slot.
            STATE_DB_POOL_MAX_SIZE=str(CHANNELS),
        )
    )
    address = process.wait_ready()
    port = int(address.rsplit(":", 1)[1])
    with ExitStack() as stack:
        channels = _channels(address, stack)
        stubs = [pb_grpc.StateServiceStub(channel) for channel in channels]
        cid = (
            stubs[0]
            .CreateConversation(pb.CreateConversationRequest(user_id=user_id))
            .conversation.conversation_id
        )
        per_worker = connections_per_worker(process.proc.pid, port)
        assert all(n > 0 for n in per_worker.values()), per_worker
        results: dict[int, Any] = {}
        with psycopg.connect(database_url, autocommit=False) as lock:
            lock.execute("SELECT 1 FROM t_conversation WHERE id = %s FOR UPDATE", (int(cid),))

            def save(i: int) -> None:
                request = pb.UpsertStateRequest(
                    user_id=user_id, conversation_id=cid, payload=json.dumps({"i": i}).encode()
                )
                try:
                    results[i] = stubs[i].UpsertState(request, timeout=60).version
                except grpc.RpcError as exc:
                    results[i] = exc.code()

            pool = futures.ThreadPoolExecutor(CHANNELS)
            calls = [pool.submit(save, i) for i in range(CHANNELS)]
            _wait_for_waiters(database_url, CHANNELS)
            process.proc.send_signal(signal.SIGTERM)
            time.sleep(1)  # both workers are draining, their calls still held
            assert process.proc.poll() is None and not results
            lock.rollback()
        for call in calls:
            call.result(timeout=60)
        pool.shutdown()
    assert process.wait(60) == 0, process.output
    # Each held call was served in full: versions 1..16, one each, none refused.
    assert sorted(results.values()) == list(range(1, CHANNELS + 1)), results
    with psycopg.connect(database_url) as conn:
        row = conn.execute(
            "SELECT count(*) FROM t_conversation WHERE id = %s", (int(cid),)
        ).fetchone()
    assert row == (1,)
    assert "workers stopped (exit statuses [0, 0])" in process.output


def _wait_for_waiters(database_url: str, count: int) -> None:
    """Until `count` sessions wait for a lock (the held calls are in the database)."""
    deadline = time.monotonic() + 30
    with psycopg.connect(database_url, autocommit=True) as conn:
        while time.monotonic() < deadline:
            row = conn.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
            ).fetchone()
            if row is not None and row[0] >= count:
                return
            time.sleep(0.05)
    raise AssertionError(f"fewer than {count} calls reached the database lock")


def test_workers_need_a_shared_database_and_a_tcp_port(database_url: str, tmp_path: Path) -> None:
    memory = run_command(
        {"STATE_STORE": "memory", "STATE_WORKERS": "2", "STATE_LISTEN_ADDRESS": "127.0.0.1:0"},
        "serve",
    )
    assert memory.returncode == 2
    assert "STATE_WORKERS=2 needs STATE_STORE=postgres" in memory.stderr
    unix = run_command(
        on_postgres(
            database_url,
            STATE_WORKERS="2",
            STATE_LISTEN_ADDRESS=f"unix://{tmp_path / 's.sock'}",
        ),
        "serve",
    )
    assert unix.returncode == 2
    assert "needs a host:port STATE_LISTEN_ADDRESS" in unix.stderr


def test_workers_that_cannot_start_fail_the_start_with_their_status(
    state_services: StateServices,
) -> None:
    """A database that is not there: the workers exit 2 (a configuration error) before
    serving, and so does the supervisor, after stopping the other worker."""
    process = state_services.start(
        on_postgres(
            f"postgresql://nobody@127.0.0.1:1/{uuid.uuid4().hex}",
            STATE_WORKERS="2",
            STATE_DB_CONNECT_TIMEOUT_SECONDS="1",
        )
    )
    assert process.wait(60) == 2, process.output
    assert "exited with 2 while starting" in process.output
    assert "listening on" not in process.output
