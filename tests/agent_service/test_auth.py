"""Authentication of the end user (agent_service/auth.py): every mode, every refusal.

Real gRPC agent services on loopback (in-process, and once as a real process), a JWKS
served by a real HTTP server on 127.0.0.1 and from a file, tokens signed with real keys.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import logging
import socket
import threading
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import grpc
import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from jwt.algorithms import RSAAlgorithm
from pydantic import SecretStr

from agentstate.agent.v1 import agent_service_pb2 as pb
from agentstate.agent.v1 import agent_service_pb2_grpc as pb_grpc
from agentstate.agent_service import auth
from agentstate.agent_service.auth import (
    NO_CREDENTIALS,
    PROXY_UNTRUSTED,
    TOKEN_EXPIRED,
    TOKEN_INVALID,
)
from agentstate.agent_service.config import AgentServiceSettings
from agentstate.client.metadata import PROXY_SECRET_METADATA_KEY, USER_ID_METADATA_KEY
from agentstate.common import error_details
from agentstate.common.config import ConfigError
from agentstate.dev.processes import ServiceProcess
from tests.support.agent_harness import Stack, collect

ISSUER = "https://login.example.test/realms/agentstate"
AUDIENCE = "agentstate-agent"
PROXY_SECRET = "s" * 40
QUESTION = "我的订单88235现在什么状态？"


def _private_key() -> rsa.RSAPrivateKey:
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


KEY = _private_key()
OTHER_KEY = _private_key()  # an attacker's key: a valid-looking token, wrong signature
PUBLIC_PEM = KEY.public_key().public_bytes(
    serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
)


def jwks(kid: str = "k1") -> dict[str, Any]:
    jwk = json.loads(RSAAlgorithm.to_jwk(KEY.public_key()))
    return {"keys": [{**jwk, "kid": kid, "use": "sig", "alg": "RS256"}]}


def token(
    sub: str = "alice",
    *,
    key: Any = KEY,
    algorithm: str = "RS256",
    kid: str | None = "k1",
    **claims: Any,
) -> str:
    now = int(time.time())
    payload = {"iss": ISSUER, "aud": AUDIENCE, "sub": sub, "iat": now, "exp": now + 300}
    payload.update(claims)
    headers = {"kid": kid} if kid else None
    return jwt.encode(payload, key, algorithm=algorithm, headers=headers)


def _part(data: dict[str, Any]) -> str:
    return base64.urlsafe_b64encode(json.dumps(data).encode()).rstrip(b"=").decode()


def _claims(sub: str) -> dict[str, Any]:
    return {"iss": ISSUER, "aud": AUDIENCE, "sub": sub, "exp": int(time.time()) + 300}


def unsigned_token(sub: str = "alice") -> str:
    """alg=none: a token anyone can write."""
    return f"{_part({'alg': 'none', 'typ': 'JWT', 'kid': 'k1'})}.{_part(_claims(sub))}."


def hs256_with_public_key(sub: str = "alice") -> str:
    """Algorithm confusion: HMAC-SHA256 keyed with the issuer's public key (public data)."""
    signing_input = f"{_part({'alg': 'HS256', 'typ': 'JWT', 'kid': 'k1'})}.{_part(_claims(sub))}"
    mac = hmac.new(PUBLIC_PEM, signing_input.encode(), hashlib.sha256).digest()
    return f"{signing_input}.{base64.urlsafe_b64encode(mac).rstrip(b'=').decode()}"


def bearer(value: str) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {value}"),)


class JwksServer:
    """The identity provider's JWKS endpoint, on loopback; counts the fetches."""

    def __init__(self) -> None:
        self.document = jwks()
        self.raw: bytes | None = None  # served as it is instead of the document when set
        self.fetches = 0
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                outer.fetches += 1
                body = outer.raw if outer.raw is not None else json.dumps(outer.document).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/certs"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture(scope="module")
def jwks_server() -> Iterator[JwksServer]:
    server = JwksServer()
    yield server
    server.close()


def jwt_settings(**values: Any) -> dict[str, Any]:
    return {
        "auth_mode": "jwt",
        "jwt_issuer": ISSUER,
        "jwt_audience": AUDIENCE,
        **values,
    }


@pytest.fixture
async def jwt_stack(
    database_url: str, orders_database_url: str, jwks_server: JwksServer
) -> AsyncIterator[Stack]:
    """State service + one agent replica verifying tokens against the HTTP JWKS."""
    running = Stack(database_url, orders_database_url, **jwt_settings(jwt_jwks_url=jwks_server.url))
    await running.start_state()
    await running.start_agent()
    yield running
    await running.close()


def refusal(exc: grpc.aio.AioRpcError) -> tuple[grpc.StatusCode, str]:
    info = error_details.error_info(exc)
    assert info is not None, "an UNAUTHENTICATED without ErrorInfo"
    return exc.code(), info.reason


async def list_conversations(stub: Any, md: Any) -> tuple[grpc.StatusCode, str, str]:
    try:
        await stub.ListConversations(pb.ListConversationsRequest(), metadata=md)
    except grpc.aio.AioRpcError as exc:
        code, reason = refusal(exc)
        return code, reason, exc.details() or ""
    return grpc.StatusCode.OK, "", ""


# Each refused credential: its ErrorInfo reason and words of its message.
REFUSALS = {
    "missing token": ((), NO_CREDENTIALS, "authorization: Bearer"),
    "not bearer": ((("authorization", "Basic YWxpY2U6cHc="),), NO_CREDENTIALS, "Bearer"),
    "expired": (
        bearer(token(exp=int(time.time()) - 3600, iat=int(time.time()) - 7200)),
        TOKEN_EXPIRED,
        "expired",
    ),
    "wrong audience": (bearer(token(aud="another-service")), TOKEN_INVALID, "sign in again"),
    "wrong issuer": (bearer(token(iss="https://evil.test")), TOKEN_INVALID, "sign in again"),
    "bad signature": (bearer(token(key=OTHER_KEY)), TOKEN_INVALID, "sign in again"),
    "alg none": (bearer(unsigned_token()), TOKEN_INVALID, "sign in again"),
    "hs256 with the public key": (bearer(hs256_with_public_key()), TOKEN_INVALID, "sign in again"),
    "unknown kid": (bearer(token(kid="rotated-away")), TOKEN_INVALID, "sign in again"),
    "no sub": (bearer(token(sub=None)), TOKEN_INVALID, "sign in again"),  # type: ignore[arg-type]
    "garbage": (bearer("not.a.jwt"), TOKEN_INVALID, "sign in again"),
    # A bare header means nothing in jwt mode.
    "bare header": (((USER_ID_METADATA_KEY, "alice"),), NO_CREDENTIALS, "Bearer"),
}


async def test_jwt_refuses_every_bad_credential_and_accepts_a_good_one(
    jwt_stack: Stack, jwks_server: JwksServer, caplog: pytest.LogCaptureFixture
) -> None:
    stub = jwt_stack.agents[0][1].stub
    caplog.set_level(logging.INFO, logger="agentstate.agent_service.auth")
    for name, (md, reason, words) in REFUSALS.items():
        code, got_reason, message = await list_conversations(stub, md)
        assert (code, got_reason) == (grpc.StatusCode.UNAUTHENTICATED, reason), name
        assert words in message, (name, message)
        # Nothing internal in what the caller reads: no issuer, audience, URL or key id.
        for internal in (ISSUER, AUDIENCE, jwks_server.url, "rotated-away", "kid"):
            assert internal not in message, (name, message)
    # Why each was refused is in the operator's log instead.
    logged = caplog.text
    assert "Audience doesn't match" in logged and "Invalid issuer" in logged
    assert "Signature verification failed" in logged
    assert "algorithm 'none'" in logged and "algorithm 'HS256'" in logged

    # A good token: the user is its `sub`; a Chat runs as that user.
    code, _, _ = await list_conversations(stub, bearer(token("alice")))
    assert code == grpc.StatusCode.OK
    turn = await collect(stub.Chat(pb.ChatRequest(question=QUESTION), metadata=bearer(token())))
    assert turn.code == grpc.StatusCode.OK, turn.details
    state, _ = await jwt_stack.reader.state("alice", turn.meta.conversation_id)
    assert state.user_id == "alice"
    # The JWKS was fetched once for all of that (cached), plus once for the unknown kid.
    assert jwks_server.fetches <= 2, jwks_server.fetches


async def test_streaming_rpcs_refuse_before_running_anything(jwt_stack: Stack) -> None:
    stub = jwt_stack.agents[0][1].stub
    turn = await collect(
        stub.Chat(pb.ChatRequest(question=QUESTION), metadata=bearer(token(key=OTHER_KEY)))
    )
    assert turn.code == grpc.StatusCode.UNAUTHENTICATED and turn.events == []
    turn = await collect(
        stub.Confirm(
            pb.ConfirmRequest(conversation_id="c", message_id="m", approved=True), metadata=()
        )
    )
    assert turn.code == grpc.StatusCode.UNAUTHENTICATED and turn.events == []
    # Validation comes after identity: an anonymous caller learns nothing about its request.
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await stub.GetRagHistory(pb.GetRagHistoryRequest(turns=10_000), metadata=())
    assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await stub.Stop(pb.StopRequest(task_id=""), metadata=())
    assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED


async def test_a_token_for_alice_cannot_touch_bobs_conversation(jwt_stack: Stack) -> None:
    stub = jwt_stack.agents[0][1].stub
    turn = await collect(
        stub.Chat(pb.ChatRequest(question=QUESTION), metadata=bearer(token("bob")))
    )
    assert turn.code == grpc.StatusCode.OK, turn.details
    bobs = turn.meta.conversation_id
    before_state = await jwt_stack.reader.raw_state("bob", bobs)
    before_records = await jwt_stack.reader.records("bob", bobs)
    alice = bearer(token("alice"))
    attempts = [
        stub.ListMessages(pb.ListMessagesRequest(conversation_id=bobs), metadata=alice),
        stub.RenameConversation(
            pb.RenameConversationRequest(conversation_id=bobs, title="mine now"), metadata=alice
        ),
        stub.DeleteConversation(pb.DeleteConversationRequest(conversation_id=bobs), metadata=alice),
        stub.BatchDeleteConversations(
            pb.BatchDeleteConversationsRequest(conversation_ids=[bobs]), metadata=alice
        ),
        stub.GetRagHistory(pb.GetRagHistoryRequest(conversation_id=bobs), metadata=alice),
    ]
    for call in attempts:
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await call
        assert refused.value.code() == grpc.StatusCode.NOT_FOUND, refused.value.details()
    turn = await collect(
        stub.Chat(pb.ChatRequest(conversation_id=bobs, question="hi"), metadata=alice)
    )
    assert turn.code == grpc.StatusCode.NOT_FOUND, turn.details
    listed = await stub.ListConversations(pb.ListConversationsRequest(), metadata=alice)
    assert bobs not in [c.conversation_id for c in listed.items]
    # Nothing of Bob's changed.
    assert await jwt_stack.reader.raw_state("bob", bobs) == before_state
    assert await jwt_stack.reader.records("bob", bobs) == before_records


async def test_jwks_file_pem_file_claim_and_leeway(
    database_url: str, orders_database_url: str, tmp_path: Path
) -> None:
    """Keys from a JWKS file and from a PEM file; another user claim; clock skew."""
    jwks_file = tmp_path / "jwks.json"
    jwks_file.write_text(json.dumps(jwks()))
    pem_file = tmp_path / "key.pem"
    pem_file.write_bytes(PUBLIC_PEM)
    stack = Stack(database_url, orders_database_url)
    await stack.start_state()
    try:
        by_file = await stack.start_agent(
            **jwt_settings(jwt_key_file=str(jwks_file), jwt_leeway_seconds=60)
        )
        by_pem = await stack.start_agent(
            **jwt_settings(jwt_key_file=str(pem_file), jwt_user_claim="email")
        )
        skewed = token(exp=int(time.time()) - 30)  # expired 30 s ago: within 60 s of skew
        code, _, _ = await list_conversations(by_file.stub, bearer(skewed))
        assert code == grpc.StatusCode.OK
        skewed = token(exp=int(time.time()) - 40, email="carol@example.test")
        code, reason, _ = await list_conversations(by_pem.stub, bearer(skewed))
        assert (code, reason) == (grpc.StatusCode.UNAUTHENTICATED, TOKEN_EXPIRED)  # 30 s default
        code, _, _ = await list_conversations(by_file.stub, bearer(token(kid=None)))
        assert code == grpc.StatusCode.OK  # one key in the set: no kid needed
        for bad in (unsigned_token(), hs256_with_public_key(), token(key=OTHER_KEY)):
            code, reason, _ = await list_conversations(by_pem.stub, bearer(bad))
            assert (code, reason) == (grpc.StatusCode.UNAUTHENTICATED, TOKEN_INVALID)
        # The user is the configured claim.
        turn = await collect(
            by_pem.stub.Chat(
                pb.ChatRequest(question=QUESTION),
                metadata=bearer(token("subject-1", email="carol@example.test")),
            )
        )
        assert turn.code == grpc.StatusCode.OK, turn.details
        state, _ = await stack.reader.state("carol@example.test", turn.meta.conversation_id)
        assert state.user_id == "carol@example.test"
        code, reason, _ = await list_conversations(by_pem.stub, bearer(token()))  # no email
        assert (code, reason) == (grpc.StatusCode.UNAUTHENTICATED, TOKEN_INVALID)
    finally:
        await stack.close()


async def test_jwks_unreachable_is_unavailable_not_a_refusal(
    database_url: str, orders_database_url: str
) -> None:
    stack = Stack(database_url, orders_database_url)
    await stack.start_state()
    try:
        with socket_closed_port() as port:
            client = await stack.start_agent(
                **jwt_settings(jwt_jwks_url=f"http://127.0.0.1:{port}/certs")
            )
            with pytest.raises(grpc.aio.AioRpcError) as failed:
                await client.stub.ListConversations(
                    pb.ListConversationsRequest(), metadata=bearer(token())
                )
        assert failed.value.code() == grpc.StatusCode.UNAVAILABLE
        assert "127.0.0.1" not in (failed.value.details() or "")
    finally:
        await stack.close()


@contextmanager
def socket_closed_port() -> Iterator[int]:
    """A loopback port nothing listens on: bound, never listening, connections refused."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        yield int(sock.getsockname()[1])


async def test_proxy_mode_needs_the_proxy_secret(stack: Stack) -> None:
    client = await stack.start_agent(auth_mode="proxy", proxy_secret=SecretStr(PROXY_SECRET))
    user = ((USER_ID_METADATA_KEY, "dave"),)
    for md, reason in [
        (user, PROXY_UNTRUSTED),  # a pod that reached the port, without the secret
        ((*user, (PROXY_SECRET_METADATA_KEY, "s" * 39)), PROXY_UNTRUSTED),
        ((*user, (PROXY_SECRET_METADATA_KEY, PROXY_SECRET + "x")), PROXY_UNTRUSTED),
        (((PROXY_SECRET_METADATA_KEY, PROXY_SECRET),), NO_CREDENTIALS),
    ]:
        code, got, message = await list_conversations(client.stub, md)
        assert (code, got) == (grpc.StatusCode.UNAUTHENTICATED, reason), md
        assert PROXY_SECRET not in message
    code, _, _ = await list_conversations(
        client.stub, (*user, (PROXY_SECRET_METADATA_KEY, PROXY_SECRET))
    )
    assert code == grpc.StatusCode.OK


async def test_dev_header_warns_at_start_up(stack: Stack, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING)
    await stack.start_agent(auth_mode="dev-header")
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert any("AGENT_AUTH_MODE=dev-header" in r.getMessage() for r in warnings)
    caplog.clear()
    await stack.start_agent(auth_mode="proxy", proxy_secret=SecretStr(PROXY_SECRET))
    assert not any("dev-header" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({}, "AGENT_AUTH_MODE=jwt (the default) needs AGENT_JWT_ISSUER"),
        ({"auth_mode": "jwt", "jwt_issuer": ISSUER}, "missing: AGENT_JWT_AUDIENCE"),
        (jwt_settings(), "one of AGENT_JWT_JWKS_URL or AGENT_JWT_KEY_FILE"),
        (
            jwt_settings(jwt_jwks_url="http://127.0.0.1:1/", jwt_key_file="/x"),
            "AGENT_JWT_JWKS_URL and AGENT_JWT_KEY_FILE are both set; set only one of them",
        ),
        (jwt_settings(jwt_key_file="/nonexistent/jwks.json"), "cannot be read"),
        ({"auth_mode": "proxy"}, "needs AGENT_PROXY_SECRET of at least 32"),
        ({"auth_mode": "proxy", "proxy_secret": "short"}, "needs AGENT_PROXY_SECRET"),
    ],
)
def test_incomplete_authentication_settings_refuse_to_start(
    values: dict[str, Any], message: str
) -> None:
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        auth.build_authenticator(AgentServiceSettings(**values))


@pytest.mark.parametrize("algorithms", ["none", "HS256", "RS256,HS512", " , "])
def test_only_public_key_algorithms_can_be_configured(algorithms: str) -> None:
    with pytest.raises(ConfigError, match="AGENT_JWT_ALGORITHMS"):
        AgentServiceSettings.from_env({"AGENT_JWT_ALGORITHMS": algorithms})
    ok = AgentServiceSettings.from_env({"AGENT_JWT_ALGORITHMS": "ES256, PS256"})
    assert ok.jwt_algorithms == ("ES256", "PS256")


# A JWKS whose only key is broken: an RSA key whose modulus is not base64url.
BROKEN_KEY_JWKS = {"keys": [{"kty": "RSA", "kid": "k1", "n": "%%%", "e": "AQAB", "alg": "RS256"}]}

# What a JWKS URL may answer with 200 that is not a usable JWKS.
NOT_A_JWKS = {
    "an HTML page": b"<html><body>Please sign in</body></html>",
    "invalid JSON": b'{"keys": [',
    "an empty object": b"{}",
    "no keys": b'{"keys": []}',
    "a JSON list": b"[]",
    "a broken key": json.dumps(BROKEN_KEY_JWKS).encode(),
}


@pytest.mark.parametrize("body", NOT_A_JWKS.values(), ids=NOT_A_JWKS.keys())
async def test_a_jwks_url_answering_something_else_is_unavailable(
    database_url: str, orders_database_url: str, body: bytes, caplog: pytest.LogCaptureFixture
) -> None:
    """200 with a body that is not a JWKS: UNAVAILABLE with ErrorInfo (the README's
    promise), never UNKNOWN; the log says what is wrong with the document, truly."""
    server = JwksServer()
    server.raw = body
    stack = Stack(database_url, orders_database_url)
    await stack.start_state()
    try:
        client = await stack.start_agent(**jwt_settings(jwt_jwks_url=server.url))
        caplog.set_level(logging.WARNING, logger="agentstate.agent_service.auth")
        with pytest.raises(grpc.aio.AioRpcError) as failed:
            await client.stub.ListConversations(
                pb.ListConversationsRequest(), metadata=bearer(token())
            )
        assert failed.value.code() == grpc.StatusCode.UNAVAILABLE, failed.value.details()
        assert error_details.error_info(failed.value) is not None
        assert "retry later" in (failed.value.details() or "")
        assert server.url not in (failed.value.details() or "")
        logged = caplog.text
        assert "AGENT_JWT_JWKS_URL" in logged and server.url in logged
        assert "cryptography" not in logged
        if body is NOT_A_JWKS["a broken key"]:
            assert "key 'k1' is broken" in logged, logged
        # Once the issuer serves its keys again, the same token is accepted.
        server.raw = None
        await client.stub.ListConversations(pb.ListConversationsRequest(), metadata=bearer(token()))
    finally:
        await stack.close()
        server.close()


def test_a_jwks_file_with_a_broken_key_says_so(tmp_path: Path) -> None:
    path = tmp_path / "jwks.json"
    path.write_text(json.dumps(BROKEN_KEY_JWKS))
    with pytest.raises(ConfigError) as refused:
        auth.build_authenticator(AgentServiceSettings(**jwt_settings(jwt_key_file=str(path))))
    message = str(refused.value)
    assert "a JWKS without a usable key: key 'k1' is broken" in message, message
    assert "cryptography" not in message
    path.write_text('{"keys": []}')
    with pytest.raises(ConfigError, match='its "keys" list is empty'):
        auth.build_authenticator(AgentServiceSettings(**jwt_settings(jwt_key_file=str(path))))


async def test_a_token_over_16_kb_gets_an_error_info(jwt_stack: Stack) -> None:
    stub = jwt_stack.agents[0][1].stub
    huge = token(groups=["g" * 100] * 200)  # ~27 KB: an identity provider listing every group
    assert len(huge) > auth.MAX_TOKEN_BYTES
    code, reason, message = await list_conversations(stub, bearer(huge))
    assert (code, reason) == (grpc.StatusCode.UNAUTHENTICATED, auth.TOKEN_TOO_LARGE)
    assert f"{len(huge)} bytes" in message and "smaller token" in message
    # Just under the limit is verified as usual.
    fits = token(pad="p" * ((auth.MAX_TOKEN_BYTES - len(token())) * 3 // 4 - 100))
    assert len(fits) <= auth.MAX_TOKEN_BYTES
    code, _, _ = await list_conversations(stub, bearer(fits))
    assert code == grpc.StatusCode.OK


async def test_a_refused_proxy_call_logs_the_callers_address(
    stack: Stack, caplog: pytest.LogCaptureFixture
) -> None:
    client = await stack.start_agent(auth_mode="proxy", proxy_secret=SecretStr(PROXY_SECRET))
    caplog.set_level(logging.WARNING, logger="agentstate.agent_service.auth")
    code, reason, _ = await list_conversations(client.stub, ((USER_ID_METADATA_KEY, "dave"),))
    assert (code, reason) == (grpc.StatusCode.UNAUTHENTICATED, PROXY_UNTRUSTED)
    refused = [r.getMessage() for r in caplog.records if "authenticating proxy" in r.getMessage()]
    assert refused and "127.0.0.1:" in refused[0], refused
    assert PROXY_SECRET not in caplog.text


def jwt_agent_env(state_address: str, orders_url: str, key_dir: Path) -> dict[str, str]:
    """An agent-service process with the order demo behind jwt, trusting KEY (a JWKS
    file written to `key_dir`)."""
    jwks_file = key_dir / "jwks.json"
    jwks_file.write_text(json.dumps(jwks()))
    return {
        "AGENT_LISTEN_ADDRESS": "127.0.0.1:0",
        "AGENT_STATE_ADDRESS": state_address,
        "AGENT_PROFILE": "order_demo",
        "ORDERS_DATABASE_URL": orders_url,
        "AGENT_AUTH_MODE": "jwt",
        "AGENT_JWT_ISSUER": ISSUER,
        "AGENT_JWT_AUDIENCE": AUDIENCE,
        "AGENT_JWT_KEY_FILE": str(jwks_file),
    }


def test_agent_process_verifies_tokens(
    state_process_address: str, orders_database_url: str, tmp_path: Path
) -> None:
    """The real agent-service process, configured by environment variables: refuses
    without a token, serves with one; an unconfigured one refuses to start."""
    unconfigured = ServiceProcess(
        "agentstate.agent_service",
        {"AGENT_LISTEN_ADDRESS": "127.0.0.1:0", "AGENT_STATE_ADDRESS": state_process_address},
    )
    try:
        assert unconfigured.wait(30) == 2, unconfigured.output
    finally:
        unconfigured.kill()
    assert "AGENT_AUTH_MODE=jwt (the default) needs AGENT_JWT_ISSUER" in unconfigured.output

    service = ServiceProcess(
        "agentstate.agent_service",
        jwt_agent_env(state_process_address, orders_database_url, tmp_path),
    )
    try:
        address = service.wait_ready()
        with grpc.insecure_channel(address) as channel:
            stub = pb_grpc.AgentServiceStub(channel)
            for md in [(), ((USER_ID_METADATA_KEY, "alice"),), bearer(token(key=OTHER_KEY))]:
                with pytest.raises(grpc.RpcError) as refused:
                    stub.ListConversations(pb.ListConversationsRequest(), metadata=md)
                assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
            events = [
                r.event
                for r in stub.Chat(
                    pb.ChatRequest(question=QUESTION), metadata=bearer(token("erin")), timeout=60
                )
            ]
            assert events[-1].WhichOneof("event") == "done"
            listed = stub.ListConversations(
                pb.ListConversationsRequest(), metadata=bearer(token("erin"))
            )
            assert [c.conversation_id for c in listed.items] == [events[0].meta.conversation_id]
    finally:
        assert service.terminate() == 0, service.output
    assert "auth jwt" in service.output
    assert "dev-header" not in service.output
