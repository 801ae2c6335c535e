"""A load generator for the state service, run as its own process (bench.capacity starts it).

    .venv/bin/python -m bench.load ADDRESS --op turn --callers 8 --ops 500
    .venv/bin/python -m bench.load ADDRESS --op turn --rate 2000 --seconds 60

Closed loop (`--callers`): each caller runs operations back to back, on its own
conversation, until it has done `--ops` or `--seconds` have passed. Open loop (`--rate`):
operations start at that rate whatever the service does (how users arrive), each on a
conversation from a pool no other operation is using at the time, at most `--outstanding`
at once (the generator's own memory bound; an operation it cannot start is counted as
`not_started`).

Operations, at `--messages` messages of the source's example:
- `turn`: BeginTurn with `cached_version` + EndTurn with a StateDelta (append 4, drop 4),
  as the runtime sends them; two calls.
- `get`: GetState. `upsert`: a compare-and-set UpsertState of the whole state.

Calls go through bare stubs on one channel per process, no retries, so every refusal is
seen and counted. Prints one JSON object: calls and statuses, latency percentiles of the
calls that succeeded (by phase when `--phases` splits the run), this process's CPU
seconds, and the acknowledged version of every conversation (the loss check compares
them with what GetState returns afterwards).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import resource
import statistics
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from agentstate.state.v1 import state_service_pb2 as pb
from agentstate.state.v1 import state_service_pb2_grpc as pb_grpc
from bench.state_latency import grown_state

USER = "bench"
QUESTION = json.dumps([{"type": "text", "text": "我的订单88235现在什么状态？"}]).encode()
REPLY = json.dumps([{"type": "text", "text": "订单88235目前是已支付待发货。"}]).encode()
PUSHBACK = "grpc-retry-pushback-ms"


def _encode(value: Any) -> bytes:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode()


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


@dataclass
class Stats:
    """What one phase of the run saw."""

    ok: list[float] = field(default_factory=list)  # ms per successful call
    statuses: Counter[str] = field(default_factory=Counter)
    pushback_ms: Counter[str] = field(default_factory=Counter)
    errors: Counter[str] = field(default_factory=Counter)  # failures other than refusals
    refused_ms: list[float] = field(default_factory=list)  # how long a refusal took
    last_pushback_ms: int | None = None  # of the last failed call, if it was a refusal

    def summary(self, seconds: float) -> dict[str, Any]:
        out: dict[str, Any] = {
            "calls": sum(self.statuses.values()),
            "statuses": dict(self.statuses),
            "ok_per_s": len(self.ok) / seconds if seconds else 0.0,
            "pushback_ms": dict(self.pushback_ms),
            "errors": dict(self.errors.most_common(5)),
        }
        if len(self.ok) >= 2:
            q = statistics.quantiles(self.ok, n=100, method="inclusive")
            out.update(p50_ms=statistics.median(self.ok), p90_ms=q[89], p99_ms=q[98])
        if len(self.refused_ms) >= 2:
            q = statistics.quantiles(self.refused_ms, n=100, method="inclusive")
            out.update(refused_p50_ms=statistics.median(self.refused_ms), refused_p99_ms=q[98])
        return out


class Conversation:
    """One conversation's state as this generator knows it."""

    def __init__(self, stub: Any, messages: int) -> None:
        self.stub = stub
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
        # What the delta turns append, encoded once: the generator's CPU is the service's
        # competitor on a small machine.
        base = self.state["context"]
        self.appended = [_encode(dict(base[i % len(base)], id=f"n{i}")) for i in range(4)]
        self.fields = _encode({k: v for k, v in self.state.items() if k != "context"})
        self.payload = _encode(self.state)

    async def call(self, op: str, stats: Stats) -> None:
        if op == "get":
            await _timed(stats, self.stub.GetState(pb.GetStateRequest(
                user_id=USER, conversation_id=self.cid)))  # fmt: skip
        elif op == "upsert":
            request = pb.UpsertStateRequest(
                user_id=USER, conversation_id=self.cid, payload=self.payload
            )
            request.expected_version = self.version
            saved = await _timed(stats, self.stub.UpsertState(request))
            if saved is not None:
                self.version = saved.version
        else:
            await self._turn(stats)

    async def _turn(self, stats: Stats) -> None:
        begin = pb.BeginTurnRequest(
            user_id=USER, conversation_id=self.cid, holder="bench", ttl_ms=60_000,
            require_none_awaiting=True, cached_version=self.version,
            new_messages=[
                pb.NewMessage(role=pb.MESSAGE_ROLE_USER, blocks_json=QUESTION),
                pb.NewMessage(role=pb.MESSAGE_ROLE_ASSISTANT, status=pb.MESSAGE_STATUS_STREAMING),
            ],
        )  # fmt: skip
        begun = await _timed(stats, self.stub.BeginTurn(begin))
        if begun is None:
            return
        end = pb.EndTurnRequest(
            user_id=USER, conversation_id=self.cid, task_id=begun.lease.task_id,
            message_writes=[pb.MessageWrite(update=pb.MessageUpdate(
                message_id=begun.messages[1].message_id, status=pb.MESSAGE_STATUS_NORMAL,
                blocks_json=REPLY))],
            delta=pb.StateDelta(
                base_version=begun.version, drop_head=4, messages=self.appended,
                fields_json=self.fields,
            ),
        )  # fmt: skip
        ended = await _timed(stats, self.stub.EndTurn(end))
        while ended is None and stats.last_pushback_ms is not None:
            # Refused at capacity (nothing was done): the turn is saved again after the
            # pushback, as agentstate.client does, so no lease is left behind.
            await asyncio.sleep(stats.last_pushback_ms / 1000)
            ended = await _timed(stats, self.stub.EndTurn(end))
        if ended is None:
            await _quietly(self.stub.ReleaseLease(pb.ReleaseLeaseRequest(
                user_id=USER, task_id=begun.lease.task_id)))  # fmt: skip
            return
        self.version = ended.version
        self.turns += 1


async def _quietly(call: Any) -> None:
    with contextlib.suppress(grpc.RpcError):
        await call


async def _timed(stats: Stats, call: Any) -> Any:
    started = time.perf_counter()
    try:
        response = await call
    except grpc.aio.AioRpcError as exc:
        elapsed = (time.perf_counter() - started) * 1000
        stats.statuses[exc.code().name] += 1
        stats.last_pushback_ms = None
        trailers: Any = exc.trailing_metadata() or ()
        for key, value in trailers:
            if key == PUSHBACK:
                stats.pushback_ms[str(value)] += 1
                stats.refused_ms.append(elapsed)
                stats.last_pushback_ms = int(value)
        if exc.code() is not grpc.StatusCode.UNAVAILABLE or stats.last_pushback_ms is None:
            stats.errors[f"{exc.code().name}: {exc.details()}"[:200]] += 1
        return None
    stats.ok.append((time.perf_counter() - started) * 1000)
    stats.statuses["OK"] += 1
    return response


class Phases:
    """`--phases 10,60,10`: consecutive phases of the run, each with its own Stats."""

    def __init__(self, lengths: list[float], started: float) -> None:
        self.ends = []
        t = started
        for length in lengths:
            t += length
            self.ends.append(t)
        self.stats = [Stats() for _ in lengths]
        self.lengths = lengths

    def now(self) -> Stats:
        t = time.perf_counter()
        for end, stats in zip(self.ends, self.stats, strict=True):
            if t < end:
                return stats
        return self.stats[-1]


async def closed_loop(
    conversations: list[Conversation], op: str, ops: int, seconds: float, phases: Phases
) -> None:
    deadline = time.perf_counter() + seconds if seconds else float("inf")

    async def caller(c: Conversation) -> None:
        done = 0
        while (not ops or done < ops) and time.perf_counter() < deadline:
            await c.call(op, phases.now())
            done += 1

    await asyncio.gather(*(caller(c) for c in conversations))


async def open_loop(
    conversations: list[Conversation],
    op: str,
    rate: float,
    seconds: float,
    outstanding: int,
    phases: Phases,
) -> int:
    """Start an operation every 1/rate s (Poisson arrivals); returns how many could not
    start (no free conversation, or `outstanding` reached)."""
    free = list(conversations)
    running: set[asyncio.Task[None]] = set()
    not_started = 0
    arrivals = random.Random(26)

    async def one(c: Conversation) -> None:
        try:
            await c.call(op, phases.now())
        finally:
            free.append(c)

    deadline = time.perf_counter() + seconds
    next_start = time.perf_counter()
    while next_start < deadline:
        delay = next_start - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        if free and len(running) < outstanding:
            task = asyncio.create_task(one(free.pop(arrivals.randrange(len(free)))))
            running.add(task)
            task.add_done_callback(running.discard)
        else:
            not_started += 1
        next_start += arrivals.expovariate(rate)
    await asyncio.gather(*running)
    return not_started


async def run(args: argparse.Namespace) -> dict[str, Any]:
    options = [("grpc.max_receive_message_length", 64 * 1024 * 1024)]
    # Each channel its own connection (a local subchannel pool), so several channels
    # reach several workers.
    options = [*options, ("grpc.use_local_subchannel_pool", 1)]
    channels = [
        grpc.aio.insecure_channel(args.address, options=options) for _ in range(args.channels)
    ]
    stubs = [pb_grpc.StateServiceStub(ch) for ch in channels]
    count = args.callers or args.conversations
    conversations = [Conversation(stubs[i % len(stubs)], args.messages) for i in range(count)]
    for c in conversations:
        await c.create()
    warm = Stats()
    for c in conversations[: min(len(conversations), 16)]:
        for _ in range(3):
            await c.call(args.op, warm)
    lengths = [float(x) for x in args.phases.split(",")] if args.phases else [args.seconds]
    if args.ready_file:  # the driver starts its measurement window from here
        Path(args.ready_file).write_text("ready\n")  # noqa: ASYNC240
    cpu0, started = cpu_seconds(), time.perf_counter()
    phases = Phases(lengths, started)
    not_started = 0
    if args.rate:
        rates = [float(x) for x in args.rate.split(",")]
        for length, rate in zip(lengths, rates * len(lengths), strict=False):
            not_started += await open_loop(
                conversations, args.op, rate, length, args.outstanding, phases
            )
    else:
        await closed_loop(conversations, args.op, args.ops, sum(lengths) if not args.ops else 0,
                          phases)  # fmt: skip
    wall = time.perf_counter() - started
    cpu = cpu_seconds() - cpu0
    for ch in channels:
        await ch.close(None)
    return {
        "op": args.op,
        "wall_s": wall,
        "cpu_s": cpu,
        "not_started": not_started,
        "phases": [s.summary(length) for s, length in zip(phases.stats, lengths, strict=True)]
        if args.phases
        else [phases.stats[0].summary(wall)],
        "acknowledged": {c.cid: c.version for c in conversations},
        "turns": sum(c.turns for c in conversations),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("address")
    parser.add_argument("--op", choices=["turn", "get", "upsert"], default="turn")
    parser.add_argument("--messages", type=int, default=8)
    parser.add_argument("--callers", type=int, default=0, help="closed loop: this many")
    parser.add_argument("--ops", type=int, default=0, help="closed loop: operations each")
    parser.add_argument("--rate", default="", help="open loop: operations/s (per phase: a,b,c)")
    parser.add_argument("--conversations", type=int, default=256, help="open loop: pool")
    parser.add_argument("--outstanding", type=int, default=512, help="open loop: at most")
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--phases", default="", help="phase lengths in s, e.g. 10,60,10")
    parser.add_argument("--channels", type=int, default=1, help="connections to the service")
    parser.add_argument("--ready-file", default="", help="touched when the warm-up is done")
    args = parser.parse_args()
    if not args.callers and not args.rate:
        parser.error("give --callers (closed loop) or --rate (open loop)")
    result = asyncio.run(run(args))
    json.dump(result, sys.stdout)
    sys.stdout.write("\n")
    os._exit(0)  # grpc's threads can delay a normal exit by seconds


if __name__ == "__main__":
    main()
