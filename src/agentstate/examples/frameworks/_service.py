"""The state service an example talks to: the address given, or one started for the run."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator

from agentstate.dev.processes import ServiceProcess


@contextlib.contextmanager
def state_service_address() -> Iterator[str]:
    """argv[1] when given (a running state service), else a state service process on an
    in-memory store for the length of the example."""
    if len(sys.argv) > 1:
        yield sys.argv[1]
        return
    service = ServiceProcess(
        "agentstate.state_service",
        {"STATE_LISTEN_ADDRESS": "127.0.0.1:0", "STATE_STORE": "memory"},
    )
    try:
        yield service.wait_ready()
    finally:
        service.terminate()
