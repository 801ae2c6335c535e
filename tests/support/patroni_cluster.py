"""A real Patroni cluster on loopback: 1 etcd + 3 PostgreSQL 15 nodes, in a temp dir.

Used by tests/state_service/test_ha_patroni.py and bench/ha_failover.py. Needs Debian's
`patroni` and `etcd-server` packages (scripts/install_ha_deps.sh) and the PostgreSQL server
binaries. Run as root, Patroni (and so PostgreSQL, which refuses root) runs as the `postgres` user,
as agentstate/common/embedded_postgres.py does.

Settings chosen for a fast, lossless failover (see docs/ha.md):

- synchronous_mode + synchronous_mode_strict: a commit is acknowledged only once a
  synchronous standby has flushed it, and with no standby available the primary blocks
  rather than quietly going asynchronous; Patroni promotes only the synchronous standby.
  So an acknowledged write is always on two nodes and survives losing either.
- primary_start_timeout 0: a crashed primary is failed over at once instead of restarted
  in place (the default waits 300 s for it to come back).
- loop_wait 1 / retry_timeout 3 / ttl 8: Patroni's HA loop every second (ttl must cover
  loop_wait + 2 x retry_timeout).
- wal_retrieve_retry_interval 500ms: the other standby re-attaches to a new primary fast.
"""

from __future__ import annotations

import contextlib
import glob
import json
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
import yaml

SCOPE = "agentstate-ha"
SUPERUSER = "postgres"
SUPERUSER_PASSWORD = "ha-test-superuser"
REPLICATION_USER = "replicator"
REPLICATION_PASSWORD = "ha-test-replication"
RUN_AS = "postgres"


class ClusterError(RuntimeError):
    """The cluster could not be started or did not reach the expected state."""


def missing_tools() -> list[str]:
    """What this machine lacks to run the cluster (empty when it has everything)."""
    missing = [tool for tool in ("patroni", "etcd") if shutil.which(tool) is None]
    if pg_bin_dir() is None:
        missing.append("PostgreSQL server binaries")
    return missing


def pg_bin_dir() -> Path | None:
    for candidate in sorted(glob.glob("/usr/lib/postgresql/*/bin"), reverse=True):
        if Path(candidate, "postgres").exists() and Path(candidate, "initdb").exists():
            return Path(candidate)
    found = shutil.which("pg_ctl")
    return Path(found).resolve().parent if found else None


def free_ports(count: int) -> list[int]:
    sockets = [socket.socket() for _ in range(count)]
    try:
        for sock in sockets:
            sock.bind(("127.0.0.1", 0))
        return [int(sock.getsockname()[1]) for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


@dataclass
class Node:
    name: str
    pg_port: int
    api_port: int
    directory: Path
    process: subprocess.Popen[bytes] | None = None

    @property
    def data_dir(self) -> Path:
        return self.directory / "data"

    @property
    def log_path(self) -> Path:
        return self.directory / "patroni.log"

    def dsn(self, dbname: str = "postgres") -> str:
        return (
            f"host=127.0.0.1 port={self.pg_port} user={SUPERUSER} "
            f"password={SUPERUSER_PASSWORD} dbname={dbname} connect_timeout=2"
        )

    def api(self, path: str, timeout: float = 1.0) -> tuple[int, dict[str, Any]]:
        """Patroni's REST API: (HTTP status, JSON body); (0, {}) when it does not answer."""
        url = f"http://127.0.0.1:{self.api_port}{path}"
        try:
            with urllib.request.urlopen(url, timeout=timeout) as reply:
                return reply.status, json.loads(reply.read() or b"{}")
        except urllib.error.HTTPError as exc:
            with contextlib.suppress(ValueError):
                return exc.code, json.loads(exc.read() or b"{}")
            return exc.code, {}
        except (OSError, ValueError):
            return 0, {}

    def postmaster_pid(self) -> int | None:
        try:
            return int((self.data_dir / "postmaster.pid").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return None


@dataclass
class PatroniCluster:
    root: Path
    size: int = 3
    nodes: list[Node] = field(default_factory=list)
    etcd: subprocess.Popen[bytes] | None = None
    etcd_port: int = 0

    @classmethod
    def create(cls, size: int = 3) -> PatroniCluster:
        root = Path(tempfile.mkdtemp(prefix="agentstate-ha-"))
        root.chmod(0o755)  # the postgres user must reach its node directories
        return cls(root, size)

    # ------------------------------------------------------------- lifecycle

    def start(self, timeout: float = 90.0) -> None:
        """Start etcd and the nodes; return once there is a leader and every other node
        streams from it, one of them as the synchronous standby."""
        ports = free_ports(2 + 2 * self.size)
        self.etcd_port, peer_port = ports[0], ports[1]
        self._start_etcd(peer_port)
        bin_dir = pg_bin_dir()
        if bin_dir is None:
            raise ClusterError("no PostgreSQL server binaries")
        for i in range(self.size):
            name = f"node{i + 1}"
            directory = self.root / name
            directory.mkdir(mode=0o700)
            node = Node(name, ports[2 + 2 * i], ports[3 + 2 * i], directory)
            (directory / "patroni.yml").write_text(yaml.safe_dump(self._config(node, bin_dir)))
            self._chown(directory)
            self.nodes.append(node)
        # All at once: one wins the DCS's initialize key and runs initdb, the others wait
        # for it and clone it.
        for node in self.nodes:
            self._start_node(node)
        self.wait_for(self.healthy, timeout, "every replica streaming, one synchronous")

    def close(self) -> None:
        """Stop everything this cluster started and remove its directory, whatever state
        it is in. Only our own processes, by pid."""
        for node in self.nodes:
            if node.process is not None and node.process.poll() is None:
                node.process.send_signal(signal.SIGTERM)  # Patroni stops its PostgreSQL
        for node in self.nodes:
            if node.process is not None:
                try:
                    node.process.wait(20)
                except subprocess.TimeoutExpired:
                    node.process.kill()
                    node.process.wait(5)
            self._kill_postgres(node)
        if self.etcd is not None and self.etcd.poll() is None:
            self.etcd.terminate()
            try:
                self.etcd.wait(10)
            except subprocess.TimeoutExpired:
                self.etcd.kill()
                self.etcd.wait(5)
        shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> PatroniCluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ----------------------------------------------------------------- state

    def database_url(self, dbname: str = "postgres", *, password: bool = True) -> str:
        """A multi-host URL that only accepts the read-write node (the primary). Without
        the password, libpq takes it from PGPASSWORD (as k8s/overlays/ha does)."""
        hosts = ",".join(f"127.0.0.1:{n.pg_port}" for n in self.nodes)
        user = f"{SUPERUSER}:{SUPERUSER_PASSWORD}" if password else SUPERUSER
        return f"postgresql://{user}@{hosts}/{dbname}?target_session_attrs=read-write&connect_timeout=2"

    def cluster_state(self) -> dict[str, Any]:
        """GET /cluster from any node that answers."""
        for node in self.nodes:
            status, body = node.api("/cluster")
            if status == 200 and "members" in body:
                return body
        return {}

    def leader(self) -> Node | None:
        """The node Patroni reports as the running leader."""
        for member in self.cluster_state().get("members", []):
            if member.get("role") == "leader" and member.get("state") == "running":
                return self.node(member["name"])
        return None

    def node(self, name: str) -> Node:
        [found] = [n for n in self.nodes if n.name == name]
        return found

    def healthy(self) -> bool:
        """One leader, every other node streaming from it, one of them synchronously."""
        members = self.cluster_state().get("members", [])
        if len(members) != self.size or any(m.get("state") != "running" for m in members):
            return False  # e.g. "creating replica": a clone's pg_basebackup streams as well
        # Patroni's own choice of synchronous standby (its /sync key), the only node it
        # will promote; PostgreSQL alone may already say "sync" for synchronous_standby_names
        # '*' (strict mode) before Patroni has recorded it.
        if [m.get("role") for m in members].count("sync_standby") != 1:
            return False
        leader = self.leader()
        if leader is None:
            return False
        try:
            with psycopg.connect(leader.dsn(), autocommit=True) as conn:
                rows = conn.execute(
                    "SELECT application_name, sync_state FROM pg_stat_replication"
                    " WHERE state = 'streaming'"
                ).fetchall()
        except psycopg.Error:
            return False
        states = {name: state for name, state in rows if name != leader.name}
        others = {n.name for n in self.nodes} - {leader.name}
        return set(states) == others and list(states.values()).count("sync") == 1

    def kill_primary_postmaster(self) -> Node:
        """kill -9 the leader's postmaster (Patroni on that node stays up)."""
        leader = self.leader()
        if leader is None:
            raise ClusterError("no leader to kill")
        pid = leader.postmaster_pid()
        if pid is None:
            raise ClusterError(f"{leader.name} has no postmaster.pid")
        os.kill(pid, signal.SIGKILL)
        return leader

    def in_recovery(self, node: Node) -> bool | None:
        """pg_is_in_recovery() on the node; None when it does not answer."""
        try:
            with psycopg.connect(node.dsn(), autocommit=True) as conn:
                row = conn.execute("SELECT pg_is_in_recovery()").fetchone()
        except psycopg.Error:
            return None
        return None if row is None else bool(row[0])

    def logs(self) -> str:
        parts = []
        for path in [self.root / "etcd.log", *(n.log_path for n in self.nodes)]:
            with contextlib.suppress(OSError):
                parts.append(f"--- {path.name} ({path.parent.name})\n{path.read_text()[-60000:]}")
        return "\n".join(parts)

    @staticmethod
    def wait_for(condition: Any, timeout: float, what: str) -> float:
        started = time.monotonic()
        while time.monotonic() - started < timeout:
            if condition():
                return time.monotonic() - started
            time.sleep(0.1)
        raise ClusterError(f"no {what} within {timeout}s")

    # -------------------------------------------------------------- plumbing

    def _start_etcd(self, peer_port: int) -> None:
        client = f"http://127.0.0.1:{self.etcd_port}"
        peer = f"http://127.0.0.1:{peer_port}"
        log = (self.root / "etcd.log").open("wb")
        self.etcd = subprocess.Popen(
            [
                "etcd",
                "--name=etcd0",
                f"--data-dir={self.root / 'etcd'}",
                f"--listen-client-urls={client}",
                f"--advertise-client-urls={client}",
                f"--listen-peer-urls={peer}",
                f"--initial-advertise-peer-urls={peer}",
                f"--initial-cluster=etcd0={peer}",
                "--initial-cluster-state=new",
                # Faster leader election for the one-member etcd cluster at start.
                "--heartbeat-interval=50",
                "--election-timeout=500",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        log.close()

        def answers() -> bool:
            try:
                with urllib.request.urlopen(f"{client}/health", timeout=1) as reply:
                    return bool(json.loads(reply.read()).get("health") == "true")
            except (OSError, ValueError):
                return False

        self.wait_for(answers, 30, "etcd")

    def _config(self, node: Node, bin_dir: Path) -> dict[str, Any]:
        address = f"127.0.0.1:{node.pg_port}"
        return {
            "scope": SCOPE,
            "namespace": "/agentstate-test/",
            "name": node.name,
            "log": {"level": "INFO"},
            "restapi": {
                "listen": f"127.0.0.1:{node.api_port}",
                "connect_address": f"127.0.0.1:{node.api_port}",
            },
            "etcd3": {"hosts": [f"127.0.0.1:{self.etcd_port}"]},
            "bootstrap": {
                "dcs": {
                    "ttl": 8,
                    "loop_wait": 1,
                    "retry_timeout": 3,
                    "maximum_lag_on_failover": 1048576,
                    "primary_start_timeout": 0,
                    "synchronous_mode": True,
                    "synchronous_mode_strict": True,
                    "postgresql": {
                        "use_pg_rewind": True,
                        "use_slots": True,
                        "parameters": {
                            "wal_level": "replica",
                            "hot_standby": "on",
                            "wal_log_hints": "on",  # pg_rewind, for the old primary
                            "max_wal_senders": 10,
                            "max_replication_slots": 10,
                            "max_connections": 100,
                            "wal_keep_size": "64MB",
                            "fsync": "on",
                            "synchronous_commit": "on",
                            # A standby re-pointed at the new primary retries its WAL
                            # stream this often (default 5 s): with strict synchronous
                            # mode no commit returns until one is streaming again.
                            "wal_retrieve_retry_interval": "500ms",
                        },
                    },
                },
                "initdb": [{"encoding": "UTF8"}, {"locale": "C"}, "data-checksums"],
                "pg_hba": [
                    f"host replication {REPLICATION_USER} 127.0.0.1/32 scram-sha-256",
                    "host all all 127.0.0.1/32 scram-sha-256",
                    "local all all trust",
                ],
            },
            "postgresql": {
                "listen": address,
                "connect_address": address,
                "data_dir": str(node.data_dir),
                "bin_dir": str(bin_dir),
                "pgpass": str(node.directory / "pgpass"),
                "authentication": {
                    "superuser": {"username": SUPERUSER, "password": SUPERUSER_PASSWORD},
                    "replication": {
                        "username": REPLICATION_USER,
                        "password": REPLICATION_PASSWORD,
                    },
                    "rewind": {"username": SUPERUSER, "password": SUPERUSER_PASSWORD},
                },
                # Its own socket directory: never the system's /var/run/postgresql.
                "parameters": {"unix_socket_directories": str(node.directory)},
            },
            "tags": {"nofailover": False, "noloadbalance": False, "clonefrom": False},
        }

    def _start_node(self, node: Node) -> None:
        log = node.log_path.open("wb")
        user = _run_as()
        env = {
            "PATH": "/usr/bin:/bin",
            "LANG": "C.UTF-8",
            "HOME": str(node.directory),
        }
        node.process = subprocess.Popen(
            ["patroni", str(node.directory / "patroni.yml")],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=node.directory,
            start_new_session=True,
            user=user.pw_uid if user else None,
            group=user.pw_gid if user else None,
            extra_groups=[] if user else None,
        )
        log.close()

    def _chown(self, path: Path) -> None:
        user = _run_as()
        if user is None:
            return
        for root, dirs, files in os.walk(path):
            os.chown(root, user.pw_uid, user.pw_gid)
            for name in dirs + files:
                os.chown(os.path.join(root, name), user.pw_uid, user.pw_gid)

    @staticmethod
    def _kill_postgres(node: Node) -> None:
        """A postmaster left behind (Patroni killed, or it never got to stop it)."""
        pid = node.postmaster_pid()
        if pid is None:
            return
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            return
        if str(node.data_dir).encode() in cmdline:  # ours, not a recycled pid
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def _run_as() -> pwd.struct_passwd | None:
    """The postgres user when we are root (initdb and postgres refuse root)."""
    if os.geteuid() != 0:
        return None
    try:
        return pwd.getpwnam(RUN_AS)
    except KeyError as exc:
        raise ClusterError(f"running as root needs the system user {RUN_AS!r}") from exc
