"""A 200+-message conversation through the real stack, to see context management at work.

In-process state service (on DATABASE_URL or a throwaway embedded PostgreSQL) and
agent service; the scripted model; a tool whose results are long (about 1.4 KB
each). Per turn it records the time the runtime spent trimming and compacting,
and at the end it prints the size of the saved state and of the message records.

    .venv/bin/python -m bench.context_run [--turns 60] [--budget 6000]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from agentstate.agent_service.context.manager import ContextReport
from agentstate.common.embedded_postgres import EmbeddedPostgres
from agentstate.state.v1 import state_service_pb2 as spb
from tests.agent_service.test_context import ADDRESS, fetch_report_tool
from tests.support.agent_harness import RecordingModel, Stack
from tests.support.source_example import QUESTION


async def run(dsn: str, turns: int, budget: int) -> None:
    stack = Stack(dsn, dsn, context_budget_tokens=budget)
    await stack.start_state()
    client = await stack.start_agent(model=RecordingModel(), extra_tools=[fetch_report_tool()])
    app = stack.agents[0][0]
    assert app.runner is not None
    manager = app.runner.context
    reports: list[tuple[float, ContextReport]] = []
    prepare = manager.prepare

    async def timed_prepare(*args, **kwargs):  # type: ignore[no-untyped-def]
        started = time.perf_counter()
        report = await prepare(*args, **kwargs)
        reports.append((time.perf_counter() - started, report))
        return report

    manager.prepare = timed_prepare  # type: ignore[method-assign]
    user = "bench-context"
    first = await client.chat(user, f"我的收货地址是{ADDRESS}")
    cid = first.meta.conversation_id
    card = await client.chat(user, QUESTION, cid)
    await client.confirm(user, cid, card.card.message_id, approved=False)
    per_turn: list[float] = []
    for n in range(1, turns + 1):
        before = len(reports)
        await client.chat(user, f'/fetch_report {{"n": {n}}}', cid)
        per_turn.append(sum(seconds for seconds, _ in reports[before:]) * 1000)
    answer = await client.chat(user, "我的收货地址是什么？", cid)
    got = await stack.reader.stub.GetState(spb.GetStateRequest(user_id=user, conversation_id=cid))
    state, _ = await stack.reader.state(user, cid)
    records, token = [], ""
    while True:
        page = await stack.reader.stub.ListMessages(
            spb.ListMessagesRequest(user_id=user, conversation_id=cid, page_token=token)
        )
        records.extend(page.messages)
        token = page.next_page_token
        if not token:
            break
    compactions = await stack.reader.stub.ListCompactions(
        spb.ListCompactionsRequest(user_id=user, conversation_id=cid)
    )
    await stack.close()
    original = 8 + 4 * turns + 2
    trims = sum(r.trimmed for _, r in reports)
    q = statistics.quantiles(per_turn, n=10, method="inclusive")
    print(f"turns: {turns + 4}; context messages produced: {original}; budget {budget} tokens")
    print(
        f"saved state: {len(got.payload)} bytes, {len(state.context)} messages in context, "
        f"summary {len(state.summary)} chars"
    )
    record_bytes = sum(len(r.blocks_json) + len(r.metadata_json) for r in records)
    print(f"message records: {len(records)} records, {record_bytes} bytes of blocks+metadata")
    print(f"trimmed results: {trims}; compactions: {len(compactions.compactions)}")
    print(
        f"trim+compaction time per turn: p50 {statistics.median(per_turn):.2f} ms, "
        f"p90 {q[8]:.2f} ms, max {max(per_turn):.2f} ms"
    )
    for c in compactions.compactions:
        print(
            f"  compaction: {c.messages_before} -> {c.messages_after} messages, "
            f"{c.tokens_before} -> {c.tokens_after} tokens ({c.reason})"
        )
    print(f"early fact answered: {ADDRESS in answer.reply}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=60)
    parser.add_argument("--budget", type=int, default=6000)
    args = parser.parse_args()
    dsn = os.environ.get("DATABASE_URL", "")
    server = None
    root = Path(tempfile.mkdtemp(prefix="agentstate-bench-"))
    root.chmod(0o755)
    try:
        if not dsn:
            server = EmbeddedPostgres(root / "pgdata")
            dsn = server.start()
        asyncio.run(run(dsn, args.turns, args.budget))
    finally:
        if server is not None:
            server.stop()
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
