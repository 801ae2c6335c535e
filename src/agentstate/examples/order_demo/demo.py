"""`agentstate-demo`: the source's worked example, end to end, on the embedded default.

Starts a state service (which starts and owns a throwaway PostgreSQL) and an
agent service with the order_demo profile (orders in memory unless
ORDERS_DATABASE_URL is set) as real processes on 127.0.0.1, asks the source's
question, answers the confirmation card (Cancel, as in the source, or
--approve), then prints the stored AgentState and the message records, and
shuts both down.
Nothing external is needed: the model is the offline scripted one.
"""

from __future__ import annotations

import argparse
import shutil
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import grpc

from agentstate.agent.v1 import agent_service_pb2_grpc as pb_grpc
from agentstate.agent_service.agent_state import AgentState
from agentstate.agent_service.cli import (
    INTERRUPTED_EXIT,
    Interrupted,
    Renderer,
    converse,
    print_history,
)
from agentstate.common.config import ConfigError
from agentstate.common.listen import check_listen_address
from agentstate.dev.processes import ServiceProcess
from agentstate.state.v1 import state_service_pb2 as spb
from agentstate.state.v1 import state_service_pb2_grpc as spb_grpc

QUESTION = "我买的那块Apple Watch还没发货的话，帮我取消吧，不想要了。"
USER = "admin"


def describe_state(state: AgentState, version: int) -> str:
    lines = [f"stored AgentState (version {version}), {len(state.context)} messages in context:"]
    for index, msg in enumerate(state.context, start=1):
        parts = []
        for block in msg.content:
            data = block.to_json()
            if data["type"] in ("tool_use", "tool_result"):
                parts.append(f"{data['type']} {data['name']} ({data['state']})")
            else:
                parts.append(data["type"])
        lines.append(f"  {index}. {msg.role.value:<9} {', '.join(parts)}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="agentstate-demo", description=__doc__)
    parser.add_argument("--approve", action="store_true", help="approve the card instead")
    parser.add_argument("--question", default=QUESTION)
    parser.add_argument(
        "--web",
        action="store_true",
        help="start the web console too, print its URL and run until Ctrl-C",
    )
    parser.add_argument(
        "--web-address",
        default="127.0.0.1:8080",
        help="host:port of the console with --web (port 0 picks one)",
    )
    args = parser.parse_args(argv)
    if args.web:
        try:  # before anything starts: a port in use is one line, not three services' logs
            check_listen_address(args.web_address, "--web-address")
        except ConfigError as exc:
            print(f"agentstate-demo: {exc}", file=sys.stderr)
            return 2

    started = time.monotonic()
    workdir = Path(tempfile.mkdtemp(prefix="agentstate-demo-"))
    workdir.chmod(0o755)  # the embedded PostgreSQL may run as the `postgres` user
    services: list[ServiceProcess] = []
    try:
        print("starting the state service (embedded PostgreSQL) ...")
        state_service = ServiceProcess(
            "agentstate.state_service",
            {
                "STATE_LISTEN_ADDRESS": "127.0.0.1:0",
                "DATABASE_URL": "",
                "STATE_EMBEDDED_PG_DIR": str(workdir / "pgdata"),
            },
        )
        services.append(state_service)
        state_address = state_service.wait_ready()
        print(f"  state service on {state_address}")
        agent_service = ServiceProcess(
            "agentstate.agent_service",
            {
                "AGENT_LISTEN_ADDRESS": "127.0.0.1:0",
                # On loopback, for this terminal only: the demo names its user in the
                # bare header (the service logs a warning that says so).
                "AGENT_AUTH_MODE": "dev-header",
                "AGENT_STATE_ADDRESS": state_address,
                "AGENT_PROFILE": "order_demo",
            },
        )
        services.append(agent_service)
        agent_address = agent_service.wait_ready()
        print(f"  agent service on {agent_address} (profile order_demo, scripted model)\n")

        if args.web:
            return _serve_web(services, state_address, agent_address, args.web_address)
        renderer = Renderer()
        print(f"user: {args.question}")
        with grpc.insecure_channel(agent_address) as channel:
            stub: Any = pb_grpc.AgentServiceStub(channel)
            conversation_id = converse(
                stub, USER, args.question, "", lambda card: args.approve, renderer
            )
        with grpc.insecure_channel(state_address) as channel:
            state_stub: Any = spb_grpc.StateServiceStub(channel)
            stored = state_stub.GetState(
                spb.GetStateRequest(user_id=USER, conversation_id=conversation_id)
            )
            records = state_stub.ListMessages(
                spb.ListMessagesRequest(user_id=USER, conversation_id=conversation_id)
            ).messages
        print()
        print(describe_state(AgentState.decode(stored.payload), stored.version))
        print("\nmessage records (what a UI replays):")
        print_history(records)
    except (grpc.RpcError, AssertionError) as exc:
        print(f"agentstate-demo: failed: {exc}", file=sys.stderr)
        for service in services:
            print(service.output, file=sys.stderr)
        return 1
    except (Interrupted, KeyboardInterrupt):
        print("agentstate-demo: interrupted; stopping the services", file=sys.stderr)
        return INTERRUPTED_EXIT
    finally:
        codes = [service.terminate() for service in reversed(services)]
        shutil.rmtree(workdir, ignore_errors=True)
    if any(codes):
        print(f"agentstate-demo: a service exited with {codes}", file=sys.stderr)
        return 1
    print(f"\ndone in {time.monotonic() - started:.1f}s; both services stopped cleanly.")
    return 0


def _serve_web(
    services: list[ServiceProcess], state_address: str, agent_address: str, address: str
) -> int:
    """`--web`: the console on top of the two services, until Ctrl-C (or SIGTERM)."""
    console = ServiceProcess(
        "agentstate.console",
        {
            "CONSOLE_LISTEN_ADDRESS": address,
            "CONSOLE_AGENT_ADDRESS": agent_address,
            "CONSOLE_STATE_ADDRESS": state_address,
            "CONSOLE_USER_HEADER": "",
            "CONSOLE_DEV_USER": USER,  # development identity: no proxy in front
        },
    )
    services.append(console)
    url = console.wait_ready()
    print(f"web console: {url}  (signed in as {USER!r}; Ctrl-C stops everything)")
    print(f"try: {QUESTION}", flush=True)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        while not stop.is_set() and all(s.proc.poll() is None for s in services):
            stop.wait(0.5)
    except KeyboardInterrupt:
        pass
    failed = [s for s in services if s.proc.poll() not in (None, 0)]
    for service in failed:
        print(service.output, file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
