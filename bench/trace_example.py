"""Print the trace of the source's example (both turns) as span trees with timings.

In-process state service and agent service on a throwaway embedded PostgreSQL,
spans collected in memory. The output is what docs/tracing.md shows.

    .venv/bin/python -m bench.trace_example
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from pathlib import Path

from agentstate.common.embedded_postgres import EmbeddedPostgres
from tests.support.agent_harness import Stack
from tests.support.source_example import QUESTION
from tests.support.telemetry_tools import install_in_memory, span_tree


async def run(dsn: str) -> None:
    exporter, _ = install_in_memory()
    stack = Stack(dsn, dsn)
    await stack.start_state()
    client = await stack.start_agent()
    try:
        await client.chat("warmup", QUESTION)  # first-use costs (pool, prepared statements)
        exporter.clear()
        first = await client.chat("admin", QUESTION)
        chat_spans = list(exporter.get_finished_spans())
        exporter.clear()
        await client.confirm("admin", first.meta.conversation_id, first.card.message_id, False)
        confirm_spans = list(exporter.get_finished_spans())
    finally:
        await stack.close()
    for title, spans in (("Chat", chat_spans), ("Confirm(approved=false)", confirm_spans)):
        root = next(s for s in spans if s.parent is None and s.context is not None)
        assert root.context is not None
        print(f"--- {title}: trace {root.context.trace_id:032x}")
        print(span_tree(spans, root.context.trace_id))


def main() -> None:
    root = Path(tempfile.mkdtemp(prefix="agentstate-trace-"))
    root.chmod(0o755)
    server = EmbeddedPostgres(root / "pgdata")
    try:
        asyncio.run(run(server.start()))
    finally:
        server.stop()
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
