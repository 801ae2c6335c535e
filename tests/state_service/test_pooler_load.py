"""16 state-service processes, one PostgreSQL, one PgBouncer (transaction mode), with faults.

The pooler's server pool (12) is smaller than the sum of the sidecars' pools (16 x 4).
64 concurrent callers run for a bounded time: real turns (BeginTurn/EndTurn) and
compare-and-set writes on shared conversations, deletes racing writes, batch deletes;
in the middle one state-service process is killed with SIGKILL and PgBouncer is
restarted. Then: no acknowledged write is lost, no deleted conversation comes back,
every failure has a documented status, the server never saw more connections from the
pooler than its pool, and every surviving process serves again.
"""

from __future__ import annotations

import asyncio
import json
import random
import signal
import threading
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any, TypeAlias

import grpc
import psycopg
import pytest

from agentstate.common.embedded_postgres import EmbeddedPostgres
from agentstate.state.v1 import state_service_pb2 as pb
from agentstate.state.v1 import state_service_pb2_grpc as pb_grpc
from tests.support.helpers import user_text
from tests.support.pooler_tools import (
    SERVING,
    health,
    pgbouncer,
    pooled_database,
    pooled_env,
    server_connections,
)
from tests.support.state_process import StateServices

pytestmark = [pytest.mark.pooler_load, pytest.mark.timeout(300)]

Stub: TypeAlias = "pb_grpc.StateServiceAsyncStub"
Code = grpc.StatusCode

PROCESSES = 16
SIDECAR_POOL = 4
SERVER_POOL = 12
CALLERS = 64
SHARED = 8
LOAD_SECONDS = 24.0
KILL_AT = 7.0
RESTART_POOLER_AT = 13.0
DEADLINE = 20.0
USER = "load"
DB = "agentstate_pooler_load"

# What each failure may be: lease held or lost, a version conflict, a deleted
# conversation, and UNAVAILABLE while a process is dead or the pooler restarts.
DOCUMENTED = {
    Code.FAILED_PRECONDITION,
    Code.ABORTED,
    Code.NOT_FOUND,
    Code.UNAVAILABLE,
}

STREAMING = pb.NewMessage(role=pb.MESSAGE_ROLE_ASSISTANT, status=pb.MESSAGE_STATUS_STREAMING)


@dataclass
class Ledger:
    """What the callers were told."""

    versions: dict[str, list[tuple[int, bytes]]] = field(default_factory=lambda: defaultdict(list))
    messages: dict[str, set[str]] = field(default_factory=lambda: defaultdict(set))
    deleted: set[str] = field(default_factory=set)
    statuses: Counter[str] = field(default_factory=Counter)
    undocumented: list[str] = field(default_factory=list)
    late_writes_acked: list[str] = field(default_factory=list)  # after the delete's ack
    operations: Counter[str] = field(default_factory=Counter)


class Cluster:
    def __init__(self, addresses: list[str]) -> None:
        self.channels = [grpc.aio.insecure_channel(a) for a in addresses]
        self.stubs = [pb_grpc.StateServiceStub(c) for c in self.channels]
        self.dead: set[int] = set()

    def stub(self, index: int) -> tuple[int, Stub]:
        for step in range(len(self.stubs)):
            i = (index + step) % len(self.stubs)
            if i not in self.dead:
                return i, self.stubs[i]
        raise AssertionError("no process left")

    async def close(self) -> None:
        for channel in self.channels:
            await channel.close(None)


async def call(ledger: Ledger, name: str, awaitable: Any) -> Any:
    """The response, or None after recording a documented failure."""
    try:
        response = await awaitable
    except grpc.aio.AioRpcError as exc:
        code = exc.code()
        ledger.statuses[f"{name} {code.name}"] += 1
        if code not in DOCUMENTED:
            ledger.undocumented.append(f"{name}: {code.name} {exc.details()}")
        return None
    ledger.statuses[f"{name} OK"] += 1
    return response


def state_of(writer: int, n: int) -> bytes:
    return json.dumps({"writer": writer, "n": n}).encode()


async def shared_turn(stub: Stub, ledger: Ledger, cid: str, me: int, n: int) -> None:
    begun = await call(
        ledger,
        "BeginTurn",
        stub.BeginTurn(
            pb.BeginTurnRequest(
                user_id=USER,
                conversation_id=cid,
                holder=f"caller-{me}",
                ttl_ms=5000,
                new_messages=[user_text(f"q{me}.{n}"), STREAMING],
            ),
            timeout=DEADLINE,
        ),
    )
    if begun is None:
        return
    ledger.messages[cid].update(m.message_id for m in begun.messages)
    payload = state_of(me, n)
    ended = await call(
        ledger,
        "EndTurn",
        stub.EndTurn(
            pb.EndTurnRequest(
                user_id=USER,
                conversation_id=cid,
                task_id=begun.lease.task_id,
                payload=payload,
                expected_version=begun.version,
                message_writes=[
                    pb.MessageWrite(
                        update=pb.MessageUpdate(
                            message_id=begun.messages[1].message_id,
                            status=pb.MESSAGE_STATUS_NORMAL,
                        )
                    )
                ],
            ),
            timeout=DEADLINE,
        ),
    )
    if ended is not None:
        ledger.versions[cid].append((ended.version, payload))


async def shared_cas(stub: Stub, ledger: Ledger, cid: str, me: int, n: int) -> None:
    try:
        got = await stub.GetState(
            pb.GetStateRequest(user_id=USER, conversation_id=cid), timeout=DEADLINE
        )
        version = got.version
    except grpc.aio.AioRpcError as exc:
        if exc.code() != Code.NOT_FOUND:  # NOT_FOUND: no state yet
            await call(ledger, "GetState", _raise(exc))
            return
        version = 0
    payload = state_of(me, n)
    saved = await call(
        ledger,
        "UpsertState",
        stub.UpsertState(
            pb.UpsertStateRequest(
                user_id=USER,
                conversation_id=cid,
                payload=payload,
                expected_version=version,
                message_writes=[pb.MessageWrite(insert=user_text(f"cas{me}.{n}"))],
            ),
            timeout=DEADLINE,
        ),
    )
    if saved is not None:
        ledger.versions[cid].append((saved.version, payload))
        ledger.messages[cid].update(m.message_id for m in saved.messages)


async def _raise(exc: BaseException) -> None:
    raise exc


async def new_conversation(stub: Stub, ledger: Ledger) -> str | None:
    made = await call(
        ledger,
        "CreateConversation",
        stub.CreateConversation(pb.CreateConversationRequest(user_id=USER), timeout=DEADLINE),
    )
    return None if made is None else str(made.conversation.conversation_id)


async def delete_racing_writes(stub: Stub, ledger: Ledger, me: int, n: int) -> None:
    cid = await new_conversation(stub, ledger)
    if cid is None:
        return
    deleted_at: list[float] = []

    async def delete() -> None:
        done = await call(
            ledger,
            "DeleteConversation",
            stub.DeleteConversation(
                pb.DeleteConversationRequest(user_id=USER, conversation_id=cid),
                timeout=DEADLINE,
            ),
        )
        if done is not None:
            deleted_at.append(time.monotonic())
            ledger.deleted.add(cid)

    async def write(kind: int) -> None:
        await asyncio.sleep(random.random() * 0.02)
        started = time.monotonic()
        if kind == 0:
            request: Any = stub.AppendMessage(
                pb.AppendMessageRequest(
                    user_id=USER, conversation_id=cid, message=user_text(f"d{me}.{n}")
                ),
                timeout=DEADLINE,
            )
            name = "AppendMessage"
        elif kind == 1:
            request = stub.UpsertState(
                pb.UpsertStateRequest(
                    user_id=USER, conversation_id=cid, payload=state_of(me, n), expected_version=0
                ),
                timeout=DEADLINE,
            )
            name = "UpsertState"
        else:
            request = stub.BeginTurn(
                pb.BeginTurnRequest(
                    user_id=USER, conversation_id=cid, holder=f"caller-{me}", ttl_ms=5000
                ),
                timeout=DEADLINE,
            )
            name = "BeginTurn"
        response = await call(ledger, name, request)
        if response is not None and deleted_at and started > deleted_at[0]:
            ledger.late_writes_acked.append(f"{name} on {cid}")

    await asyncio.gather(delete(), *(write(k) for k in range(3)))
    # A write after the acknowledged delete must find nothing.
    if deleted_at:
        late = await call(
            ledger,
            "AppendMessage",
            stub.AppendMessage(
                pb.AppendMessageRequest(
                    user_id=USER, conversation_id=cid, message=user_text("late")
                ),
                timeout=DEADLINE,
            ),
        )
        if late is not None:
            ledger.late_writes_acked.append(f"AppendMessage after delete on {cid}")


async def batch_delete(stub: Stub, ledger: Ledger, me: int, n: int) -> None:
    ids = [cid for _ in range(3) if (cid := await new_conversation(stub, ledger)) is not None]
    for cid in ids:
        await call(
            ledger,
            "UpsertState",
            stub.UpsertState(
                pb.UpsertStateRequest(user_id=USER, conversation_id=cid, payload=state_of(me, n)),
                timeout=DEADLINE,
            ),
        )
    if not ids:
        return
    done = await call(
        ledger,
        "BatchDeleteConversations",
        stub.BatchDeleteConversations(
            pb.BatchDeleteConversationsRequest(user_id=USER, conversation_ids=ids),
            timeout=DEADLINE,
        ),
    )
    if done is not None:
        ledger.deleted.update(ids)


async def private_turn(stub: Stub, ledger: Ledger, me: int, n: int) -> None:
    begun = await call(
        ledger,
        "BeginTurn",
        stub.BeginTurn(
            pb.BeginTurnRequest(
                user_id=USER, holder=f"caller-{me}", ttl_ms=5000, new_messages=[user_text("p")]
            ),
            timeout=DEADLINE,
        ),
    )
    if begun is None:
        return
    cid = str(begun.conversation.conversation_id)
    ledger.messages[cid].update(m.message_id for m in begun.messages)
    payload = state_of(me, n)
    ended = await call(
        ledger,
        "EndTurn",
        stub.EndTurn(
            pb.EndTurnRequest(
                user_id=USER,
                conversation_id=cid,
                task_id=begun.lease.task_id,
                payload=payload,
                expected_version=0,
            ),
            timeout=DEADLINE,
        ),
    )
    if ended is not None:
        ledger.versions[cid].append((ended.version, payload))


async def caller(
    me: int, cluster: Cluster, shared: list[str], ledger: Ledger, stop_at: float
) -> None:
    rng = random.Random(me)
    n = 0
    while time.monotonic() < stop_at:
        n += 1
        _, stub = cluster.stub(me % PROCESSES)
        roll = rng.random()
        cid = shared[rng.randrange(SHARED)]
        if roll < 0.40:
            ledger.operations["shared turn"] += 1
            await shared_turn(stub, ledger, cid, me, n)
        elif roll < 0.65:
            ledger.operations["shared compare-and-set"] += 1
            await shared_cas(stub, ledger, cid, me, n)
        elif roll < 0.80:
            ledger.operations["delete racing writes"] += 1
            await delete_racing_writes(stub, ledger, me, n)
        elif roll < 0.90:
            ledger.operations["batch delete"] += 1
            await batch_delete(stub, ledger, me, n)
        else:
            ledger.operations["private turn"] += 1
            await private_turn(stub, ledger, me, n)


class ConnectionSampler(threading.Thread):
    """pg_stat_activity's count of the pooler's server connections, every 50 ms."""

    def __init__(self, direct_url: str) -> None:
        super().__init__(daemon=True)
        self.url = direct_url
        self.samples: list[int] = []
        self.stopping = threading.Event()

    def run(self) -> None:
        with psycopg.connect(self.url, autocommit=True) as conn:
            while not self.stopping.wait(0.05):
                row = conn.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE usename = 'agentstate_pooled'"
                ).fetchone()
                assert row is not None
                self.samples.append(int(row[0]))


async def test_sixteen_replicas_through_pgbouncer_with_faults(postgres: EmbeddedPostgres) -> None:
    direct = pooled_database(postgres, DB)
    with pgbouncer(postgres, DB, pool_size=SERVER_POOL) as bouncer:
        env = pooled_env(
            bouncer,
            direct,
            STATE_DB_POOL_MIN_SIZE="1",
            STATE_DB_POOL_MAX_SIZE=str(SIDECAR_POOL),
            STATE_DB_POOL_TIMEOUT_SECONDS="10",
            STATE_DB_CHECK_INTERVAL_SECONDS="0.5",
            STATE_DB_RETRY_INTERVAL_SECONDS="0.25",
            STATE_SHUTDOWN_GRACE_SECONDS="2",
        )
        started = time.monotonic()
        # Each still running at the end must stop cleanly on SIGTERM (the killed one is not).
        with StateServices() as states:
            processes = [states.start(env, "serve") for _ in range(PROCESSES)]
            addresses = [await asyncio.to_thread(p.wait_ready, 120) for p in processes]
            startup = time.monotonic() - started
            sampler = ConnectionSampler(direct)
            sampler.start()
            cluster = Cluster(addresses)
            ledger = Ledger()
            shared = []
            for _ in range(SHARED):
                made = await cluster.stubs[0].CreateConversation(
                    pb.CreateConversationRequest(user_id=USER)
                )
                shared.append(str(made.conversation.conversation_id))

            async def faults(t0: float) -> None:
                await asyncio.sleep(KILL_AT - (time.monotonic() - t0))
                victim = 5
                processes[victim].proc.send_signal(signal.SIGKILL)
                cluster.dead.add(victim)
                await asyncio.sleep(RESTART_POOLER_AT - (time.monotonic() - t0))
                await asyncio.to_thread(bouncer.restart, 0.5)

            t0 = time.monotonic()
            await asyncio.gather(
                faults(t0),
                *(caller(i, cluster, shared, ledger, t0 + LOAD_SECONDS) for i in range(CALLERS)),
            )
            load = time.monotonic() - t0
            sampler.stopping.set()
            sampler.join(5)

            # Every surviving process serves again.
            survivors = [i for i in range(PROCESSES) if i not in cluster.dead]
            deadline = time.monotonic() + 20
            for i in survivors:
                while health(addresses[i]) != SERVING:
                    assert time.monotonic() < deadline, f"process {i} not serving"
                    await asyncio.sleep(0.2)
                await cluster.stubs[i].CreateConversation(
                    pb.CreateConversationRequest(user_id="after"), timeout=DEADLINE
                )
            assert processes[5].proc.wait(10) == -signal.SIGKILL

            await check_ledger(cluster, ledger, direct)
            peak = max(sampler.samples)
            print(
                f"\nstart-up of {PROCESSES} processes {startup:.1f}s, load {load:.1f}s; "
                f"operations {dict(ledger.operations)}; statuses {dict(ledger.statuses)}; "
                f"server connections peak {peak} of {SERVER_POOL} "
                f"({len(sampler.samples)} samples); deleted {len(ledger.deleted)}"
            )
            assert ledger.undocumented == []
            assert ledger.late_writes_acked == []
            assert len(sampler.samples) > 100 and 0 < peak <= SERVER_POOL
            assert ledger.statuses["EndTurn OK"] > 50 and ledger.statuses["UpsertState OK"] > 50
            assert ledger.statuses["DeleteConversation OK"] > 10
            assert ledger.statuses["BatchDeleteConversations OK"] > 5
            await cluster.close()
    assert server_connections(direct) == 0


async def check_ledger(cluster: Cluster, ledger: Ledger, direct: str) -> None:
    _, stub = cluster.stub(0)
    lost: list[str] = []
    for cid, acked in ledger.versions.items():
        if cid in ledger.deleted:
            continue
        versions = [v for v, _ in acked]
        assert len(versions) == len(set(versions)), f"{cid}: two writes acked one version"
        got = await stub.GetState(pb.GetStateRequest(user_id=USER, conversation_id=cid))
        top, payload = max(acked)
        if got.version < top or (
            got.version == top and json.loads(got.payload) != json.loads(payload)
        ):
            lost.append(f"{cid}: acked v{top}, stored v{got.version}")
    for cid, ids in ledger.messages.items():
        if cid in ledger.deleted:
            continue
        stored: set[str] = set()
        token = ""
        while True:
            page = await stub.ListMessages(
                pb.ListMessagesRequest(user_id=USER, conversation_id=cid, page_token=token)
            )
            stored.update(m.message_id for m in page.messages)
            token = page.next_page_token
            if not token:
                break
        if ids - stored:
            lost.append(f"{cid}: acked records missing {sorted(ids - stored)}")
    assert lost == []
    # No resurrection: nothing of a deleted conversation, anywhere.
    gone = [int(c) for c in ledger.deleted]
    assert gone
    with psycopg.connect(direct, autocommit=True) as conn:
        for table, column in [
            ("t_conversation", "id"),
            ("t_agent_message", "conversation_id"),
            ("t_agent_state", "session_id"),
            ("t_run_lease", "conversation_id"),
            ("t_context_compaction", "conversation_id"),
        ]:
            row = conn.execute(
                f"SELECT count(*) FROM {table} WHERE {column} = ANY(%s)", (gone,)
            ).fetchone()
            assert row == (0,), f"{table} still has rows of deleted conversations"
    for cid in list(ledger.deleted)[:50]:
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await stub.GetConversation(pb.GetConversationRequest(user_id=USER, conversation_id=cid))
        assert caught.value.code() == Code.NOT_FOUND
