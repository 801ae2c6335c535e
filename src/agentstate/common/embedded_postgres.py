"""A real PostgreSQL server owned by this process, for the embedded default and tests.

It uses the system's PostgreSQL server binaries when they are installed (running
them as the unprivileged `postgres` user when we are root, since initdb refuses
root), and otherwise the `pgserver` PyPI package, which bundles PostgreSQL.
The server listens only on a unix socket in a private directory, so two
instances never fight over a TCP port.
"""

from __future__ import annotations

import contextlib
import glob
import logging
import os
import pwd
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

ENGINES = ("auto", "system", "pgserver")
_SUPERUSER = "postgres"
_PORT = 5432


class EmbeddedPostgresError(RuntimeError):
    """The embedded server could not be prepared or started."""


@dataclass(frozen=True)
class RunningServer:
    """A server already running in a data directory, as its postmaster.pid describes it."""

    pid: int
    dsn: str


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # it exists, as another user (the `postgres` user when we are root)
    return True


@dataclass(frozen=True)
class _Binaries:
    bin_dir: Path
    run_as: str | None  # a system user to run the server as, or None for ourselves


def _find_system_binaries() -> Path | None:
    found = shutil.which("pg_ctl")
    if found and shutil.which("initdb"):
        return Path(found).resolve().parent
    # Debian keeps versioned binaries off PATH.
    for candidate in sorted(glob.glob("/usr/lib/postgresql/*/bin"), reverse=True):
        if Path(candidate, "pg_ctl").exists() and Path(candidate, "initdb").exists():
            return Path(candidate)
    return None


def _choose_binaries() -> _Binaries | None:
    bin_dir = _find_system_binaries()
    if bin_dir is None:
        return None
    if os.geteuid() != 0:
        return _Binaries(bin_dir, None)
    try:
        pwd.getpwnam(_SUPERUSER)
    except KeyError as exc:
        raise EmbeddedPostgresError(
            "running as root needs the system user 'postgres' to own the embedded "
            "database (initdb refuses root); create it or set DATABASE_URL"
        ) from exc
    return _Binaries(bin_dir, _SUPERUSER)


class EmbeddedPostgres:
    """Start (initialising on first use) and stop a PostgreSQL server in `data_dir`."""

    def __init__(self, data_dir: str | os.PathLike[str], engine: str = "auto") -> None:
        """engine: "auto" (system binaries if installed, else pgserver), "system" or "pgserver"."""
        if engine not in ENGINES:
            raise EmbeddedPostgresError(f"unknown engine {engine!r}: use one of {ENGINES}")
        self.engine = engine
        self.data_dir = Path(data_dir).resolve()
        self._socket_dir: Path | None = None
        self._binaries: _Binaries | None = None
        self._pgserver: object | None = None  # pgserver.PostgresServer when used
        self._dsn: str | None = None

    @property
    def dsn(self) -> str:
        if self._dsn is None:
            raise EmbeddedPostgresError("the embedded server is not running")
        return self._dsn

    def running(self) -> RunningServer | None:
        """The server another process started in this data directory and that still
        runs (a state service's), or None. Its postmaster.pid names its socket."""
        try:
            lines = (self.data_dir / "postmaster.pid").read_text().splitlines()
            pid, port, socket_dir = int(lines[0]), int(lines[3]), lines[4].strip()
        except (OSError, ValueError, IndexError):
            return None
        if not socket_dir or not _alive(pid):
            return None  # a stale file: the server is gone
        if not Path(socket_dir, f".s.PGSQL.{port}").exists():
            return None  # the pid was reused by another process
        return RunningServer(
            pid, f"host={socket_dir} port={port} user={_SUPERUSER} dbname=postgres"
        )

    def start(self) -> str:
        """Start the server and return a libpq connection string for it."""
        binaries = None if self.engine == "pgserver" else _choose_binaries()
        if binaries is None:
            if self.engine == "system":
                raise EmbeddedPostgresError("no PostgreSQL server binaries (pg_ctl, initdb) found")
            self._dsn = self._start_pgserver()
            return self._dsn
        other = self.running()
        if other is not None:
            # pg_ctl would refuse too, after a page of its log; say what to do instead.
            raise EmbeddedPostgresError(
                f"the embedded PostgreSQL in {self.data_dir} is already running (server pid "
                f"{other.pid}), started by another state service: stop that service, or give "
                "this one its own STATE_EMBEDDED_PG_DIR, or set STATE_STORE=postgres with "
                "DATABASE_URL"
            )
        self._binaries = binaries
        try:
            return self._start_system()
        except BaseException:
            self._remove_socket_dir()  # a failed start leaves nothing behind
            raise

    def _start_system(self) -> str:
        assert self._binaries is not None
        binaries = self._binaries
        self.data_dir.parent.mkdir(parents=True, exist_ok=True)
        self.data_dir.mkdir(mode=0o700, exist_ok=True)
        # A short path: unix socket paths are limited to about 107 bytes. A restart
        # keeps the same path, so connection strings handed out stay valid.
        if self._socket_dir is None:
            self._socket_dir = Path(tempfile.mkdtemp(prefix="agentstate-pg-"))
        else:
            self._socket_dir.mkdir(mode=0o700, exist_ok=True)
        if binaries.run_as is not None:
            self._check_reachable_by(binaries.run_as)
            self._chown_to(binaries.run_as, self.data_dir)
            self._chown_to(binaries.run_as, self._socket_dir)
        if not (self.data_dir / "PG_VERSION").exists():
            self._run(
                "initdb",
                "-D",
                str(self.data_dir),
                "-U",
                _SUPERUSER,
                "--auth=trust",
                "--encoding=UTF8",
                "--locale=C",
                "--no-sync",
            )
        options = (
            f"-c listen_addresses='' -c unix_socket_directories={self._socket_dir} "
            f"-p {_PORT} -c fsync=on -c max_connections=200"
        )
        self._run(
            "pg_ctl",
            "-D",
            str(self.data_dir),
            "-o",
            options,
            "-l",
            str(self.data_dir / "server.log"),
            "-w",
            "-t",
            "60",
            "start",
        )
        self._dsn = f"host={self._socket_dir} port={_PORT} user={_SUPERUSER} dbname=postgres"
        log.info("embedded PostgreSQL started in %s", self.data_dir)
        return self._dsn

    def stop(self) -> None:
        """Stop the server (fast shutdown: open sessions are rolled back)."""
        if self._pgserver is not None:
            cleanup = getattr(self._pgserver, "cleanup", None)
            if callable(cleanup):
                cleanup()
            self._pgserver = None
        elif self._binaries is not None and (self.data_dir / "postmaster.pid").exists():
            self._run("pg_ctl", "-D", str(self.data_dir), "-m", "fast", "-w", "stop")
        self._remove_socket_dir()
        self._dsn = None

    def _remove_socket_dir(self) -> None:
        if self._socket_dir is not None:
            shutil.rmtree(self._socket_dir, ignore_errors=True)

    def __enter__(self) -> EmbeddedPostgres:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _run(self, tool: str, *args: str) -> None:
        assert self._binaries is not None
        command = [str(self._binaries.bin_dir / tool), *args]
        if self._binaries.run_as is not None:
            command = ["runuser", "-u", self._binaries.run_as, "--", *command]
        result = subprocess.run(
            command,
            capture_output=True,
            text=True,
            check=False,
            cwd="/",
            timeout=120,
            # Own session: a Ctrl-C in the terminal must not reach the server;
            # we stop it ourselves, after the pool is closed.
            start_new_session=True,
        )
        if result.returncode != 0:
            log_tail = ""
            with contextlib.suppress(OSError):
                log_tail = (self.data_dir / "server.log").read_text()[-2000:]
            raise EmbeddedPostgresError(
                f"{tool} failed ({result.returncode}): {result.stderr.strip()}\n{log_tail}"
            )

    def _check_reachable_by(self, user: str) -> None:
        probe = subprocess.run(
            ["runuser", "-u", user, "--", "test", "-x", str(self.data_dir.parent)],
            check=False,
            capture_output=True,
        )
        if probe.returncode != 0:
            raise EmbeddedPostgresError(
                f"the embedded PostgreSQL runs as the user '{user}', which cannot reach "
                f"{self.data_dir}: put its data directory (STATE_EMBEDDED_PG_DIR) under "
                "directories that every user may traverse, such as /var/tmp"
            )

    @staticmethod
    def _chown_to(user: str, path: Path) -> None:
        entry = pwd.getpwnam(user)
        for root, dirs, files in os.walk(path):
            os.chown(root, entry.pw_uid, entry.pw_gid)
            for name in dirs + files:
                os.chown(os.path.join(root, name), entry.pw_uid, entry.pw_gid)

    def _start_pgserver(self) -> str:
        try:
            import pgserver  # bundles PostgreSQL binaries; optional dependency
        except ImportError as exc:
            raise EmbeddedPostgresError(
                "no PostgreSQL server binaries found (pg_ctl/initdb) and the 'pgserver' "
                "package is not installed: install PostgreSQL, `pip install agentstate[pgserver]`, "
                "or set DATABASE_URL"
            ) from exc
        self.data_dir.mkdir(parents=True, exist_ok=True)
        get_server = pgserver.get_server  # type: ignore[attr-defined]  # untyped re-export
        server = get_server(str(self.data_dir), cleanup_mode="stop")
        self._pgserver = server
        uri = server.get_uri()
        log.info("embedded PostgreSQL (pgserver) started in %s", self.data_dir)
        return str(uri)
