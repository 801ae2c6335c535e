"""Wall time of whole agent turns with the scripted model: the runtime's own overhead.

Starts a state service (throwaway embedded PostgreSQL, or DATABASE_URL) and an
agent service as processes on 127.0.0.1, then repeats the source's example:
Chat (load_skill, query_order, cancel_order card: 3 model steps, 2 tools, the
state saved with 6 messages) and Confirm(approved=false) (state loaded, denial
settled, reply, the 8-message state saved). The scripted model answers
instantly, so the time is gRPC, lease, state load/save and record writes.

    .venv/bin/python -m bench.turn_latency [--turns 100]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import grpc

from agentstate.agent.v1 import agent_service_pb2 as pb
from agentstate.agent.v1 import agent_service_pb2_grpc as pb_grpc
from agentstate.client.metadata import USER_ID_METADATA_KEY
from agentstate.dev.processes import ServiceProcess
from tests.support.telemetry_tools import OtlpReceiver

QUESTION = "我买的那块Apple Watch还没发货的话，帮我取消吧，不想要了。"


def one_example(stub: Any, user_id: str) -> tuple[float, float]:
    md = ((USER_ID_METADATA_KEY, user_id),)
    start = time.perf_counter()
    events = [r.event for r in stub.Chat(pb.ChatRequest(question=QUESTION), metadata=md)]
    chat_ms = (time.perf_counter() - start) * 1000
    conversation_id = events[0].meta.conversation_id
    card = next(e.confirm for e in events if e.HasField("confirm"))
    start = time.perf_counter()
    replies = [
        r.event
        for r in stub.Confirm(
            pb.ConfirmRequest(
                conversation_id=conversation_id, message_id=card.message_id, approved=False
            ),
            metadata=md,
        )
    ]
    confirm_ms = (time.perf_counter() - start) * 1000
    assert replies[-2].HasField("finish"), replies[-2]
    return chat_ms, confirm_ms


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=100)
    parser.add_argument(
        "--tracing", action="store_true", help="both services export traces and metrics over OTLP"
    )
    args = parser.parse_args()
    receiver = OtlpReceiver()
    otel: dict[str, str] = {}
    if args.tracing:
        otel = {
            "OTEL_TRACES_EXPORTER": "otlp",
            "OTEL_METRICS_EXPORTER": "otlp",
            "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.start(),
            "OTEL_EXPORTER_OTLP_INSECURE": "true",
        }
    root = Path(tempfile.mkdtemp(prefix="agentstate-bench-"))
    root.chmod(0o755)
    services = []
    try:
        state = ServiceProcess(
            "agentstate.state_service",
            {
                **otel,
                "STATE_LISTEN_ADDRESS": "127.0.0.1:0",
                "STATE_EMBEDDED_PG_DIR": str(root / "pgdata"),
                "STATE_STORE": "postgres" if os.environ.get("DATABASE_URL") else "embedded",
                "DATABASE_URL": os.environ.get("DATABASE_URL", ""),
            },
        )
        services.append(state)
        agent = ServiceProcess(
            "agentstate.agent_service",
            {
                **otel,
                "AGENT_LISTEN_ADDRESS": "127.0.0.1:0",
                "AGENT_AUTH_MODE": "dev-header",
                "AGENT_STATE_ADDRESS": state.wait_ready(),
                "AGENT_PROFILE": "order_demo",
            },
        )
        services.append(agent)
        with grpc.insecure_channel(agent.wait_ready()) as channel:
            stub = pb_grpc.AgentServiceStub(channel)
            for i in range(5):  # warm-up
                one_example(stub, f"warmup-{i}")
            samples = [one_example(stub, f"bench-{i}") for i in range(args.turns)]
    finally:
        for service in reversed(services):
            service.terminate()
        receiver.stop()
        shutil.rmtree(root, ignore_errors=True)
    tracing = f"tracing on (OTLP, {len(receiver.spans)} spans received)" if args.tracing else "off"
    print(f"tracing: {tracing}")
    print(f"{args.turns} runs of the source's example, sequential, scripted model, 127.0.0.1")
    print(f"{'turn':<34} {'p50 ms':>8} {'p90 ms':>8} {'max ms':>8}")
    for name, values in (
        ("Chat (3 steps, 2 tools, card)", [s[0] for s in samples]),
        ("Confirm deny (8-message save)", [s[1] for s in samples]),
    ):
        q = statistics.quantiles(values, n=10, method="inclusive")
        print(f"{name:<34} {statistics.median(values):>8.1f} {q[8]:>8.1f} {max(values):>8.1f}")


if __name__ == "__main__":
    main()
