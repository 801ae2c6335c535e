"""OpenTelemetry setup shared by both services: traces, metrics and JSON logs.

Configured only through the standard OTEL_* environment variables:

- OTEL_SERVICE_NAME, OTEL_RESOURCE_ATTRIBUTES: who is reporting.
- OTEL_TRACES_EXPORTER / OTEL_METRICS_EXPORTER: `none` (default: no SDK is installed,
  so tracing costs nothing), `console`, or `otlp` (OTLP/gRPC; OTEL_EXPORTER_OTLP_ENDPOINT,
  OTEL_EXPORTER_OTLP_INSECURE and the other OTEL_EXPORTER_OTLP_* variables apply).
- OTEL_TRACES_SAMPLER / OTEL_TRACES_SAMPLER_ARG: read by the SDK (default parentbased_always_on).
- OTEL_METRIC_EXPORT_INTERVAL: milliseconds between metric exports (SDK default 60000).
- OTEL_SDK_DISABLED=true turns everything off.

Instrumentation is the standard one: gRPC client and server interceptors (W3C trace
context crosses every hop) and psycopg for database spans; it is installed only
when a tracer provider is configured.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Annotated, Any, Literal

from opentelemetry import metrics, trace
from pydantic import BeforeValidator, Field
from pythonjsonlogger.json import JsonEncoder, JsonFormatter

from agentstate.common import workers
from agentstate.common.config import ConfigError, EnvSettings, casefold_choice

TRACER_NAME = "agentstate"


def _exporter_names(env: Mapping[str, str], name: str) -> set[str]:
    raw = env.get(name, "none").strip().lower() or "none"
    return {part.strip() for part in raw.split(",") if part.strip()} - {"none"}


def configure_from_env(service_name: str, env: Mapping[str, str] | None = None) -> None:
    """Install tracer and meter providers as the OTEL_* variables ask (idempotent per process)."""
    env = os.environ if env is None else env
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return
    from opentelemetry.sdk.resources import SERVICE_NAME, Resource

    attributes = {} if env.get("OTEL_SERVICE_NAME") else {SERVICE_NAME: service_name}
    resource = Resource.create(attributes)  # reads OTEL_SERVICE_NAME, OTEL_RESOURCE_ATTRIBUTES
    trace_exporters = _exporter_names(env, "OTEL_TRACES_EXPORTER")
    if trace_exporters and not tracing_enabled():
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter

        provider = TracerProvider(resource=resource)  # sampler from OTEL_TRACES_SAMPLER
        for name in sorted(trace_exporters):
            if name == "otlp":
                from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (
                    OTLPSpanExporter,
                )

                provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
            elif name == "console":
                provider.add_span_processor(BatchSpanProcessor(ConsoleSpanExporter()))
            else:
                raise ConfigError(f"OTEL_TRACES_EXPORTER={name!r}: use none, console or otlp")
        trace.set_tracer_provider(provider)
    metric_exporters = _exporter_names(env, "OTEL_METRICS_EXPORTER")
    if metric_exporters:
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.metrics.export import (
            ConsoleMetricExporter,
            MetricReader,
            PeriodicExportingMetricReader,
        )

        readers: list[MetricReader] = []
        for name in sorted(metric_exporters):
            if name == "otlp":
                from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import (
                    OTLPMetricExporter,
                )

                readers.append(PeriodicExportingMetricReader(OTLPMetricExporter()))
            elif name == "console":
                readers.append(PeriodicExportingMetricReader(ConsoleMetricExporter()))
            else:
                raise ConfigError(f"OTEL_METRICS_EXPORTER={name!r}: use none, console or otlp")
        metrics.set_meter_provider(MeterProvider(resource=resource, metric_readers=readers))


def tracing_enabled() -> bool:
    """True when an SDK tracer provider is installed (by us or by a test)."""
    from opentelemetry.sdk.trace import TracerProvider

    return isinstance(trace.get_tracer_provider(), TracerProvider)


def shutdown() -> None:
    """Flush what is buffered (spans, metrics) before the process exits."""
    for provider in (trace.get_tracer_provider(), metrics.get_meter_provider()):
        flush = getattr(provider, "shutdown", None)
        if callable(flush):
            flush()


def tracer() -> trace.Tracer:
    return trace.get_tracer(TRACER_NAME)


def meter(name: str) -> metrics.Meter:
    return metrics.get_meter(name)


def grpc_server_interceptors() -> list[Any]:
    if not tracing_enabled():
        return []
    from opentelemetry.instrumentation.grpc import aio_server_interceptor, filters

    # Not grpc.health: a probe every few seconds is no trace worth keeping, and the
    # interceptor cannot wrap Watch (a handler that streams by context.write()).
    return [aio_server_interceptor(filter_=filters.negate(filters.health_check()))]


def grpc_client_interceptors() -> list[Any]:
    if not tracing_enabled():
        return []
    from opentelemetry.instrumentation.grpc import aio_client_interceptors, filters

    # Not grpc.health (the agent's watch on its state service): no span per check.
    return list(aio_client_interceptors(filter_=filters.negate(filters.health_check())))


def instrument_psycopg_connection(connection: Any) -> None:
    if tracing_enabled():
        from opentelemetry.instrumentation.psycopg import PsycopgInstrumentor

        PsycopgInstrumentor.instrument_connection(connection)


LogFormat = Annotated[Literal["json", "text"], BeforeValidator(casefold_choice)]
LogLevel = Annotated[
    Literal["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"],
    BeforeValidator(lambda value: value.upper() if isinstance(value, str) else value),
]


class LoggingSettings(EnvSettings):
    """How both services log (docs/reference/settings.md)."""

    format: LogFormat = Field(
        default="json",
        validation_alias="AGENTSTATE_LOG_FORMAT",
        description="json (one object per line, with trace ids) or text (for humans)",
    )
    level: LogLevel = Field(
        default="INFO",
        validation_alias="AGENTSTATE_LOG_LEVEL",
        description=(
            "DEBUG, INFO, WARNING, ERROR or CRITICAL; unset, the admin commands log at WARNING"
        ),
    )


class JsonLogFormatter(JsonFormatter):
    """One JSON object per line: time, level, logger, message, service, `worker` (a
    supervised worker's index, agentstate.common.workers), the record's `extra=` fields,
    and the current trace and span ids when a span is active."""

    def __init__(self, service: str) -> None:
        worker = workers.worker_index()
        super().__init__(
            ["levelname", "name", "message"],
            rename_fields={"levelname": "level", "name": "logger", "exc_info": "exception"},
            static_fields={"service": service, **({} if worker is None else {"worker": worker})},
            json_ensure_ascii=False,  # the product speaks Chinese: keep it readable
        )

        # The fast path of format() below: what python-json-logger's add_fields does for
        # this configuration, without its per-field renames and lookups.
        self._fixed_fields = [(self._get_rename(f), f) for f in self._required_fields]
        self._static_fields = {self._get_rename(k): v for k, v in self.static_fields.items()}
        # One encoder for every line: json.dumps(cls=JsonEncoder, ensure_ascii=False), as
        # jsonify_log_record calls it, builds this same encoder for each line.
        self._encoder = JsonEncoder(ensure_ascii=False)
        # A subclass's own add_fields must run: it takes python-json-logger's path.
        self._fast = (
            not self.defaults
            and not self.timestamp
            and not self.prefix
            and type(self).add_fields is JsonLogFormatter.add_fields
        )

    def format(self, record: logging.LogRecord) -> str:
        """The line python-json-logger would write, built directly for the common record
        (a text message, no exception or stack): a server logs an audit line per write
        call. Anything else takes python-json-logger's own path."""
        if (
            not self._fast
            or record.exc_info
            or record.exc_text
            or record.stack_info
            or isinstance(record.msg, dict)
        ):
            return super().format(record)
        record.message = record.getMessage()
        attributes = record.__dict__
        log_data: dict[str, Any] = {"time": _log_time(record.created)}
        for name, field in self._fixed_fields:
            log_data[name] = attributes.get(field)
        log_data.update(self._static_fields)
        skip = self._skip_fields
        rename = self.rename_fields
        for key in [k for k in attributes if k not in skip]:  # the record's extra= fields
            if not (isinstance(key, str) and key.startswith("_")):
                log_data[rename.get(key, key)] = attributes[key]
        _add_trace_ids(log_data)
        return self._encoder.encode(self.process_log_record(log_data))

    def add_fields(
        self, log_data: dict[str, Any], record: logging.LogRecord, message_dict: dict[str, Any]
    ) -> None:
        # Milliseconds in UTC, as before: python-json-logger's own timestamp has microseconds.
        log_data["time"] = _log_time(record.created)
        super().add_fields(log_data, record, message_dict)
        _add_trace_ids(log_data)


def _log_time(created: float) -> str:
    return datetime.fromtimestamp(created, UTC).isoformat(timespec="milliseconds")


def _add_trace_ids(log_data: dict[str, Any]) -> None:
    context = trace.get_current_span().get_span_context()
    if context.is_valid:
        log_data["trace_id"] = format(context.trace_id, "032x")
        log_data["span_id"] = format(context.span_id, "016x")


# The level of a one-shot command (an admin command) when AGENTSTATE_LOG_LEVEL
# is not set: what it prints is its answer, and INFO diagnostics would bury it.
QUIET_LEVEL = "WARNING"


class CoalescingStreamHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """A stream handler that writes the lines logged during one pass of the running event
    loop in one write, at the end of that pass, instead of one write (a system call, and
    a wake-up of the log collector) per line: a server under load logs an audit line per
    write call. No line waits past the loop pass that logged it; a line logged outside
    the loop's thread is written at once (after the pending ones), and close() (logging's
    shutdown at exit) writes what is pending."""

    def __init__(self, stream: Any) -> None:
        super().__init__(stream)
        self._pending: list[str] = []
        self._loop: asyncio.AbstractEventLoop | None = None

    def emit(self, record: logging.LogRecord) -> None:
        try:
            line = self.format(record) + self.terminator
        except Exception:
            self.handleError(record)
            return
        try:
            loop: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            loop = None
        self._pending.append(line)
        if loop is None:
            self._write()
        elif self._loop is not loop:  # none scheduled on this loop yet
            self._loop = loop
            loop.call_soon(self._flush_pending)

    def _flush_pending(self) -> None:
        self.acquire()
        try:
            self._write()
        finally:
            self.release()

    def _write(self) -> None:
        lines, self._pending, self._loop = self._pending, [], None
        if lines:
            try:
                self.stream.write("".join(lines))
                self.flush()
            except Exception:
                self.handleError(logging.makeLogRecord({"msg": "log write failed"}))

    def close(self) -> None:
        self._flush_pending()
        super().close()


def configure_logging(
    service: str,
    env: Mapping[str, str] | None = None,
    *,
    quiet: bool = False,
    coalesce: bool = False,
) -> None:
    """Log to stderr as AGENTSTATE_LOG_FORMAT and AGENTSTATE_LOG_LEVEL say (ConfigError if bad).
    `quiet`: a one-shot command, which logs at QUIET_LEVEL unless the level is set.
    `coalesce`: the lines of one event-loop pass in one write (CoalescingStreamHandler)."""
    settings = LoggingSettings.from_env(env)
    if quiet and "level" not in settings.model_fields_set:
        settings = settings.model_copy(update={"level": QUIET_LEVEL})
    handler = CoalescingStreamHandler(sys.stderr) if coalesce else logging.StreamHandler(sys.stderr)
    if settings.format == "text":
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    else:
        handler.setFormatter(JsonLogFormatter(service))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(settings.level)
