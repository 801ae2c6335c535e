"""Traces and metrics: one trace per turn across both services and PostgreSQL; OTLP export."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator

import grpc
import pytest
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from agentstate.agent.v1 import agent_service_pb2 as pb
from agentstate.agent.v1 import agent_service_pb2_grpc as pb_grpc
from agentstate.agent_service.model.base import ModelEvent, ModelRequest
from agentstate.dev.processes import ServiceProcess
from agentstate.state.v1 import state_service_pb2 as spb
from tests.support.agent_harness import RecordingModel, Stack, metadata
from tests.support.source_example import QUESTION
from tests.support.state_process import StateServices, on_postgres
from tests.support.telemetry_tools import OtlpReceiver, metric_points, span_tree


def _trace_of(spans: list[ReadableSpan], name: str) -> list[ReadableSpan]:
    root = next(s for s in spans if s.name == name)
    assert root.context is not None
    return [
        s for s in spans if s.context is not None and s.context.trace_id == root.context.trace_id
    ]


def _one(spans: list[ReadableSpan], name: str, kind: SpanKind | None = None) -> ReadableSpan:
    found = [s for s in spans if s.name == name and (kind is None or s.kind == kind)]
    assert len(found) == 1, f"{name}: {[s.name for s in spans]}"
    return found[0]


def _children(spans: list[ReadableSpan], parent: ReadableSpan) -> list[ReadableSpan]:
    assert parent.context is not None
    return [s for s in spans if s.parent is not None and s.parent.span_id == parent.context.span_id]


async def test_one_trace_per_turn_across_services_and_database(
    traced_stack: Stack,
    telemetry: tuple[InMemorySpanExporter, InMemoryMetricReader],
    user_id: str,
) -> None:
    exporter, reader = telemetry
    client = traced_stack.agents[0][1]
    first = await client.chat(user_id, QUESTION)
    conversation_id = first.meta.conversation_id
    exporter.clear()
    second = await client.confirm(user_id, conversation_id, first.card.message_id, False)
    assert second.code == grpc.StatusCode.OK
    spans = list(exporter.get_finished_spans())
    turn_spans = _trace_of(spans, "agent.turn Confirm")
    assert {s.context.trace_id for s in spans if s.context} == {turn_spans[0].context.trace_id}

    turn = _one(turn_spans, "agent.turn Confirm")
    assert turn.attributes is not None
    assert turn.attributes["agentstate.conversation_id"] == conversation_id
    assert turn.attributes["agentstate.turn.outcome"] == "finished"
    assert turn.attributes["agentstate.task_id"] == second.meta.task_id
    assert (
        turn.attributes["enduser.id"] != user_id and len(str(turn.attributes["enduser.id"])) == 16
    )
    # The agent's gRPC server span is the root; the turn sits right under it.
    root = _one(turn_spans, "/agentstate.agent.v1.AgentService/Confirm", SpanKind.SERVER)
    assert root.parent is None and turn.parent is not None
    assert turn.parent.span_id == root.context.span_id

    load = _one(turn_spans, "state.load")
    save = _one(turn_spans, "state.save")
    assert load.attributes is not None and save.attributes is not None
    assert load.attributes["agentstate.state.outcome"] == "ok"
    assert load.attributes["agentstate.state.version_read"] == 1
    # The agent saved version 1 itself and holds it: BeginTurn did not send it again.
    assert load.attributes["agentstate.state.payload_omitted"] is True
    assert load.attributes["agentstate.state.payload_bytes"] == 0
    assert save.attributes["agentstate.state.outcome"] == "ok"
    assert save.attributes["agentstate.state.version_read"] == 1
    assert save.attributes["agentstate.state.version_written"] == 2
    assert save.attributes["agentstate.state.message_count"] == 8
    # Only what the Confirm turn changed was sent (the settled call, the reply).
    assert save.attributes["agentstate.state.delta"] is True
    assert 0 < int(str(save.attributes["agentstate.state.payload_bytes"])) < 2500
    for span in (load, save):
        assert span.parent is not None and span.parent.span_id == turn.context.span_id

    # state.load / state.save -> gRPC client span -> state service server span -> ONE
    # PostgreSQL statement each: the turn is two state calls of one round trip each.
    for span, rpc, function in (
        (load, "BeginTurn", "agentstate_begin_turn"),
        (save, "EndTurn", "agentstate_save_state"),
    ):
        (client_call,) = _children(turn_spans, span)
        assert client_call.kind == SpanKind.CLIENT
        assert client_call.name == f"/agentstate.state.v1.StateService/{rpc}"
        (server_call,) = _children(turn_spans, client_call)
        assert server_call.kind == SpanKind.SERVER
        (database,) = _children(turn_spans, server_call)
        assert database.attributes and database.attributes.get("db.system") == "postgresql"
        assert function in str(database.attributes.get("db.statement"))
    state_calls = [s for s in turn_spans if s.name.startswith("/agentstate.state.v1.")]
    assert len([s for s in state_calls if s.kind == SpanKind.CLIENT]) == 2

    assert len([s for s in turn_spans if s.name == "model.call"]) == 1
    tool = _one(turn_spans, "tool.call") if any(s.name == "tool.call" for s in turn_spans) else None
    assert tool is None  # denied: the tool never ran

    tree = span_tree(turn_spans, turn.context.trace_id)
    assert "state.load" in tree and "EndTurn" in tree

    histogram = metric_points(reader, "agentstate.state.save.duration")
    assert any(a.get("side") == "client" for a, _ in histogram)
    assert any(a.get("side") == "server" for a, _ in histogram)
    decisions = metric_points(reader, "agentstate.confirmations")
    assert any(a.get("decision") == "denied" and v >= 1 for a, v in decisions)
    assert metric_points(reader, "agentstate.turns.running")


class _Meddler(RecordingModel):
    """Writes the conversation's state behind the turn's back during its model call."""

    def __init__(self, stack: Stack, user_id: str) -> None:
        super().__init__()
        self.stack, self.user_id = stack, user_id
        self.conversation_id = ""

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelEvent]:
        if self.conversation_id:
            got = await self.stack.reader.stub.GetState(
                spb.GetStateRequest(user_id=self.user_id, conversation_id=self.conversation_id)
            )
            await self.stack.reader.stub.UpsertState(
                spb.UpsertStateRequest(
                    user_id=self.user_id,
                    conversation_id=self.conversation_id,
                    payload=got.payload,
                    expected_version=got.version,
                )
            )
        async for event in super().stream(request):
            yield event


async def test_version_conflict_is_visible(
    traced_stack: Stack,
    telemetry: tuple[InMemorySpanExporter, InMemoryMetricReader],
    user_id: str,
) -> None:
    exporter, reader = telemetry

    def conflicts(side: str) -> float:
        points = metric_points(reader, "agentstate.state.version_conflicts")
        return sum(v for a, v in points if a.get("side") == side)

    before = conflicts("client"), conflicts("server")
    meddler = _Meddler(traced_stack, user_id)
    client = await traced_stack.start_agent(model=meddler)
    first = await client.chat(user_id, "我的订单88235现在什么状态？")
    meddler.conversation_id = first.meta.conversation_id
    exporter.clear()
    turn = await client.chat(user_id, "那88240呢？", first.meta.conversation_id)
    assert turn.code == grpc.StatusCode.ABORTED, turn.details
    save = _one(list(exporter.get_finished_spans()), "state.save")
    assert save.attributes is not None
    assert save.attributes["agentstate.state.outcome"] == "version_conflict"
    assert conflicts("client") == before[0] + 1
    assert conflicts("server") == before[1] + 1


# ------------------------------------------------------------------ OTLP export


@pytest.fixture
def otlp_receiver() -> Iterator[tuple[OtlpReceiver, str]]:
    receiver = OtlpReceiver()
    endpoint = receiver.start()
    yield receiver, endpoint
    receiver.stop()


def test_otlp_export_from_both_services_configured_by_environment(
    otlp_receiver: tuple[OtlpReceiver, str],
    state_services: StateServices,
    database_url: str,
    orders_database_url: str,
    user_id: str,
) -> None:
    receiver, endpoint = otlp_receiver
    otel = {
        "OTEL_TRACES_EXPORTER": "otlp",
        "OTEL_METRICS_EXPORTER": "otlp",
        "OTEL_EXPORTER_OTLP_ENDPOINT": endpoint,
        "OTEL_EXPORTER_OTLP_INSECURE": "true",
        "OTEL_BSP_SCHEDULE_DELAY": "100",
        "OTEL_METRIC_EXPORT_INTERVAL": "500",
    }
    state = state_services.start(
        on_postgres(database_url, **otel, OTEL_SERVICE_NAME="agentstate-state")
    )
    agent = ServiceProcess(
        "agentstate.agent_service",
        {
            **otel,
            "OTEL_SERVICE_NAME": "agentstate-agent",
            "AGENT_LISTEN_ADDRESS": "127.0.0.1:0",
            "AGENT_AUTH_MODE": "dev-header",
            "AGENT_STATE_ADDRESS": state.wait_ready(),
            "AGENT_PROFILE": "order_demo",
            "ORDERS_DATABASE_URL": orders_database_url,
        },
    )
    with grpc.insecure_channel(agent.wait_ready()) as channel:
        events = [
            r.event
            for r in pb_grpc.AgentServiceStub(channel).Chat(
                pb.ChatRequest(question="我的订单88235现在什么状态？"), metadata=metadata(user_id)
            )
        ]
    assert events[-2].HasField("finish")
    assert agent.terminate() == 0, agent.output
    assert state.terminate() == 0, state.output

    turns = [span for service, span in receiver.spans if span.name == "agent.turn Chat"]
    assert len(turns) == 1
    trace_id = turns[0].trace_id
    in_trace = {
        (service, span.name) for service, span in receiver.spans if span.trace_id == trace_id
    }
    assert ("agentstate-agent", "state.load") in in_trace
    assert ("agentstate-agent", "state.save") in in_trace
    assert ("agentstate-state", "/agentstate.state.v1.StateService/EndTurn") in in_trace
    assert any(
        service == "agentstate-state"
        and name not in {"/agentstate.state.v1.StateService/UpsertState"}
        and not name.startswith("/")
        for service, name in in_trace
    )  # database spans from the state service
    assert ("agentstate-agent", "agentstate.state.save.duration") in receiver.metric_names
    assert ("agentstate-state", "agentstate.state.save.duration") in receiver.metric_names
    # Logs are JSON lines carrying the trace and span ids of the turn.
    logged = [json.loads(line) for line in agent.lines if line.startswith("{")]
    turn_logs = [entry for entry in logged if "ended: finished" in entry["message"]]
    assert turn_logs and turn_logs[0]["trace_id"] == trace_id.hex()
    assert len(turn_logs[0]["span_id"]) == 16


def test_tracing_off_installs_nothing() -> None:
    probe = subprocess.run(
        [
            sys.executable,
            "-c",
            "from agentstate.common import telemetry as t; "
            "t.configure_from_env('x', {}); "
            "from opentelemetry import trace, metrics; "
            "print(type(trace.get_tracer_provider()).__name__, "
            "type(metrics.get_meter_provider()).__name__, "
            "t.tracing_enabled(), t.grpc_server_interceptors(), t.grpc_client_interceptors())",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    assert probe.stdout.split() == [
        "ProxyTracerProvider",
        "_ProxyMeterProvider",
        "False",
        "[]",
        "[]",
    ]
