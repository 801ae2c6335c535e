"""Running a service as a child process and learning its address from its log.

Used by the demo, the benchmarks and the tests, the way a pod runs its containers.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
from collections.abc import Mapping

_LISTENING = re.compile(r"listening on (\S+)")


class ServiceProcess:
    """A service started with `python -m <module>`; its log is collected in the background."""

    def __init__(
        self,
        module: str,
        env: Mapping[str, str],
        *args: str,
        inherit_env: bool = True,
        cwd: str | os.PathLike[str] | None = None,
    ) -> None:
        """`env` is added to this process's environment, or, with inherit_env=False, is
        the whole environment (as a container gets exactly what its manifest says)."""
        full_env = {**os.environ, "PYTHONUNBUFFERED": "1", **env} if inherit_env else dict(env)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", module, *args],
            env=full_env,
            cwd=cwd,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        self.lines: list[str] = []
        self._address: str | None = None
        self._ready = threading.Event()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))
            match = _LISTENING.search(line)
            if match and self._address is None:
                self._address = match.group(1)
                self._ready.set()
        self._ready.set()

    @property
    def output(self) -> str:
        return "\n".join(self.lines)

    def wait_ready(self, timeout: float = 60) -> str:
        """Block until the service logs its address; return it."""
        self._ready.wait(timeout)
        if self._address is None:
            self.kill()
            raise AssertionError(f"service did not start:\n{self.output}")
        return self._address

    def terminate(self, timeout: float = 30) -> int:
        """SIGTERM and wait; return the exit code."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        finally:
            self._reader.join(5)

    def wait(self, timeout: float = 30) -> int:
        code = self.proc.wait(timeout)
        self._reader.join(5)
        return code

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
