"""Compare-and-set writers through the state service while the primary is killed.

Used by tests/state_service/test_ha_patroni.py (asserts) and bench/ha_failover.py (repeats, prints).

Every write appends its own token ("w3-17": writer 3, attempt 17) to the `log` list of
the state it read and saves it with expected_version = the version it read. So the
states of one conversation form a single lineage: version N holds exactly N-1 tokens and
every version's log is a prefix of every later version's. A write the service
acknowledged is lost if the final log does not start with the log that write saved.
A write that failed (UNAVAILABLE: the connection died mid-commit) may or may not have
landed; the writer re-reads and carries on from whatever is there.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections import Counter
from dataclasses import dataclass, field

import grpc
import psycopg
from grpc_health.v1 import health_pb2, health_pb2_grpc

from agentstate.state.v1 import state_service_pb2 as pb
from agentstate.state.v1 import state_service_pb2_grpc as pb_grpc
from tests.support.patroni_cluster import Node, PatroniCluster

USER = "ha-writer"
WRITERS = 8
CONVERSATIONS = 2  # 4 writers per conversation: real compare-and-set contention
CALL_TIMEOUT = 30.0  # longer than any failover: a deadline is not an outcome we expect
ALLOWED = {"OK", "UNAVAILABLE", "ABORTED"}


@dataclass(frozen=True)
class Ack:
    conversation_id: str
    token: str
    version: int
    log: tuple[str, ...]
    at: float  # monotonic


@dataclass
class FailoverReport:
    acks: list[Ack] = field(default_factory=list)
    statuses: Counter[str] = field(default_factory=Counter)
    killed_at: float = 0.0
    killed_node: str = ""
    promoted_at: float = 0.0
    promoted_node: str = ""
    first_write_after_promotion_at: float = 0.0
    database_commits_at: float = 0.0  # first synchronous commit straight on the new primary
    not_serving_at: float = 0.0  # the service's health after the kill
    serving_again_at: float = 0.0
    final: dict[str, tuple[int, tuple[str, ...]]] = field(default_factory=dict)
    lost: list[Ack] = field(default_factory=list)
    unacknowledged_landed: int = 0

    @property
    def failover_seconds(self) -> float:
        return self.promoted_at - self.killed_at

    @property
    def write_after_promotion_seconds(self) -> float:
        return self.first_write_after_promotion_at - self.promoted_at

    @property
    def write_after_kill_seconds(self) -> float:
        return self.first_write_after_promotion_at - self.killed_at

    def summary(self) -> dict[str, object]:
        return {
            "killed": self.killed_node,
            "promoted": self.promoted_node,
            "kill to promotion s": round(self.failover_seconds, 2),
            "promotion to first acknowledged write s": round(self.write_after_promotion_seconds, 2),
            "kill to first acknowledged write s": round(self.write_after_kill_seconds, 2),
            "promotion to first commit straight on the new primary s": _since(
                self.database_commits_at, self.promoted_at
            ),
            "kill to health NOT_SERVING s": _since(self.not_serving_at, self.killed_at),
            "promotion to health SERVING s": _since(self.serving_again_at, self.promoted_at),
            "writes acknowledged": len(self.acks),
            "acknowledged writes lost": len(self.lost),
            "unacknowledged writes that landed": self.unacknowledged_landed,
            "statuses": dict(self.statuses),
            "final versions": {cid: v for cid, (v, _) in self.final.items()},
        }


def _since(at: float, start: float) -> float | None:
    return round(at - start, 2) if at else None


def _payload(log: tuple[str, ...]) -> bytes:
    return json.dumps({"log": list(log)}).encode()


def _log_of(payload: bytes) -> tuple[str, ...]:
    return tuple(json.loads(payload)["log"])


class _Stopped(Exception):
    pass


class Writers:
    def __init__(self, address: str, report: FailoverReport) -> None:
        self.address = address
        self.report = report
        self.stop = asyncio.Event()
        self.conversations: list[str] = []

    async def prepare(self, stub: pb_grpc.StateServiceAsyncStub) -> None:
        for _ in range(CONVERSATIONS):
            created = await stub.CreateConversation(pb.CreateConversationRequest(user_id=USER))
            cid = created.conversation.conversation_id
            first = await stub.UpsertState(
                pb.UpsertStateRequest(
                    user_id=USER, conversation_id=cid, payload=_payload(()), expected_version=0
                )
            )
            assert first.version == 1
            self.conversations.append(cid)

    async def _read(
        self, stub: pb_grpc.StateServiceAsyncStub, cid: str
    ) -> tuple[int, tuple[str, ...]]:
        while True:
            if self.stop.is_set():
                raise _Stopped
            try:
                got = await stub.GetState(
                    pb.GetStateRequest(user_id=USER, conversation_id=cid), timeout=CALL_TIMEOUT
                )
            except grpc.aio.AioRpcError as exc:
                self.report.statuses[exc.code().name] += 1
                await asyncio.sleep(0.05)
                continue
            self.report.statuses["OK"] += 1
            return got.version, _log_of(got.payload)

    async def write(self, stub: pb_grpc.StateServiceAsyncStub, writer: int) -> None:
        with contextlib.suppress(_Stopped):
            await self._write(stub, writer)

    async def _write(self, stub: pb_grpc.StateServiceAsyncStub, writer: int) -> None:
        cid = self.conversations[writer % CONVERSATIONS]
        version, log = await self._read(stub, cid)
        attempt = 0
        while not self.stop.is_set():
            attempt += 1
            token = f"w{writer}-{attempt}"
            new_log = (*log, token)
            try:
                saved = await stub.UpsertState(
                    pb.UpsertStateRequest(
                        user_id=USER,
                        conversation_id=cid,
                        payload=_payload(new_log),
                        expected_version=version,
                    ),
                    timeout=CALL_TIMEOUT,
                )
            except grpc.aio.AioRpcError as exc:
                self.report.statuses[exc.code().name] += 1
                if exc.code() != grpc.StatusCode.ABORTED:
                    await asyncio.sleep(0.05)  # a client retrying, not spinning
                version, log = await self._read(stub, cid)
                continue
            self.report.statuses["OK"] += 1
            self.report.acks.append(Ack(cid, token, saved.version, new_log, time.monotonic()))
            version, log = saved.version, new_log


async def _wait_for_promotion(
    cluster: PatroniCluster, old: Node, report: FailoverReport, within: float
) -> None:
    """Poll the surviving nodes until one has left recovery: the moment writes can land."""
    survivors = [n for n in cluster.nodes if n is not old]
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        for node in survivors:
            if await asyncio.to_thread(cluster.in_recovery, node) is False:
                report.promoted_at = time.monotonic()
                report.promoted_node = node.name
                return
        await asyncio.sleep(0.05)
    raise AssertionError(f"no node was promoted within {within}s\n{cluster.logs()}")


def _first_commit(node: Node, within: float) -> float:
    """Commit straight on the new primary until one returns: with synchronous_mode_strict
    that needs a synchronous standby attached to it, the floor for any client's write."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            with psycopg.connect(node.dsn(), autocommit=True) as conn:
                conn.execute("INSERT INTO ha_commit_probe DEFAULT VALUES")
            return time.monotonic()
        except psycopg.Error:
            time.sleep(0.05)
    return 0.0


async def _watch_health(address: str, report: FailoverReport, stop: asyncio.Event) -> None:
    """Record when the service reported NOT_SERVING after the kill and SERVING after that."""
    async with grpc.aio.insecure_channel(address) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        while not stop.is_set():
            try:
                reply = await stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=1)
                serving = reply.status == health_pb2.HealthCheckResponse.SERVING
            except grpc.aio.AioRpcError:
                serving = False
            now = time.monotonic()
            if report.killed_at and not serving and not report.not_serving_at:
                report.not_serving_at = now
            if report.not_serving_at and serving and not report.serving_again_at:
                report.serving_again_at = now
            await asyncio.sleep(0.05)


async def run_failover(
    cluster: PatroniCluster,
    address: str,
    *,
    before_kill: float = 2.0,
    after_recovery: float = 2.0,
    recovery_timeout: float = 60.0,
) -> FailoverReport:
    """Writers run for `before_kill` s, the primary's postmaster is killed, they keep
    going until `after_recovery` s after the first write acknowledged after the promotion;
    then the final states are read back and every acknowledged write is looked for."""
    report = FailoverReport()
    async with grpc.aio.insecure_channel(address) as channel:
        stub = pb_grpc.StateServiceStub(channel)
        writers = Writers(address, report)
        await writers.prepare(stub)
        leader = cluster.leader()
        assert leader is not None
        with psycopg.connect(leader.dsn(), autocommit=True) as conn:
            conn.execute(
                "CREATE TABLE IF NOT EXISTS ha_commit_probe (at timestamptz DEFAULT now())"
            )
        tasks = [asyncio.create_task(writers.write(stub, w)) for w in range(WRITERS)]
        tasks.append(asyncio.create_task(_watch_health(address, report, writers.stop)))
        try:
            await asyncio.sleep(before_kill)
            assert report.acks, f"no write went through before the kill: {report.statuses}"
            old = await asyncio.to_thread(cluster.kill_primary_postmaster)
            report.killed_at = time.monotonic()
            report.killed_node = old.name
            await _wait_for_promotion(cluster, old, report, recovery_timeout)
            commit = asyncio.create_task(
                asyncio.to_thread(
                    _first_commit, cluster.node(report.promoted_node), recovery_timeout
                )
            )
            deadline = time.monotonic() + recovery_timeout
            while time.monotonic() < deadline:
                after = [a.at for a in report.acks if a.at > report.promoted_at]
                if after:
                    report.first_write_after_promotion_at = min(after)
                    break
                await asyncio.sleep(0.02)
            else:
                raise AssertionError(
                    f"no write acknowledged within {recovery_timeout}s of the promotion: "
                    f"{report.statuses}"
                )
            report.database_commits_at = await commit
            await asyncio.sleep(after_recovery)
        finally:
            writers.stop.set()
            await asyncio.gather(*tasks, return_exceptions=True)
        for cid in writers.conversations:
            got = await stub.GetState(
                pb.GetStateRequest(user_id=USER, conversation_id=cid), timeout=CALL_TIMEOUT
            )
            report.final[cid] = (got.version, _log_of(got.payload))
    _account(report)
    return report


def _account(report: FailoverReport) -> None:
    acked_tokens = {a.token for a in report.acks}
    for ack in report.acks:
        version, log = report.final[ack.conversation_id]
        if log[: len(ack.log)] != ack.log or version < ack.version:
            report.lost.append(ack)
    report.unacknowledged_landed = sum(
        1 for _, log in report.final.values() for token in log if token not in acked_tokens
    )
