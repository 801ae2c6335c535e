"""The agent service as a real process beside a real state service process: SIGTERM."""

from __future__ import annotations

import asyncio
import signal
import threading
import time
from typing import Any

import grpc
import pytest

from agentstate.agent.v1 import agent_service_pb2 as pb
from agentstate.agent.v1 import agent_service_pb2_grpc as pb_grpc
from agentstate.agent_service.agent_state import AgentState
from agentstate.dev.processes import ServiceProcess
from agentstate.state.v1 import state_service_pb2 as spb
from agentstate.state.v1 import state_service_pb2_grpc as spb_grpc
from tests.agent_service.test_openai_compat import FakeChatServer, Reply
from tests.support.agent_harness import metadata
from tests.support.state_process import StateServices, on_postgres

QUESTION = "我的订单88235现在什么状态？"


@pytest.fixture
def state_process(state_services: StateServices, database_url: str) -> str:
    return state_services.serve(on_postgres(database_url))


def _agent(state_address: str, orders_url: str, **env: str) -> ServiceProcess:
    return ServiceProcess(
        "agentstate.agent_service",
        {
            "AGENT_LISTEN_ADDRESS": "127.0.0.1:0",
            "AGENT_AUTH_MODE": "dev-header",
            "AGENT_STATE_ADDRESS": state_address,
            "AGENT_PROFILE": "order_demo",
            "ORDERS_DATABASE_URL": orders_url,
            "AGENT_LEASE_RENEW_SECONDS": "0.2",
            **env,
        },
    )


def _events(stream: object) -> list[pb.TurnEvent]:
    return [response.event for response in stream]  # type: ignore[attr-defined]


def test_sigterm_lets_short_turns_finish_and_interrupts_long_ones(
    state_process: str, orders_database_url: str, user_id: str
) -> None:
    state = spb_grpc.StateServiceStub(grpc.insecure_channel(state_process))

    # A turn shorter than the grace period finishes normally.
    agent = _agent(
        state_process,
        orders_database_url,
        AGENT_SCRIPTED_STEP_DELAY_SECONDS="0.4",
        AGENT_SHUTDOWN_GRACE_SECONDS="10",
    )
    with grpc.insecure_channel(agent.wait_ready()) as channel:
        stream = pb_grpc.AgentServiceStub(channel).Chat(
            pb.ChatRequest(question=QUESTION), metadata=metadata(user_id)
        )
        first = next(stream).event  # type: ignore[call-overload]
        agent.proc.send_signal(signal.SIGTERM)
        rest = _events(stream)
    assert [e.WhichOneof("event") for e in rest][-2:] == ["finish", "done"]
    assert agent.wait(30) == 0, agent.output
    conversation_id = first.meta.conversation_id

    # A turn longer than the grace period is interrupted, saved, and its lease released.
    agent = _agent(
        state_process,
        orders_database_url,
        AGENT_SCRIPTED_STEP_DELAY_SECONDS="2",
        AGENT_SHUTDOWN_GRACE_SECONDS="0.3",
    )
    with grpc.insecure_channel(agent.wait_ready()) as channel:
        stream = pb_grpc.AgentServiceStub(channel).Chat(
            pb.ChatRequest(conversation_id=conversation_id, question="那88240呢？"),
            metadata=metadata(user_id),
        )
        next(stream)  # type: ignore[call-overload]
        agent.proc.send_signal(signal.SIGTERM)
        rest = _events(stream)
    kinds = [e.WhichOneof("event") for e in rest]
    assert kinds[-2:] == ["cancel", "done"], kinds
    assert "shutting down" in rest[-2].cancel.reason
    assert agent.wait(30) == 0, agent.output

    stored = state.GetState(spb.GetStateRequest(user_id=user_id, conversation_id=conversation_id))
    saved = AgentState.decode(stored.payload)
    assert saved.shutdown_interrupted
    assert saved.context[-1].text == "那88240呢？"
    records = state.ListMessages(
        spb.ListMessagesRequest(user_id=user_id, conversation_id=conversation_id)
    ).messages
    assert records[-1].status == spb.MESSAGE_STATUS_INTERRUPTED
    lease = state.AcquireLease(
        spb.AcquireLeaseRequest(
            user_id=user_id, conversation_id=conversation_id, holder="probe", ttl_ms=1000
        )
    ).lease
    state.ReleaseLease(spb.ReleaseLeaseRequest(user_id=user_id, task_id=lease.task_id))

    # The next turn sees the flag, clears it and continues cleanly.
    agent = _agent(state_process, orders_database_url)
    with grpc.insecure_channel(agent.wait_ready()) as channel:
        events = _events(
            pb_grpc.AgentServiceStub(channel).Chat(
                pb.ChatRequest(conversation_id=conversation_id, question="那88240呢？"),
                metadata=metadata(user_id),
            )
        )
    assert agent.terminate() == 0, agent.output
    kinds = [e.WhichOneof("event") for e in events]
    assert kinds[0] == "meta" and kinds[1] == "hint" and kinds[-2:] == ["finish", "done"]
    stored = state.GetState(spb.GetStateRequest(user_id=user_id, conversation_id=conversation_id))
    saved = AgentState.decode(stored.payload)
    assert not saved.shutdown_interrupted
    assert "88240" in saved.context[-1].text


def test_a_crashed_turn_is_repaired_by_the_next_one(
    state_process: str, orders_database_url: str, user_id: str
) -> None:
    """SIGKILL mid-turn: no state is saved, the lease lapses, the next turn marks the
    dead turn's records INTERRUPTED and continues from the last saved state."""
    state = spb_grpc.StateServiceStub(grpc.insecure_channel(state_process))
    agent = _agent(state_process, orders_database_url)
    with grpc.insecure_channel(agent.wait_ready()) as channel:
        events = _events(
            pb_grpc.AgentServiceStub(channel).Chat(
                pb.ChatRequest(question=QUESTION), metadata=metadata(user_id)
            )
        )
    conversation_id = events[0].meta.conversation_id
    assert agent.terminate() == 0
    _, version = _stored(state, user_id, conversation_id)

    doomed = _agent(
        state_process,
        orders_database_url,
        AGENT_SCRIPTED_STEP_DELAY_SECONDS="30",
        AGENT_LEASE_TTL_SECONDS="1",
    )
    with grpc.insecure_channel(doomed.wait_ready()) as channel:
        stream = pb_grpc.AgentServiceStub(channel).Chat(
            pb.ChatRequest(conversation_id=conversation_id, question="那88240呢？"),
            metadata=metadata(user_id),
        )
        next(stream)  # type: ignore[call-overload]
        doomed.proc.send_signal(signal.SIGKILL)
        doomed.wait(10)
    records = state.ListMessages(
        spb.ListMessagesRequest(user_id=user_id, conversation_id=conversation_id)
    ).messages
    assert records[-1].status == spb.MESSAGE_STATUS_STREAMING  # left behind by the crash
    assert _stored(state, user_id, conversation_id)[1] == version  # nothing half-saved

    time.sleep(1.2)  # the dead turn's lease lapses
    agent = _agent(state_process, orders_database_url)
    with grpc.insecure_channel(agent.wait_ready()) as channel:
        events = _events(
            pb_grpc.AgentServiceStub(channel).Chat(
                pb.ChatRequest(conversation_id=conversation_id, question="那88240呢？"),
                metadata=metadata(user_id),
            )
        )
    assert agent.terminate() == 0, agent.output
    hints = [e.hint.text for e in events if e.HasField("hint")]
    assert any("没有正常结束" in h for h in hints)
    assert events[-2].HasField("finish")
    records = state.ListMessages(
        spb.ListMessagesRequest(user_id=user_id, conversation_id=conversation_id)
    ).messages
    statuses = [spb.MessageStatus.Name(r.status) for r in records]
    assert statuses == [
        "MESSAGE_STATUS_NORMAL",
        "MESSAGE_STATUS_NORMAL",
        "MESSAGE_STATUS_NORMAL",  # the crashed turn's question
        "MESSAGE_STATUS_INTERRUPTED",  # its reply that never came
        "MESSAGE_STATUS_NORMAL",
        "MESSAGE_STATUS_NORMAL",
    ]
    saved, new_version = _stored(state, user_id, conversation_id)
    assert new_version == version + 1
    assert [m.text for m in saved.context if m.role.value == "USER"] == [QUESTION, "那88240呢？"]


def _stored(state: object, user_id: str, conversation_id: str) -> tuple[AgentState, int]:
    got = state.GetState(  # type: ignore[attr-defined]
        spb.GetStateRequest(user_id=user_id, conversation_id=conversation_id)
    )
    return AgentState.decode(got.payload), int(got.version)


class _ThreadedChatServer:
    """The local OpenAI-compatible server (tests/agent_service/test_openai_compat.py) on its own
    thread and event loop, for an agent service running as a separate process."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.server = FakeChatServer()

    def __enter__(self) -> FakeChatServer:
        self.thread.start()
        asyncio.run_coroutine_threadsafe(self.server.start(), self.loop).result(5)
        return self.server

    def __exit__(self, *_: object) -> None:
        asyncio.run_coroutine_threadsafe(self.server.stop(), self.loop).result(5)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)


def _hang_then(server: FakeChatServer, stub: Any, user_id: str) -> tuple[Any, pb.MetaEvent]:
    """Start a turn whose model call hangs; return its stream once the endpoint hangs."""
    hung = Reply(hang_after=0)
    server.replies.append(hung)
    server.hung_up.clear()
    stream = stub.Chat(pb.ChatRequest(question=QUESTION), metadata=metadata(user_id))
    meta = next(stream).event.meta
    deadline = time.monotonic() + 10
    while len(server.received) < 1 or not server.hanging.is_set():
        assert time.monotonic() < deadline, "the model was never called"
        time.sleep(0.02)
    time.sleep(0.2)
    return stream, meta


def test_stop_and_sigterm_cancel_a_hung_model_call_in_a_real_agent_process(
    state_process: str, orders_database_url: str, user_id: str
) -> None:
    """Issue 14: with the defaults (60 s timeout, 2 retries) a hung endpoint used to
    hold a stopped turn for minutes. Stop and SIGTERM end it within a second."""
    with _ThreadedChatServer() as server:
        agent = _agent(
            state_process,
            orders_database_url,
            AGENT_MODEL="openai",
            OPENAI_BASE_URL=server.base_url,
            OPENAI_API_KEY="sk-test",
            AGENT_SHUTDOWN_GRACE_SECONDS="0.3",
        )
        with grpc.insecure_channel(agent.wait_ready()) as channel:
            stub = pb_grpc.AgentServiceStub(channel)
            stream, meta = _hang_then(server, stub, user_id)
            started = time.monotonic()
            stub.Stop(pb.StopRequest(task_id=meta.task_id), metadata=metadata(user_id))
            rest = _events(stream)
            took = time.monotonic() - started
            assert [e.WhichOneof("event") for e in rest][-2:] == ["cancel", "done"]
            assert rest[-2].cancel.reason == "stopped by the user"
            print(f"Stop -> cancel event: {took:.3f}s")  # noted in the report
            assert took < 1.0, f"Stop took {took:.2f}s"
            assert server.hung_up and server.hung_up[0] - started < 1.0
            server.hanging.clear()

            stream, meta = _hang_then(server, stub, user_id)
            started = time.monotonic()
            agent.proc.send_signal(signal.SIGTERM)
            rest = _events(stream)
            took = time.monotonic() - started
        assert agent.wait(30) == 0, agent.output
    assert rest[-2].cancel.reason == "the service is shutting down"
    print(f"SIGTERM (grace 0.3 s) -> cancel event: {took:.3f}s")
    assert took < 0.3 + 1.0, f"SIGTERM ended the turn after {took:.2f}s"
    assert server.hung_up and server.hung_up[0] - started < 0.3 + 1.0
