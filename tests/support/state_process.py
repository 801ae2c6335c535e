"""The state service as its own process (`python -m agentstate.state_service`), for tests.

One way to start it and one way to stop it: `StateServices.start` / `serve`, and at the end
SIGTERM to every one still running, each of which must exit 0 (a clean shutdown). The
`state_services` fixture (tests/conftest.py) is one per test; a module-scoped fixture uses
`with StateServices() as services:`. `run_command` runs a one-off command to its end with
its stdout and stderr apart.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Mapping
from types import TracebackType

from agentstate.dev.processes import ServiceProcess

MODULE = "agentstate.state_service"
STOP_TIMEOUT_SECONDS = 30


def on_postgres(database_url: str, **settings: str) -> dict[str, str]:
    """The settings of a state service on `database_url`, on a free loopback port."""
    return {
        "STATE_LISTEN_ADDRESS": "127.0.0.1:0",
        "STATE_STORE": "postgres",
        "DATABASE_URL": database_url,
        **settings,
    }


def run_command(
    settings: Mapping[str, str], *command: str, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    """A one-off command (`migrate`, `split-states`, `purge`, or `serve` when it must
    refuse) run to its end, with stdout and stderr apart: what it answers, what it logs."""
    return subprocess.run(
        [sys.executable, "-m", MODULE, *command],
        env={**os.environ, **settings},
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def in_memory(**settings: str) -> dict[str, str]:
    """The settings of a state service on the memory store, on a free loopback port."""
    return {"STATE_LISTEN_ADDRESS": "127.0.0.1:0", "STATE_STORE": "memory", **settings}


class StateServices:
    """State-service processes started for a test, stopped together at its end."""

    def __init__(self) -> None:
        self.started: list[ServiceProcess] = []

    def start(self, settings: Mapping[str, str], *command: str) -> ServiceProcess:
        """`python -m agentstate.state_service [command]` with `settings` added to the
        environment, not waited for: a test of start-up or of a one-off command waits for
        its exit itself."""
        process = ServiceProcess(MODULE, settings, *command)
        self.started.append(process)
        return process

    def serve(self, settings: Mapping[str, str], timeout: float = 60) -> str:
        """A state service that listens: its address, once it logged it."""
        return self.start(settings).wait_ready(timeout)

    def close(self) -> None:
        """SIGTERM to each process still running (all at once, so their grace periods
        overlap); each must exit 0. Processes that exited already were the test's to check."""
        running = [p for p in self.started if p.proc.poll() is None]
        self.started.clear()
        for process in running:
            process.proc.send_signal(signal.SIGTERM)
        unclean: list[str] = []
        for process in running:
            try:
                code = process.wait(STOP_TIMEOUT_SECONDS)
            except subprocess.TimeoutExpired:
                process.kill()
                unclean.append(f"no exit {STOP_TIMEOUT_SECONDS}s after SIGTERM:\n{process.output}")
                continue
            if code != 0:
                unclean.append(f"exit status {code} after SIGTERM:\n{process.output}")
        assert not unclean, "a state service did not stop cleanly: " + "\n\n".join(unclean)

    def __enter__(self) -> StateServices:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        if exc is None:
            self.close()
            return
        # The body's failure is the one to report; the processes are stopped regardless.
        with contextlib.suppress(AssertionError):
            self.close()
