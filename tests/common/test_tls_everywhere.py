"""Every hop over TLS, as real processes configured by their environment variables: the
state service (mTLS and a policy), the agent service (TLS, and mTLS to the state service
with its SPIFFE certificate), the CLI (TLS to the agent), the web console (HTTPS, and
mTLS to both services). Then the refusals: a caller without a certificate, and one whose
certificate the policy gives no rule for the call."""

from __future__ import annotations

import json
import os
import socket
import ssl
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from agentstate.dev.processes import ServiceProcess
from agentstate.state.v1 import state_service_pb2 as pb
from agentstate.state.v1 import state_service_pb2_grpc as pb_grpc
from tests.support.certs import CertificateAuthority

AGENT_ID = "spiffe://cluster.local/ns/agentstate/sa/agentstate-agent"
CONSOLE_ID = "spiffe://cluster.local/ns/agentstate/sa/agentstate-console"


class Services:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.ca = CertificateAuthority(root / "ca")
        self.state_cert = self.ca.issue("state", "state", server=True)
        self.agent_server = self.ca.issue("agent-server", "agent", server=True)
        self.console_server = self.ca.issue("console-server", "console", server=True)
        self.agent_client = self.ca.issue("agent-client", "agentstate-agent", spiffe=AGENT_ID)
        self.console_client = self.ca.issue("console-client", "console", spiffe=CONSOLE_ID)
        self.reporting = self.ca.issue("reporting", "reporting")
        policy = {
            "rules": [
                {"caller": AGENT_ID, "rpcs": ["read", "write"]},
                {"caller": CONSOLE_ID, "rpcs": ["read"]},
                {"caller": "reporting", "rpcs": ["ListConversations"]},
            ]
        }
        self.policy = root / "policy.json"
        self.policy.write_text(json.dumps(policy))
        self.processes: list[ServiceProcess] = []

    def start(self, module: str, env: dict[str, str]) -> str:
        process = ServiceProcess(module, env)
        self.processes.append(process)
        return process.wait_ready()

    def stop(self) -> list[int]:
        return [p.terminate() for p in reversed(self.processes)]


@pytest.fixture
def services(tmp_path: Path) -> Iterator[Services]:
    running = Services(tmp_path)
    try:
        yield running
    finally:
        codes = running.stop()
        assert codes == [0] * len(codes), "\n".join(p.output for p in running.processes)


def _https_get(url: str, ca: Path, headers: dict[str, str]) -> tuple[int, Any]:
    context = ssl.create_default_context(cafile=str(ca))
    request = urllib.request.Request(url, headers=headers)
    with urllib.request.urlopen(request, context=context, timeout=30) as answer:
        return answer.status, json.loads(answer.read())


def test_every_hop_over_tls(services: Services) -> None:
    s = services
    state = s.start(
        "agentstate.state_service",
        {
            "STATE_LISTEN_ADDRESS": "127.0.0.1:0",
            "STATE_STORE": "memory",
            "STATE_TLS_CERT_FILE": str(s.state_cert.cert),
            "STATE_TLS_KEY_FILE": str(s.state_cert.key),
            "STATE_TLS_CLIENT_CA_FILE": str(s.ca.file),
            "STATE_POLICY_FILE": str(s.policy),
        },
    )
    agent = s.start(
        "agentstate.agent_service",
        {
            "AGENT_LISTEN_ADDRESS": "127.0.0.1:0",
            "AGENT_STATE_ADDRESS": state,
            "AGENT_AUTH_MODE": "dev-header",
            "AGENT_PROFILE": "",
            "AGENT_TLS_CERT_FILE": str(s.agent_server.cert),
            "AGENT_TLS_KEY_FILE": str(s.agent_server.key),
            "AGENT_STATE_TLS_CA_FILE": str(s.ca.file),
            "AGENT_STATE_TLS_CERT_FILE": str(s.agent_client.cert),
            "AGENT_STATE_TLS_KEY_FILE": str(s.agent_client.key),
        },
    )
    # The CLI, over TLS to the agent, which calls the state service over mTLS.
    cli_env = {
        **os.environ,
        "AGENTSTATE_ADDRESS": agent,
        "AGENTSTATE_USER": "erin",
        "AGENTSTATE_TLS_CA_FILE": str(s.ca.file),
    }
    chat = subprocess.run(
        [sys.executable, "-m", "agentstate.agent_service.cli", "chat", "hello"],
        env=cli_env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert chat.returncode == 0, chat.stdout + chat.stderr
    listed = subprocess.run(
        [sys.executable, "-m", "agentstate.agent_service.cli", "conversations"],
        env=cli_env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert listed.returncode == 0, listed.stdout + listed.stderr
    # A CLI that does not trust the agent's CA gets nowhere.
    plain = subprocess.run(
        [sys.executable, "-m", "agentstate.agent_service.cli", "conversations"],
        env={**cli_env, "AGENTSTATE_TLS_CA_FILE": ""},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert plain.returncode != 0
    # The console: HTTPS for the browser, mTLS to both services.
    console = s.start(
        "agentstate.console",
        {
            "CONSOLE_LISTEN_ADDRESS": "127.0.0.1:0",
            "CONSOLE_AGENT_ADDRESS": agent,
            "CONSOLE_STATE_ADDRESS": state,
            "CONSOLE_DEV_USER": "erin",
            "CONSOLE_TLS_CERT_FILE": str(s.console_server.cert),
            "CONSOLE_TLS_KEY_FILE": str(s.console_server.key),
            "CONSOLE_GRPC_TLS_CA_FILE": str(s.ca.file),
            "CONSOLE_GRPC_TLS_CERT_FILE": str(s.console_client.cert),
            "CONSOLE_GRPC_TLS_KEY_FILE": str(s.console_client.key),
        },
    )
    assert console.startswith("https://")
    status, body = _https_get(console + "/api/conversations", s.ca.file, {})
    assert status == 200 and len(body["conversations"]) == 1, body
    cid = body["conversations"][0]["conversation_id"]
    status, inspected = _https_get(f"{console}/api/conversations/{cid}/inspector", s.ca.file, {})
    assert status == 200 and inspected["state"] is not None, inspected

    # The state service itself: a caller without a certificate cannot even connect; the
    # reporting service may list but not read a state, PERMISSION_DENIED with ErrorInfo.
    ca = s.ca.file.read_bytes()
    bare = grpc.ssl_channel_credentials(root_certificates=ca)
    with grpc.secure_channel(state, bare) as channel:
        with pytest.raises(grpc.RpcError) as refused:
            pb_grpc.StateServiceStub(channel).ListConversations(
                pb.ListConversationsRequest(user_id="erin"), timeout=5
            )
        assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
    reporting = grpc.ssl_channel_credentials(
        root_certificates=ca,
        private_key=s.reporting.key.read_bytes(),
        certificate_chain=s.reporting.cert.read_bytes(),
    )
    with grpc.secure_channel(state, reporting) as channel:
        stub = pb_grpc.StateServiceStub(channel)
        got = stub.ListConversations(pb.ListConversationsRequest(user_id="erin"), timeout=5)
        assert [c.conversation_id for c in got.conversations] == [cid]
        with pytest.raises(grpc.RpcError) as refused:
            stub.GetState(pb.GetStateRequest(user_id="erin", conversation_id=cid), timeout=5)
        assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED
        assert "reporting (mtls) may not call GetState" in (refused.value.details() or "")


def test_a_node_caller_over_mtls_is_held_to_its_rule(services: Services) -> None:
    """grpc-js with the CA and a client certificate: the reporting rule lets it list the
    user's conversations and refuses it the state, PERMISSION_DENIED with ErrorInfo."""
    from tests.contract.test_cross_language import run_node

    s = services
    state = s.start(
        "agentstate.state_service",
        {
            "STATE_LISTEN_ADDRESS": "127.0.0.1:0",
            "STATE_STORE": "memory",
            "STATE_TLS_CERT_FILE": str(s.state_cert.cert),
            "STATE_TLS_KEY_FILE": str(s.state_cert.key),
            "STATE_TLS_CLIENT_CA_FILE": str(s.ca.file),
            "STATE_POLICY_FILE": str(s.policy),
        },
    )
    agent_credentials = grpc.ssl_channel_credentials(
        root_certificates=s.ca.file.read_bytes(),
        private_key=s.agent_client.key.read_bytes(),
        certificate_chain=s.agent_client.cert.read_bytes(),
    )
    with grpc.secure_channel(state, agent_credentials) as channel:
        made = pb_grpc.StateServiceStub(channel).CreateConversation(
            pb.CreateConversationRequest(user_id="frank", title="t"), timeout=5
        )
    cid = made.conversation.conversation_id
    seen = run_node(
        "tls_client.mjs",
        state,
        str(s.ca.file),
        str(s.reporting.cert),
        str(s.reporting.key),
        "frank",
        cid,
    )
    assert seen["listed"] == [cid]
    assert seen["get_state"]["code"] == "PERMISSION_DENIED"
    reason = seen["get_state"]["reason"]
    assert reason == "PERMISSION_DENIED"
    assert "reporting (mtls) may not call GetState" in seen["get_state"]["details"]


def test_the_health_command_probes_a_tls_port(services: Services) -> None:
    """Kubernetes' gRPC probe speaks plaintext only: `agentstate-state health` is the exec
    probe of a TLS state service (k8s/overlays/central-tls), presenting the service's own
    certificate where mTLS is required."""
    s = services
    both = s.ca.issue("state-both", "state", server=True, client=True)
    env = {
        "STATE_LISTEN_ADDRESS": "127.0.0.1:0",
        "STATE_STORE": "memory",
        "STATE_TLS_CERT_FILE": str(both.cert),
        "STATE_TLS_KEY_FILE": str(both.key),
        "STATE_TLS_CLIENT_CA_FILE": str(s.ca.file),
        "STATE_POLICY_FILE": str(s.policy),
    }
    address = s.start("agentstate.state_service", env)

    def probe(ca: Path, name: str = "localhost") -> subprocess.CompletedProcess[str]:
        command = [sys.executable, "-m", "agentstate.state_service", "health"]
        return subprocess.run(
            [*command, "--ca-file", str(ca), "--server-name", name],
            env={**os.environ, **env, "STATE_LISTEN_ADDRESS": address},
            capture_output=True,
            text=True,
            timeout=60,
        )

    ok = probe(s.ca.file)
    assert (ok.returncode, ok.stdout.strip()) == (0, "SERVING"), ok.stdout + ok.stderr
    other = CertificateAuthority(s.root / "other", "other CA")
    refused = probe(other.file)
    assert refused.returncode == 1 and "UNAVAILABLE" in refused.stdout, refused.stdout
    wrong_name = probe(s.ca.file, "elsewhere.example")
    assert wrong_name.returncode == 1


def _served_issuer(url: str) -> str:
    from cryptography import x509

    host, port = url.removeprefix("https://").rsplit(":", 1)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    with (
        socket.create_connection((host, int(port)), timeout=5) as raw,
        context.wrap_socket(raw) as tls,
    ):
        der = tls.getpeercert(binary_form=True)
    assert der is not None
    return x509.load_der_x509_certificate(der).issuer.rfc4514_string()


def test_service_tokens_agent_mtls_and_a_renewed_console_certificate(services: Services) -> None:
    """The agent identifies to the state service with a service token (no client
    certificate), its own port requires client certificates (the CLI presents one), and
    the console serves a renewed certificate to new connections without a restart."""
    import time

    import jwt
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    s = services
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    public = s.root / "token-key.pem"
    public.write_bytes(
        key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )
    issuer, audience = "https://tokens.example.test", "agentstate-state"
    token_file = s.root / "agent.token"
    claims = {"iss": issuer, "aud": audience, "sub": AGENT_ID, "exp": int(time.time()) + 600}
    token_file.write_text(jwt.encode(claims, key, algorithm="RS256"))
    state = s.start(
        "agentstate.state_service",
        {
            "STATE_LISTEN_ADDRESS": "127.0.0.1:0",
            "STATE_STORE": "memory",
            "STATE_TLS_CERT_FILE": str(s.state_cert.cert),
            "STATE_TLS_KEY_FILE": str(s.state_cert.key),
            "STATE_POLICY_FILE": str(s.policy),
            "STATE_TOKEN_ISSUER": issuer,
            "STATE_TOKEN_AUDIENCE": audience,
            "STATE_TOKEN_KEY_FILE": str(public),
        },
    )
    cli_client = s.ca.issue("cli", "cli-user")
    agent = s.start(
        "agentstate.agent_service",
        {
            "AGENT_LISTEN_ADDRESS": "127.0.0.1:0",
            "AGENT_STATE_ADDRESS": state,
            "AGENT_AUTH_MODE": "dev-header",
            "AGENT_PROFILE": "",
            "AGENT_TLS_CERT_FILE": str(s.agent_server.cert),
            "AGENT_TLS_KEY_FILE": str(s.agent_server.key),
            "AGENT_TLS_CLIENT_CA_FILE": str(s.ca.file),
            "AGENT_STATE_TLS_CA_FILE": str(s.ca.file),
            "AGENT_STATE_TOKEN_FILE": str(token_file),
        },
    )

    def cli(*extra: str, **env: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "agentstate.agent_service.cli", *extra],
            env={
                **os.environ,
                "AGENTSTATE_ADDRESS": agent,
                "AGENTSTATE_USER": "hana",
                "AGENTSTATE_TLS_CA_FILE": str(s.ca.file),
                **env,
            },
            capture_output=True,
            text=True,
            timeout=60,
        )

    with_cert = {
        "AGENTSTATE_TLS_CERT_FILE": str(cli_client.cert),
        "AGENTSTATE_TLS_KEY_FILE": str(cli_client.key),
    }
    chat = cli("chat", "hello", **with_cert)
    assert chat.returncode == 0, chat.stdout + chat.stderr
    assert cli("conversations", **with_cert).returncode == 0
    without = cli("conversations")  # the agent's port requires a client certificate now
    assert without.returncode != 0 and "UNAVAILABLE" in without.stderr, without.stderr

    console_pair = s.ca.issue("console-live", "console", server=True, into=s.root / "console")
    console = s.start(
        "agentstate.console",
        {
            "CONSOLE_LISTEN_ADDRESS": "127.0.0.1:0",
            "CONSOLE_AGENT_ADDRESS": agent,
            "CONSOLE_STATE_ADDRESS": state,
            "CONSOLE_DEV_USER": "hana",
            "CONSOLE_TLS_CERT_FILE": str(console_pair.cert),
            "CONSOLE_TLS_KEY_FILE": str(console_pair.key),
            "CONSOLE_GRPC_TLS_CA_FILE": str(s.ca.file),
            "CONSOLE_GRPC_TLS_CERT_FILE": str(s.console_client.cert),
            "CONSOLE_GRPC_TLS_KEY_FILE": str(s.console_client.key),
        },
    )
    status, body = _https_get(console + "/api/conversations", s.ca.file, {})
    assert status == 200 and len(body["conversations"]) == 1
    assert _served_issuer(console) == "CN=agentstate test CA"
    renewed = CertificateAuthority(s.root / "renewed", "renewed CA")
    fresh = renewed.issue("console-live", "console", server=True, into=s.root / "staged")
    console_pair.key.write_bytes(fresh.key.read_bytes())  # half-way: the old pair stays
    assert _served_issuer(console) == "CN=agentstate test CA"
    console_pair.cert.write_bytes(fresh.cert.read_bytes())
    assert _served_issuer(console) == "CN=renewed CA"
    status, _ = _https_get(console + "/api/me", renewed.file, {})
    assert status == 200


@pytest.mark.parametrize(
    ("env", "words"),
    [
        ({"CONSOLE_TLS_CERT_FILE": "/c.pem"}, "CONSOLE_TLS_CERT_FILE and CONSOLE_TLS_KEY_FILE"),
        ({"CONSOLE_GRPC_TLS_KEY_FILE": "/k.pem"}, "CONSOLE_GRPC_TLS_CERT_FILE and"),
        ({"CONSOLE_TLS_CLIENT_CA_FILE": "/ca.pem"}, "over HTTPS only"),
    ],
)
def test_console_tls_settings_that_do_not_go_together(env: dict[str, str], words: str) -> None:
    from agentstate.common.config import ConfigError
    from agentstate.console.config import ConsoleSettings

    with pytest.raises(ConfigError, match=words):
        ConsoleSettings.from_env({"CONSOLE_DEV_USER": "u", **env})
