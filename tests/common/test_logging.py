"""Logs: JSON lines (python-json-logger) with extra= fields and trace ids, or plain text."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import subprocess
import sys
from datetime import UTC, datetime
from typing import Any

from opentelemetry import trace
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags
from pythonjsonlogger.json import JsonFormatter

from agentstate.common.telemetry import JsonLogFormatter
from tests.support.state_process import StateServices

# Logs in a fresh interpreter, as a service does: outside a span, inside one, an exception.
PROBE = """
import logging
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from agentstate.common import telemetry

telemetry.configure_logging("agentstate-probe")
trace.set_tracer_provider(TracerProvider())
log = logging.getLogger("agentstate.probe")
log.info("outside", extra={"conversation_id": "42"})
with trace.get_tracer("probe").start_as_current_span("turn") as span:
    context = span.get_span_context()
    print(format(context.trace_id, "032x"), format(context.span_id, "016x"))
    log.warning(
        "取消订单 %s", "88235", extra={"conversation_id": "42", "attempt": 2, "tags": ["a"]}
    )
    try:
        1 / 0
    except ZeroDivisionError:
        log.exception("failed", extra={"call_id": "c1"})
log.debug("hidden at INFO")
"""


def run_probe(**env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", PROBE],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )


def test_json_lines_carry_extra_fields_and_the_active_span() -> None:
    probe = run_probe(AGENTSTATE_LOG_FORMAT="json", AGENTSTATE_LOG_LEVEL="info")
    trace_id, span_id = probe.stdout.split()
    lines: list[dict[str, Any]] = [json.loads(line) for line in probe.stderr.splitlines()]
    assert [line["message"] for line in lines] == ["outside", "取消订单 88235", "failed"]
    outside, inside, failed = lines

    assert set(outside) == {"time", "level", "logger", "message", "service", "conversation_id"}
    assert outside["level"] == "INFO" and outside["logger"] == "agentstate.probe"
    assert outside["service"] == "agentstate-probe"
    assert outside["conversation_id"] == "42"
    assert outside["time"].endswith("+00:00") and len(outside["time"]) == 29  # ms, UTC

    assert inside["conversation_id"] == "42" and inside["attempt"] == 2
    assert inside["tags"] == ["a"]
    assert (inside["trace_id"], inside["span_id"]) == (trace_id, span_id)
    assert "取消订单" in probe.stderr.splitlines()[1]  # readable, not \\u escapes

    assert failed["call_id"] == "c1" and failed["level"] == "ERROR"
    assert (
        failed["exception"].startswith("Traceback") and "ZeroDivisionError" in failed["exception"]
    )
    assert failed["trace_id"] == trace_id


def test_text_format_for_humans() -> None:
    probe = run_probe(AGENTSTATE_LOG_FORMAT="text", AGENTSTATE_LOG_LEVEL="DEBUG")
    lines = probe.stderr.splitlines()
    assert " WARNING agentstate.probe: 取消订单 88235" in lines[1]
    assert lines[-1].endswith("DEBUG agentstate.probe: hidden at INFO")


def test_a_bad_log_setting_stops_the_service_with_a_clear_message(
    state_services: StateServices,
) -> None:
    service = state_services.start({"AGENTSTATE_LOG_FORMAT": "xml", "STATE_STORE": "memory"})
    assert service.wait(30) == 2
    assert "AGENTSTATE_LOG_FORMAT='xml' must be one of json, text" in service.output
    assert "Traceback" not in service.output


COALESCE_PROBE = """
import asyncio, logging, os, sys
from agentstate.common import telemetry

writes = []
class Counted:
    def write(self, text):
        writes.append(text)
    def flush(self):
        pass

sys.stderr = Counted()
telemetry.configure_logging("agentstate-probe", coalesce=True)
log = logging.getLogger("agentstate.audit")
log.info("before the loop")

async def main():
    for i in range(5):
        log.info("in the loop %d", i)
    await asyncio.sleep(0)  # the end of this pass: the five lines in one write
    log.info("next pass")
    await asyncio.sleep(0)
    log.info("left pending at the end")

asyncio.run(main())
logging.shutdown()
sys.__stdout__.write(repr([w.count(chr(10)) for w in writes]) + chr(10))
sys.__stdout__.write(chr(10).join(writes))
"""


def test_coalesced_lines_are_written_once_per_loop_pass_in_order() -> None:
    """The state service's handler: the lines of one event-loop pass in one write, in
    the order logged; none is lost at the end (logging's shutdown writes the rest)."""
    done = subprocess.run(
        [sys.executable, "-c", COALESCE_PROBE],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "AGENTSTATE_LOG_FORMAT": "json"},
        check=True,
    )
    counts, *lines = done.stdout.splitlines()
    assert counts == "[1, 5, 1, 1]"
    messages = [json.loads(line)["message"] for line in lines if line]
    assert messages == [
        "before the loop",
        *[f"in the loop {i}" for i in range(5)],
        "next pass",
        "left pending at the end",
    ]


def _records() -> list[logging.LogRecord]:
    log = logging.getLogger("agentstate.audit")
    made = [
        log.makeRecord(
            log.name, logging.INFO, __file__, 1, "audit: %s %s", ("anonymous", "EndTurn"), None,
            extra={
                "audit_caller": "anonymous", "audit_conversation_ids": ["1", "2"],
                "audit_messages_deleted": 3, "audit_user_id": "用户", "_hidden": 1,
            },
        ),
        log.makeRecord(
            log.name, logging.WARNING, __file__, 2, "取消订单 %d", (88235,), None,
            extra={"when": datetime(2026, 12, 7, 1, 2, 3, tzinfo=UTC), "ratio": 0.5},
        ),
        log.makeRecord("x", logging.ERROR, __file__, 3, "no extras %s%%", ("a",), None),
        log.makeRecord("x", logging.INFO, __file__, 4, {"a": "dict message"}, (), None),
    ]  # fmt: skip
    try:
        raise ZeroDivisionError("division by zero")
    except ZeroDivisionError:
        made.append(log.makeRecord("x", logging.ERROR, __file__, 5, "boom", (), sys.exc_info()))
    return made


def test_the_fast_json_line_is_the_line_python_json_logger_writes() -> None:
    """JsonLogFormatter builds the common line itself (an audit line per write call);
    it must be the very line the library's own path writes, outside a span and inside."""
    formatter = JsonLogFormatter("agentstate-state")
    library = JsonFormatter.format
    span = NonRecordingSpan(
        SpanContext(0x1234, 0x5678, is_remote=False, trace_flags=TraceFlags(TraceFlags.SAMPLED))
    )
    for inside in (False, True):
        with trace.use_span(span) if inside else contextlib.nullcontext():
            for fast, slow in zip(_records(), _records(), strict=True):
                slow.created = fast.created  # made a moment apart
                line = formatter.format(fast)
                assert line == library(formatter, slow)
                if inside:
                    assert json.loads(line)["trace_id"] == format(0x1234, "032x")
