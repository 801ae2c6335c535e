"""A PgBouncer of our own, in transaction mode, in front of a PostgreSQL (tests, benchmarks).

Debian's `pgbouncer` (scripts/install_pgbouncer.sh). It runs in the foreground as a
child process, so it can be stopped hard and started again on the same port; as root it
runs as the `postgres` user (PgBouncer refuses to run as root).
"""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import psycopg


def pgbouncer_binary() -> str | None:
    return shutil.which("pgbouncer") or (
        "/usr/sbin/pgbouncer" if Path("/usr/sbin/pgbouncer").exists() else None
    )


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _libpq_params(dsn: str) -> dict[str, str]:
    return dict(item.split("=", 1) for item in dsn.split())


class PgBouncer:
    """PgBouncer on 127.0.0.1:`port` serving database `dbname` of the server at `server_dsn`.

    Every server connection logs in as `server_user` (so they can be counted in
    pg_stat_activity); at most `pool_size` of them per database (`max_db_connections`).
    """

    def __init__(
        self,
        server_dsn: str,
        dbname: str,
        *,
        pool_size: int,
        server_user: str = "postgres",
        port: int = 0,
        max_client_conn: int = 2000,
        pool_mode: str = "transaction",
    ) -> None:
        binary = pgbouncer_binary()
        if binary is None:
            raise RuntimeError("pgbouncer is not installed (scripts/install_pgbouncer.sh)")
        self.binary = binary
        self.dbname = dbname
        self.pool_size = pool_size
        self.port = port or free_port()
        self.dir = Path(tempfile.mkdtemp(prefix="agentstate-pgbouncer-"))
        self.dir.chmod(0o755)
        server = _libpq_params(server_dsn)
        self._run_as = "postgres" if os.geteuid() == 0 else None
        (self.dir / "userlist.txt").write_text('"postgres" ""\n')
        self.config = self.dir / "pgbouncer.ini"
        self.config.write_text(
            f"""[databases]
{dbname} = host={server["host"]} port={server.get("port", "5432")} dbname={dbname} \
user={server_user} pool_size={pool_size} max_db_connections={pool_size}

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = {self.port}
unix_socket_dir =
auth_type = trust
auth_file = {self.dir}/userlist.txt
pool_mode = {pool_mode}
default_pool_size = {pool_size}
reserve_pool_size = 0
max_client_conn = {max_client_conn}
server_round_robin = 0
ignore_startup_parameters = extra_float_digits,options
logfile = {self.dir}/pgbouncer.log
server_login_retry = 1
query_wait_timeout = 30
"""
        )
        if self._run_as is not None:
            entry = pwd.getpwnam(self._run_as)
            for path in (self.dir, *self.dir.iterdir()):
                os.chown(path, entry.pw_uid, entry.pw_gid)
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        """What a client (the state service) connects to."""
        return f"postgresql://postgres@127.0.0.1:{self.port}/{self.dbname}"

    @property
    def log(self) -> str:
        path = self.dir / "pgbouncer.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def start(self, timeout: float = 15.0) -> None:
        command = [self.binary, str(self.config)]
        if self._run_as is not None:
            command = ["runuser", "-u", self._run_as, "--", *command]
        self.proc = subprocess.Popen(
            command,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            cwd=self.dir,
            start_new_session=True,
        )
        deadline = time.monotonic() + timeout
        while True:
            try:
                with psycopg.connect(self.url, connect_timeout=2, autocommit=True) as conn:
                    conn.execute("SELECT 1")
                return
            except psycopg.OperationalError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"pgbouncer did not start:\n{self.log[-3000:]}") from None
                time.sleep(0.1)

    def stop(self, sig: int = signal.SIGTERM) -> None:
        """SIGTERM: PgBouncer's immediate shutdown (clients and servers dropped)."""
        if self.proc is not None and self.proc.poll() is None:
            # runuser passes the signal on; the whole session is ours.
            os.killpg(self.proc.pid, sig)
            self.proc.wait(10)
        self.proc = None

    def restart(self, down_seconds: float = 0.0) -> None:
        self.stop()
        time.sleep(down_seconds)
        self.start()

    def close(self) -> None:
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> PgBouncer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
