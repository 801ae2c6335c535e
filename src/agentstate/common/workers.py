"""Worker processes on one port: a server uses every core of its machine.

One Python process serves on one core at most (the GIL). With N workers, a supervisor
starts N copies of the server, each a process with its own event loop and database
pool, all listening on the same host:port with SO_REUSEPORT: the kernel spreads new
connections over the workers (a connection, and every call on it, stays with one
worker). The supervisor serves nothing itself:

- start: it reserves the port (port 0 becomes a free port, the same for every worker),
  starts the workers and waits until each says it serves (a line on a pipe the worker
  inherits, AGENTSTATE_WORKER_READY_FD), then logs `listening on ADDRESS (N workers)`.
  A worker that exits before it is ready fails the start: the supervisor stops the
  others and exits with that worker's status (2 for a configuration error).
- a worker dies later (a crash, kill -9, the OOM killer): the supervisor starts a new
  one in its place at once; the other workers go on serving. A worker that dies
  `CRASH_LOOP_DEATHS` times within `CRASH_LOOP_SECONDS` is not restarted again: the
  supervisor stops the rest and exits 1, so the container restarts and the fault shows.
- SIGTERM or SIGINT: passed on to every worker, each of which drains its calls (its own
  graceful shutdown); the supervisor exits 0 once all have exited 0, else 1.

Each worker sees AGENTSTATE_WORKER_INDEX (0..N-1); OTEL_RESOURCE_ATTRIBUTES gets
`agentstate.worker.index=<i>` added, so every worker's metrics are a series of their own
(sum over the attribute for the replica; docs/scaling.md).
"""

from __future__ import annotations

import logging
import os
import select
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from agentstate.common.listen import cannot_listen, reason_of

log = logging.getLogger(__name__)

INDEX_ENV = "AGENTSTATE_WORKER_INDEX"
READY_FD_ENV = "AGENTSTATE_WORKER_READY_FD"
RESOURCE_ENV = "OTEL_RESOURCE_ATTRIBUTES"
WORKER_ATTRIBUTE = "agentstate.worker.index"
CRASH_LOOP_DEATHS = 5
CRASH_LOOP_SECONDS = 60.0
READY_TIMEOUT_SECONDS = 120.0


def worker_index() -> int | None:
    """This process's worker number, or None when it is not a supervised worker."""
    value = os.environ.get(INDEX_ENV, "")
    return int(value) if value.isdigit() else None


def announce_ready() -> None:
    """Tell the supervisor (if any) that this worker serves."""
    fd = os.environ.get(READY_FD_ENV, "")
    if fd.isdigit():
        try:
            os.write(int(fd), b"ready\n")
            os.close(int(fd))
        except OSError:  # the supervisor is gone: nothing to tell
            pass


def reserve_port(address: str, setting: str) -> tuple[str, socket.socket]:
    """Bind host:port with SO_REUSEPORT (not listening: it takes no connections) so the
    workers can bind it too; port 0 becomes a free port. ConfigError naming `setting`
    when the address cannot be used."""
    host, sep, port_text = address.rpartition(":")
    if not sep or not port_text.isdigit():
        raise cannot_listen(address, setting, "worker processes need a host:port address")
    bare = host.strip("[]")
    family = socket.AF_INET6 if ":" in bare else socket.AF_INET
    reserved = socket.socket(family, socket.SOCK_STREAM)
    reserved.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    reserved.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    try:
        reserved.bind((bare, int(port_text)))
    except OSError as exc:
        reserved.close()
        raise cannot_listen(address, setting, reason_of(exc)) from None
    port = reserved.getsockname()[1]
    return f"{host}:{port}", reserved


@dataclass
class _Worker:
    index: int
    proc: subprocess.Popen[bytes]
    started: float
    ready_fd: int | None  # the read end while it is starting
    served: bool = False  # it said it serves

    def stopped_cleanly(self) -> bool:
        """Exit 0, or killed by the stop signal before it served (nothing to drain: a
        worker that is still importing has no handler for it yet)."""
        code = self.proc.returncode
        stop_signals = (-signal.SIGTERM, -signal.SIGINT)
        return code == 0 or (not self.served and code in stop_signals)


@dataclass
class Supervisor:
    """`command` started `count` times with `env` (the address already in it)."""

    command: Sequence[str]
    env: Mapping[str, str]
    count: int
    label: str = "worker"
    deaths: list[float] = field(default_factory=list)
    _workers: dict[int, _Worker] = field(default_factory=dict)
    _stopping: bool = False

    def _spawn(self, index: int) -> _Worker:
        read_fd, write_fd = os.pipe()
        env = dict(self.env)
        env[INDEX_ENV] = str(index)
        env[READY_FD_ENV] = str(write_fd)
        resource = env.get(RESOURCE_ENV, "")
        env[RESOURCE_ENV] = ",".join(
            part for part in (resource, f"{WORKER_ATTRIBUTE}={index}") if part
        )
        proc = subprocess.Popen(list(self.command), env=env, pass_fds=(write_fd,))
        os.close(write_fd)
        return _Worker(index, proc, time.monotonic(), read_fd)

    def _wait_ready(self, workers: list[_Worker]) -> int | None:
        """None once every worker said it serves, else the exit status to end with."""
        deadline = time.monotonic() + READY_TIMEOUT_SECONDS
        pending = {w.ready_fd: w for w in workers if w.ready_fd is not None}
        while pending:
            if self._stopping:
                return 0
            left = deadline - time.monotonic()
            if left <= 0:
                log.error("%ss not ready after %.0f s", self.label, READY_TIMEOUT_SECONDS)
                return 1
            readable, _, _ = select.select(list(pending), [], [], min(left, 0.5))
            for fd in readable:
                worker = pending.pop(fd)
                said = os.read(fd, 64)
                os.close(fd)
                worker.ready_fd = None
                worker.served = bool(said)
                if not said and self._stopping:
                    return 0
                if not said:  # the pipe closed unread: it exited before serving
                    code = worker.proc.wait()
                    log.error("%s %d exited with %d while starting", self.label, worker.index, code)
                    return code or 1
        return None

    def _on_signal(self, signum: int, frame: object) -> None:
        self._stopping = True
        for worker in self._workers.values():
            if worker.proc.poll() is None:
                worker.proc.send_signal(signum)

    def _stop_all(self) -> None:
        for worker in self._workers.values():
            if worker.proc.poll() is None:
                worker.proc.terminate()
        for worker in self._workers.values():
            worker.proc.wait()

    def run(self, address: str) -> int:
        """Start the workers, keep them running until SIGTERM/SIGINT; the exit status."""
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, self._on_signal)
        started = [self._spawn(i) for i in range(self.count)]
        self._workers = {w.index: w for w in started}
        failed = self._wait_ready(started)
        if failed is not None:
            self._stop_all()
            return failed
        if not self._stopping:
            log.info("listening on %s (%d %ss)", address, self.count, self.label)
        return self._supervise()

    def _supervise(self) -> int:
        while True:
            if self._stopping:
                codes = [w.proc.wait() for w in self._workers.values()]
                log.info("%ss stopped (exit statuses %s)", self.label, codes)
                clean = all(w.stopped_cleanly() for w in self._workers.values())
                return 0 if clean else 1
            try:
                pid, status = os.waitpid(-1, 0)
            except ChildProcessError:
                return 1
            except InterruptedError:  # pragma: no cover - PEP 475 retries waitpid
                continue
            dead = next((w for w in self._workers.values() if w.proc.pid == pid), None)
            if dead is None or self._stopping:
                if dead is not None:
                    dead.proc.returncode = os.waitstatus_to_exitcode(status)
                continue
            dead.proc.returncode = code = os.waitstatus_to_exitcode(status)
            now = time.monotonic()
            self.deaths = [t for t in self.deaths if now - t < CRASH_LOOP_SECONDS] + [now]
            if len(self.deaths) >= CRASH_LOOP_DEATHS:
                log.error(
                    "%s %d exited with %d, the %d. death within %.0f s: stopping",
                    self.label, dead.index, code, len(self.deaths), CRASH_LOOP_SECONDS,
                )  # fmt: skip
                self._stop_all()
                return 1
            log.warning("%s %d exited with %d: starting a new one", self.label, dead.index, code)
            replacement = self._spawn(dead.index)
            self._workers[dead.index] = replacement
            failed = self._wait_ready([replacement])
            if failed is not None and not self._stopping:
                log.error("the new %s %d did not start: stopping", self.label, dead.index)
                self._stop_all()
                return failed


def supervise(
    count: int, address: str, setting: str, env: Mapping[str, str], command: Sequence[str]
) -> int:
    """Run `command` as `count` workers on `address` (the variable `setting` holds it);
    their environment is `env` with the address made concrete. The exit status."""
    concrete, reserved = reserve_port(address, setting)
    try:
        child_env = {**env, setting: concrete}
        return Supervisor(command, child_env, count).run(concrete)
    finally:
        reserved.close()


def python_module(module: str, *args: str) -> list[str]:
    return [sys.executable, "-m", module, *args]
