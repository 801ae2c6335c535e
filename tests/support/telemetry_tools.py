"""Collecting and printing spans in tests (and for the tracing docs)."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from concurrent import futures
from typing import Any

import grpc
from opentelemetry import metrics, trace
from opentelemetry.proto.collector.metrics.v1 import (
    metrics_service_pb2,
    metrics_service_pb2_grpc,
)
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

_installed: tuple[InMemorySpanExporter, InMemoryMetricReader] | None = None


def install_in_memory() -> tuple[InMemorySpanExporter, InMemoryMetricReader]:
    """Install SDK providers with in-memory export, once per process."""
    global _installed
    if _installed is None:
        exporter = InMemorySpanExporter()
        provider = TracerProvider(resource=Resource.create({"service.name": "in-process"}))
        provider.add_span_processor(SimpleSpanProcessor(exporter))
        trace.set_tracer_provider(provider)
        reader = InMemoryMetricReader()
        metrics.set_meter_provider(MeterProvider(metric_readers=[reader]))
        _installed = (exporter, reader)
    return _installed


def metric_points(reader: InMemoryMetricReader, name: str) -> list[tuple[dict[str, object], float]]:
    """(attributes, value) of every data point of one metric (sum, or histogram count)."""
    data = reader.get_metrics_data()
    points: list[tuple[dict[str, object], float]] = []
    if data is None:
        return points
    for resource in data.resource_metrics:
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                if metric.name != name:
                    continue
                for point in metric.data.data_points:
                    value = getattr(point, "value", None)
                    if value is None:
                        value = point.count  # type: ignore[union-attr]
                    points.append((dict(point.attributes or {}), float(value)))
    return points


def span_tree(spans: Sequence[ReadableSpan], root_trace_id: int) -> str:
    """One trace as an indented tree with durations in milliseconds."""
    mine = [s for s in spans if s.context is not None and s.context.trace_id == root_trace_id]
    ids = {s.context.span_id for s in mine if s.context is not None}
    children: dict[int | None, list[ReadableSpan]] = {}
    for span in mine:
        parent = span.parent.span_id if span.parent and span.parent.span_id in ids else None
        children.setdefault(parent, []).append(span)
    lines: list[str] = []

    def walk(parent: int | None, depth: int) -> None:
        for span in sorted(children.get(parent, []), key=lambda s: s.start_time or 0):
            ms = ((span.end_time or 0) - (span.start_time or 0)) / 1e6
            service = span.resource.attributes.get("service.name", "")
            kind = span.kind.name.lower()
            lines.append(f"{'  ' * depth}{span.name}  [{kind}, {service}]  {ms:.2f} ms")
            assert span.context is not None
            walk(span.context.span_id, depth + 1)

    walk(None, 0)
    return "\n".join(lines)


class OtlpReceiver:
    """A minimal OTLP/gRPC collector on 127.0.0.1 that keeps what it is sent."""

    def __init__(self) -> None:
        self.spans: list[tuple[str, Any]] = []  # (service.name, span)
        self.metric_names: set[tuple[str, str]] = set()
        self._resource_metrics: list[Any] = []  # every export's, as sent
        self._lock = threading.Lock()
        self._server: grpc.Server | None = None

    def start(self) -> str:
        receiver = self

        class Traces(trace_service_pb2_grpc.TraceServiceServicer):
            def Export(self, request: Any, context: Any) -> Any:
                with receiver._lock:
                    for resource_spans in request.resource_spans:
                        service = _service_name(resource_spans.resource)
                        for scope in resource_spans.scope_spans:
                            receiver.spans += [(service, span) for span in scope.spans]
                return trace_service_pb2.ExportTraceServiceResponse()

        class Metrics(metrics_service_pb2_grpc.MetricsServiceServicer):
            def Export(self, request: Any, context: Any) -> Any:
                with receiver._lock:
                    receiver._resource_metrics += list(request.resource_metrics)
                    for resource_metrics in request.resource_metrics:
                        service = _service_name(resource_metrics.resource)
                        for scope in resource_metrics.scope_metrics:
                            receiver.metric_names |= {(service, m.name) for m in scope.metrics}
                return metrics_service_pb2.ExportMetricsServiceResponse()

        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        # The OTLP stubs are untyped.
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(Traces(), self._server)  # type: ignore[no-untyped-call]
        metrics_service_pb2_grpc.add_MetricsServiceServicer_to_server(Metrics(), self._server)  # type: ignore[no-untyped-call]
        port = self._server.add_insecure_port("127.0.0.1:0")
        self._server.start()
        return f"http://127.0.0.1:{port}"

    def snapshot(self) -> list[Any]:
        """The ResourceMetrics of every export so far, oldest first."""
        with self._lock:
            return list(self._resource_metrics)

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop(None)


def _service_name(resource: Any) -> str:
    for attribute in resource.attributes:
        if attribute.key == "service.name":
            return str(attribute.value.string_value)
    return ""
