"""The admin commands (migrate, split-states, purge) as an operator runs them (issue 27).

On the default embedded store they work against the running service's own PostgreSQL;
with no service running they start one of their own and stop it again. Either way they
leave nothing behind (the unix-socket directories go in TMPDIR, private to each test),
and what they print on stdout is their answer alone.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from agentstate.dev.processes import ServiceProcess
from agentstate.state.v1 import state_service_pb2 as pb
from agentstate.state.v1 import state_service_pb2_grpc as pb_grpc
from tests.support.state_process import StateServices, run_command


@pytest.fixture
def embedded_env(world_traversable_dir: Path) -> Iterator[dict[str, str]]:
    """The embedded store's settings in a private data directory, with a private TMPDIR
    (where the embedded server's socket directories are made) to see what is left."""
    tmp = world_traversable_dir / "tmp"
    tmp.mkdir()
    yield {
        "STATE_STORE": "embedded",
        "STATE_EMBEDDED_PG_DIR": str(world_traversable_dir / "pgdata"),
        "DATABASE_URL": "",
        "TMPDIR": str(tmp),
        "STATE_LISTEN_ADDRESS": "127.0.0.1:0",
    }


def admin(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return run_command(env, *args)


def leftovers(env: dict[str, str]) -> list[str]:
    return sorted(os.listdir(env["TMPDIR"]))


@pytest.fixture
def running_service(
    embedded_env: dict[str, str], state_services: StateServices
) -> tuple[ServiceProcess, str]:
    service = state_services.start(embedded_env, "serve")
    return service, service.wait_ready()


def test_admin_commands_work_against_the_running_services_embedded_database(
    embedded_env: dict[str, str], running_service: tuple[ServiceProcess, str]
) -> None:
    service, address = running_service
    with grpc.insecure_channel(address) as channel:
        stub = pb_grpc.StateServiceStub(channel)
        created = stub.CreateConversation(pb.CreateConversationRequest(user_id="ops"))
        conversation_id = created.conversation.conversation_id
        sockets = leftovers(embedded_env)  # the running server's own socket directory

        migrated = admin(embedded_env, "migrate")
        assert (migrated.returncode, migrated.stdout, migrated.stderr) == (
            0,
            "schema is up to date\n",
            "",
        )
        split = admin(embedded_env, "split-states", "--batch-size", "5")
        assert (split.returncode, split.stderr) == (0, ""), split.stderr
        assert split.stdout == "split 0 states stored whole into rows; none is left\n"

        time.sleep(1.5)  # the conversation is now older than the purge's cut-off
        purged = admin(embedded_env, "purge", "--older-than-days", "0.00001")
        assert purged.returncode == 0, purged.stderr
        # Quiet, but a purge always leaves its audit line (docs/security.md#audit).
        [audited] = [json.loads(line) for line in purged.stderr.splitlines()]
        assert audited["logger"] == "agentstate.audit", audited
        assert (audited["audit_rpc"], audited["audit_conversations_deleted"]) == (
            "PurgeInactive",
            1,
        )
        assert purged.stdout.startswith("deleted 1 conversations untouched since ")
        # The running service's data: the conversation is gone from it.
        with pytest.raises(grpc.RpcError) as gone:
            stub.GetConversation(
                pb.GetConversationRequest(user_id="ops", conversation_id=conversation_id)
            )
        assert gone.value.code() == grpc.StatusCode.NOT_FOUND
        assert leftovers(embedded_env) == sockets
    assert service.proc.poll() is None, service.output  # the service is still running


def test_a_second_service_on_the_same_embedded_directory_says_what_to_do(
    embedded_env: dict[str, str], running_service: tuple[ServiceProcess, str]
) -> None:
    sockets = leftovers(embedded_env)
    second = admin(embedded_env, "serve")
    data_dir = embedded_env["STATE_EMBEDDED_PG_DIR"]
    assert second.returncode == 2, second.stderr
    assert second.stdout == ""
    [line] = second.stderr.splitlines()
    assert line.startswith(f"agentstate-state: the embedded PostgreSQL in {data_dir} is ")
    for hint in ("stop that service", "STATE_EMBEDDED_PG_DIR", "STATE_STORE=postgres"):
        assert hint in line, line
    assert leftovers(embedded_env) == sockets


def test_admin_commands_without_a_running_service_start_and_stop_their_own(
    embedded_env: dict[str, str],
) -> None:
    for args in (["migrate"], ["split-states"], ["purge", "--older-than-days", "30"]):
        done = admin(embedded_env, *args)
        audit = [line for line in done.stderr.splitlines() if '"agentstate.audit"' in line]
        assert (done.returncode, len(audit)) == (0, 1 if args[0] == "purge" else 0), done.stderr
        assert done.stderr.splitlines() == audit, done.stderr
        assert len(done.stdout.splitlines()) == 1, done.stdout
        assert leftovers(embedded_env) == []
        assert not Path(embedded_env["STATE_EMBEDDED_PG_DIR"], "postmaster.pid").exists()


def test_an_admin_commands_diagnostics_are_logged_only_when_asked_for(database_url: str) -> None:
    env = {"STATE_STORE": "postgres", "DATABASE_URL": database_url}
    quiet = admin(env, "migrate")
    assert (quiet.returncode, quiet.stdout, quiet.stderr) == (0, "schema is up to date\n", "")

    asked = admin({**env, "AGENTSTATE_LOG_LEVEL": "INFO"}, "migrate")
    assert (asked.returncode, asked.stdout) == (0, "schema is up to date\n")
    assert '"message": "database route: direct' in asked.stderr, asked.stderr
