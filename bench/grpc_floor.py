"""The floor of a turn in Python gRPC: what the framework alone costs.

A bare agent-like server streams `--events` small events per call after `--hops` unary calls
to a bare state-like server (both doing nothing else, in a background thread of this
process), called from a synchronous client, as bench.turn_latency's client does.

    .venv/bin/python -m bench.grpc_floor [--events 21] [--hops 2] [--calls 300]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import threading
import time
from typing import Any

import grpc

from agentstate.agent.v1 import agent_service_pb2 as pb
from agentstate.agent.v1 import agent_service_pb2_grpc as pb_grpc
from agentstate.state.v1 import state_service_pb2 as spb
from agentstate.state.v1 import state_service_pb2_grpc as spb_grpc


class _State(spb_grpc.StateServiceServicer):
    async def GetConversation(self, request: Any, context: Any) -> spb.GetConversationResponse:
        return spb.GetConversationResponse()


class _Agent(pb_grpc.AgentServiceServicer):
    def __init__(self, state: Any, events: int, hops: int) -> None:
        self.state, self.events, self.hops = state, events, hops

    async def Chat(self, request: Any, context: Any) -> Any:
        for _ in range(self.hops):
            await self.state.GetConversation(spb.GetConversationRequest(user_id="u"))
        for _ in range(self.events):
            yield pb.ChatResponse(event=pb.TurnEvent(message=pb.MessageEvent(delta="x" * 20)))


async def _serve(events: int, hops: int, ready: list[int]) -> None:
    state = grpc.aio.server()
    spb_grpc.add_StateServiceServicer_to_server(_State(), state)  # type: ignore[abstract]
    state_port = state.add_insecure_port("127.0.0.1:0")
    await state.start()
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{state_port}")
    agent = grpc.aio.server()
    stub = spb_grpc.StateServiceStub(channel)
    pb_grpc.add_AgentServiceServicer_to_server(_Agent(stub, events, hops), agent)  # type: ignore[abstract]
    ready.append(agent.add_insecure_port("127.0.0.1:0"))
    await agent.start()
    await asyncio.Event().wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=21)
    parser.add_argument("--hops", type=int, default=2)
    parser.add_argument("--calls", type=int, default=300)
    args = parser.parse_args()
    ready: list[int] = []
    threading.Thread(
        target=lambda: asyncio.run(_serve(args.events, args.hops, ready)), daemon=True
    ).start()
    while not ready:
        time.sleep(0.05)
    with grpc.insecure_channel(f"127.0.0.1:{ready[0]}") as channel:
        stub = pb_grpc.AgentServiceStub(channel)
        for _ in range(50):
            list(stub.Chat(pb.ChatRequest()))
        samples = []
        for _ in range(args.calls):
            started = time.perf_counter()
            list(stub.Chat(pb.ChatRequest()))
            samples.append((time.perf_counter() - started) * 1000)
    print(
        f"{args.events} streamed events after {args.hops} unary hops: "
        f"p50 {statistics.median(samples):.2f} ms"
    )


if __name__ == "__main__":
    main()
