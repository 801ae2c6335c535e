"""The cost of encryption at rest (issue 24 item 5): GetState and EndTurn, off against on.

    .venv/bin/python -m bench.encryption [--sizes 8,64,512] [--rounds 300] [--json FILE]

One embedded PostgreSQL, two databases, two state services in this process over gRPC on
127.0.0.1: one with STATE_ENCRYPTION off, one on (a fresh KEK file, the data key cache
as configured by default). Per state size N (messages of the source's example):
- GetState p50 of an N-message state;
- EndTurn p50 of a delta turn appending 4 messages (BeginTurn with `cached_version`, so
  the payload does not come back; EndTurn with a StateDelta and the reply's record), the
  turn the agent makes; BeginTurn p50 too.
Calls run in shuffled rounds (each round one call of every contender at every size), so
a change in the machine's load hits every cell alike: compare the ratios. The ratio on/off
is printed per cell; the target is at most 1.15.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import grpc
import psycopg

from agentstate.common.embedded_postgres import EmbeddedPostgres
from agentstate.common.grpc_server import bind, create_server
from agentstate.state.v1 import state_service_pb2 as pb
from agentstate.state.v1 import state_service_pb2_grpc as pb_grpc
from agentstate.state_service.crypto import DataKeyCache, FileKms
from agentstate.state_service.crypto.kms import new_kek
from agentstate.state_service.servicer import StateServicer
from agentstate.state_service.storage.postgres import PostgresStore
from agentstate.state_service.storage.postgres.encryption import Encryption
from bench.state_latency import grown_state

USER = "bench-encryption"
QUESTION = json.dumps([{"type": "text", "text": "我的订单88235现在什么状态？"}]).encode()
REPLY = json.dumps([{"type": "text", "text": "订单88235目前是已支付待发货。"}]).encode()
MAX_PAYLOAD = 64 * 1024 * 1024


def _encode(value: Any) -> bytes:
    return json.dumps(value, ensure_ascii=False).encode()


class Contender:
    def __init__(self, name: str, dsn: str, encryption: Encryption | None) -> None:
        self.name = name
        self.store = PostgresStore(dsn, min_size=2, max_size=4, encryption=encryption)
        self.server: grpc.aio.Server | None = None
        self.channel: grpc.aio.Channel | None = None
        self.stub: Any = None

    async def start(self) -> None:
        await self.store.open()
        server = create_server(max_message_bytes=MAX_PAYLOAD)
        pb_grpc.add_StateServiceServicer_to_server(
            StateServicer(self.store, max_payload_bytes=MAX_PAYLOAD), server
        )
        address = bind(server, "127.0.0.1:0")
        await server.start()
        self.server = server
        self.channel = grpc.aio.insecure_channel(address)
        self.stub = pb_grpc.StateServiceStub(self.channel)

    async def stop(self) -> None:
        if self.channel is not None:
            await self.channel.close(None)
        if self.server is not None:
            await self.server.stop(None)
        await self.store.close()


class Conversation:
    """An N-message conversation; each turn appends 4 messages and drops the 4 oldest,
    so the state stays at N."""

    def __init__(self, contender: Contender, messages: int) -> None:
        self.contender = contender
        self.stub = contender.stub
        self.state = grown_state(messages)
        self.cid = ""
        self.version = 0
        self.turns = 0

    async def create(self) -> None:
        created = await self.stub.CreateConversation(pb.CreateConversationRequest(user_id=USER))
        self.cid = created.conversation.conversation_id
        self.state = dict(self.state, session_id=self.cid)
        saved = await self.stub.UpsertState(
            pb.UpsertStateRequest(
                user_id=USER, conversation_id=self.cid, payload=_encode(self.state)
            )
        )
        self.version = saved.version

    async def get(self) -> float:
        started = time.perf_counter()
        got = await self.stub.GetState(pb.GetStateRequest(user_id=USER, conversation_id=self.cid))
        elapsed = (time.perf_counter() - started) * 1000
        assert got.version == self.version
        return elapsed

    async def turn(self) -> tuple[float, float]:
        self.turns += 1
        base = self.state["context"]
        added = [dict(base[i % len(base)], id=f"t{self.turns}-{i}") for i in range(4)]
        begin = pb.BeginTurnRequest(
            user_id=USER, conversation_id=self.cid, holder="bench", ttl_ms=60_000,
            require_none_awaiting=True, cached_version=self.version,
            new_messages=[
                pb.NewMessage(role=pb.MESSAGE_ROLE_USER, blocks_json=QUESTION),
                pb.NewMessage(role=pb.MESSAGE_ROLE_ASSISTANT, status=pb.MESSAGE_STATUS_STREAMING),
            ],
        )  # fmt: skip
        started = time.perf_counter()
        begun = await self.stub.BeginTurn(begin)
        began = time.perf_counter()
        self.state = dict(self.state, context=base[4:] + added, cur_iter=self.version + 1)
        fields = {k: v for k, v in self.state.items() if k != "context"}
        end = pb.EndTurnRequest(
            user_id=USER, conversation_id=self.cid, task_id=begun.lease.task_id,
            message_writes=[pb.MessageWrite(update=pb.MessageUpdate(
                message_id=begun.messages[1].message_id, status=pb.MESSAGE_STATUS_NORMAL,
                blocks_json=REPLY))],
            delta=pb.StateDelta(
                base_version=begun.version, drop_head=4,
                messages=[_encode(m) for m in added], fields_json=_encode(fields),
            ),
        )  # fmt: skip
        ended = await self.stub.EndTurn(end)
        done = time.perf_counter()
        self.version = ended.version
        return (began - started) * 1000, (done - began) * 1000


def p50(samples: list[float]) -> float:
    return statistics.median(samples)


async def run(base: str, key_file: Path, sizes: list[int], rounds: int) -> list[dict[str, Any]]:
    """The measurements on the server at `base` (its postgres database's DSN)."""
    contenders: list[Contender] = []
    try:
        with psycopg.connect(base, autocommit=True) as conn:
            for name in ("bench_off", "bench_on"):
                conn.execute(f'CREATE DATABASE "{name}"')
        contenders = [
            Contender("off", base.replace("dbname=postgres", "dbname=bench_off"), None),
            Contender(
                "on",
                base.replace("dbname=postgres", "dbname=bench_on"),
                Encryption(FileKms(key_file), DataKeyCache()),
            ),
        ]
        for c in contenders:
            await c.start()
        conversations = {(c.name, n): Conversation(c, n) for c in contenders for n in sizes}
        for conversation in conversations.values():
            await conversation.create()
        samples: dict[tuple[str, int, str], list[float]] = {
            (c, n, m): [] for (c, n) in conversations for m in ("get", "begin", "end")
        }
        # Warm up (prepared statements, the data key cache, gRPC channels).
        for conversation in conversations.values():
            for _ in range(5):
                await conversation.get()
                await conversation.turn()
        cells = list(conversations.items())
        for _ in range(rounds):
            random.shuffle(cells)
            for (name, n), conversation in cells:
                samples[(name, n, "get")].append(await conversation.get())
                began, ended = await conversation.turn()
                samples[(name, n, "begin")].append(began)
                samples[(name, n, "end")].append(ended)
    finally:
        for c in contenders:
            await c.stop()
    rows: list[dict[str, Any]] = []
    print(f"{'measure':<24}{'N':>5}{'off ms':>10}{'on ms':>10}{'on/off':>8}")
    for metric, label in (
        ("get", "GetState p50"),
        ("end", "EndTurn p50"),
        ("begin", "BeginTurn p50"),
    ):
        for n in sizes:
            off = p50(samples[("off", n, metric)])
            on = p50(samples[("on", n, metric)])
            rows.append(
                {"metric": label, "messages": n, "off_ms": off, "on_ms": on, "ratio": on / off}
            )
            print(f"{label:<24}{n:>5}{off:>10.2f}{on:>10.2f}{on / off:>8.2f}")
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(prog="bench.encryption", description=__doc__)
    parser.add_argument("--sizes", default="8,64,512")
    parser.add_argument("--rounds", type=int, default=300)
    parser.add_argument("--json", default="")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="agentstate-bench-encryption-"))
    root.chmod(0o755)
    postgres = EmbeddedPostgres(root / "pgdata")
    try:
        base = postgres.start()
        key_file = root / "keys.json"
        key_file.write_text(json.dumps({"primary": "k1", "keys": {"k1": new_kek()}}))
        sizes = [int(s) for s in args.sizes.split(",")]
        rows = asyncio.run(run(base, key_file, sizes, args.rounds))
    finally:
        postgres.stop()
        shutil.rmtree(root, ignore_errors=True)
    if args.json:
        note = "a loaded machine (2 cores shared by several helpers): compare the ratios"
        result = {"bench": "bench.encryption", "rounds": args.rounds, "note": note, "rows": rows}
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
