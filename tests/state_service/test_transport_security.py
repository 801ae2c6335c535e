"""TLS, mTLS, caller identity, the policy and the audit trail of the state service.

Real state services (StateServiceApp, the process's code path) on 127.0.0.1 with real
certificates (tests/support/certs.py) and real signed service tokens; the client is
agentstate.client over TLS, and raw stubs where the ErrorInfo is read.
"""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import ssl
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric import rsa

from agentstate.client import AsyncStateClient, ChannelSecurity, ClientSettings
from agentstate.client import PermissionDenied as ClientPermissionDenied
from agentstate.common import error_details
from agentstate.common.config import ConfigError
from agentstate.state.v1 import state_service_pb2 as pb
from agentstate.state.v1 import state_service_pb2_grpc as pb_grpc
from agentstate.state_service.config import StateServiceSettings
from agentstate.state_service.policy import ADMIN_RPCS, READ_RPCS, WRITE_RPCS, group_of
from agentstate.state_service.server import StateServiceApp
from tests.support.certs import CertificateAuthority, Pair

AGENT_ID = "spiffe://cluster.local/ns/agentstate/sa/agentstate-agent"
ISSUER = "https://tokens.example.test"
AUDIENCE = "agentstate-state"
TOKEN_KEY = rsa.generate_private_key(public_exponent=65537, key_size=2048)


class Pki:
    def __init__(self, root: Path) -> None:
        self.ca = CertificateAuthority(root / "ca")
        self.server = self.ca.issue("server", "state", server=True, into=root / "server")
        self.agent = self.ca.issue("agent", "agentstate-agent", spiffe=AGENT_ID)
        self.reporting = self.ca.issue("reporting", "reporting")
        self.operator = self.ca.issue("operator", "operator")
        self.tenant_tool = self.ca.issue("tenant", "tenant-tool")
        self.stranger = CertificateAuthority(root / "other", "another CA").issue(
            "stranger", "agentstate-agent", spiffe=AGENT_ID
        )

    def security(self, pair: Pair | None = None, **more: Any) -> ChannelSecurity:
        return ChannelSecurity(
            ca_file=str(self.ca.file),
            cert_file=str(pair.cert) if pair else "",
            key_file=str(pair.key) if pair else "",
            **more,
        )


@pytest.fixture
def pki(tmp_path: Path) -> Pki:
    return Pki(tmp_path)


POLICY = {
    "rules": [
        {"caller": AGENT_ID, "rpcs": ["read", "write"]},
        {"caller": "reporting", "rpcs": ["read"]},
        {"caller": "operator", "rpcs": ["read", "write", "admin"]},
        {"caller": "tenant-tool", "rpcs": ["*"], "users": ["tenant-a:*"]},
        {"caller": "batch-job", "rpcs": ["GetState", "UpsertState", "ResolveConversation"]},
        {"caller": "*", "rpcs": ["read"], "users": ["self"]},
    ]
}


def settings(pki: Pki, **values: Any) -> StateServiceSettings:
    return StateServiceSettings(
        store="memory",
        listen_address="127.0.0.1:0",
        tls_cert_file=str(pki.server.cert),
        tls_key_file=str(pki.server.key),
        **values,
    )


async def started(s: StateServiceSettings) -> tuple[StateServiceApp, str]:
    app = StateServiceApp(s)
    try:
        address = await app.start()
    except BaseException:
        await app.stop()
        raise
    return app, address


@pytest.fixture
async def tls_service(pki: Pki) -> AsyncIterator[str]:
    app, address = await started(settings(pki))
    yield address
    await app.stop()


@pytest.fixture
async def mtls_service(pki: Pki, tmp_path: Path) -> AsyncIterator[str]:
    policy = tmp_path / "policy.json"
    policy.write_text(json.dumps(POLICY))
    app, address = await started(
        settings(pki, tls_client_ca_file=str(pki.ca.file), policy_file=str(policy))
    )
    yield address
    await app.stop()


def secure_stub(address: str, security: ChannelSecurity) -> tuple[grpc.aio.Channel, Any]:
    credentials = security.credentials()
    assert credentials is not None
    channel = grpc.aio.secure_channel(address, credentials, options=security.options())
    return channel, pb_grpc.StateServiceStub(channel)


async def test_tls_serves_the_client_and_refuses_plaintext(pki: Pki, tls_service: str) -> None:
    env = {
        "AGENTSTATE_STATE_ADDRESS": tls_service,
        "AGENTSTATE_STATE_TLS_CA_FILE": str(pki.ca.file),
    }
    async with AsyncStateClient.from_settings(ClientSettings.from_env(env)) as state:
        cid = (await state.resolve_conversation("alice", "t")).conversation.conversation_id
        await state.upsert_state("alice", cid, {"context": []}, expected_version=0)
        assert (await state.get_state("alice", cid)).version == 1
    # A plaintext caller gets nowhere, and neither does one that trusts another CA.
    async with grpc.aio.insecure_channel(tls_service) as channel:
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await pb_grpc.StateServiceStub(channel).GetState(
                pb.GetStateRequest(user_id="alice", conversation_id=cid), timeout=3
            )
        assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
    other = ChannelSecurity(ca_file=str(pki.stranger.cert))
    channel, stub = secure_stub(tls_service, other)
    async with channel:
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await stub.GetState(pb.GetStateRequest(user_id="alice", conversation_id=cid), timeout=3)
        assert refused.value.code() == grpc.StatusCode.UNAVAILABLE


def _handshake(address: str, version: ssl.TLSVersion, ca: Path) -> str:
    host, port = address.rsplit(":", 1)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.load_verify_locations(str(ca))
    context.minimum_version = version
    context.maximum_version = version
    context.set_alpn_protocols(["h2"])
    if version < ssl.TLSVersion.TLSv1_2:
        context.set_ciphers("DEFAULT:@SECLEVEL=0")  # let this client offer the old version
    with (
        socket.create_connection((host, int(port)), timeout=5) as raw,
        context.wrap_socket(raw, server_hostname="localhost") as tls,
    ):
        return str(tls.version())


@pytest.mark.filterwarnings("ignore:ssl.TLSVersion:DeprecationWarning")
@pytest.mark.parametrize("old", [ssl.TLSVersion.TLSv1, ssl.TLSVersion.TLSv1_1])
def test_only_tls_1_2_and_later_are_negotiated(
    pki: Pki, tls_service: str, old: ssl.TLSVersion
) -> None:
    assert _handshake(tls_service, ssl.TLSVersion.TLSv1_2, pki.ca.file) == "TLSv1.2"
    assert _handshake(tls_service, ssl.TLSVersion.TLSv1_3, pki.ca.file) == "TLSv1.3"
    with pytest.raises((ssl.SSLError, ConnectionError)):
        _handshake(tls_service, old, pki.ca.file)


def _served_certificate_issuer(address: str) -> str:
    host, port = address.rsplit(":", 1)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    context.set_alpn_protocols(["h2"])
    with (
        socket.create_connection((host, int(port)), timeout=5) as raw,
        context.wrap_socket(raw) as tls,
    ):
        der = tls.getpeercert(binary_form=True)
    from cryptography import x509

    assert der is not None
    return x509.load_der_x509_certificate(der).issuer.rfc4514_string()


async def test_a_renewed_certificate_is_served_without_a_restart(
    pki: Pki, tls_service: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    assert _served_certificate_issuer(tls_service) == "CN=agentstate test CA"
    renewed_ca = CertificateAuthority(tmp_path / "renewed", "renewed CA")
    # A half-written renewal (only the key replaced) keeps the old pair in service.
    staged = renewed_ca.issue("server", "state", server=True, into=tmp_path / "staged")
    caplog.set_level(logging.WARNING, logger="agentstate.common.tls")
    pki.server.key.write_bytes(staged.key.read_bytes())
    assert _served_certificate_issuer(tls_service) == "CN=agentstate test CA"
    assert "cannot be loaded" in caplog.text
    # Then the certificate too: new connections get it, the process never restarted.
    await asyncio.sleep(0.01)  # a distinct modification time
    pki.server.cert.write_bytes(staged.cert.read_bytes())
    assert _served_certificate_issuer(tls_service) == "CN=renewed CA"
    # A call over the renewed certificate reaches the handler (NOT_FOUND: there is no
    # such conversation).
    renewed = ChannelSecurity(ca_file=str(renewed_ca.file))
    assert await _call_completes(tls_service, renewed) == grpc.StatusCode.NOT_FOUND


def channel_of(address: str, security: ChannelSecurity) -> grpc.aio.Channel:
    return secure_stub(address, security)[0]


async def _call_completes(address: str, security: ChannelSecurity) -> grpc.StatusCode:
    channel, stub = secure_stub(address, security)
    async with channel:
        try:
            await stub.GetConversation(
                pb.GetConversationRequest(user_id="u", conversation_id="424242"), timeout=5
            )
        except grpc.aio.AioRpcError as exc:
            return exc.code()
    return grpc.StatusCode.OK


# ---- mTLS, identity and the policy


async def test_mtls_needs_a_certificate_of_the_client_ca(pki: Pki, mtls_service: str) -> None:
    assert await _call_completes(mtls_service, pki.security(pki.agent)) == grpc.StatusCode.NOT_FOUND
    # No certificate, or one from another CA: the handshake fails, no call is made.
    assert await _call_completes(mtls_service, pki.security()) == grpc.StatusCode.UNAVAILABLE
    stranger = pki.security(pki.stranger)
    assert await _call_completes(mtls_service, stranger) == grpc.StatusCode.UNAVAILABLE


def _refusal(exc: grpc.aio.AioRpcError) -> tuple[grpc.StatusCode, str]:
    info = error_details.error_info(exc)
    assert info is not None, f"{exc.code()} without ErrorInfo"
    return exc.code(), info.reason


async def _try(stub: Any, rpc: str, request: Any) -> tuple[grpc.StatusCode, str, str]:
    try:
        await getattr(stub, rpc)(request, timeout=5)
    except grpc.aio.AioRpcError as exc:
        code, reason = _refusal(exc)
        return code, reason, exc.details() or ""
    return grpc.StatusCode.OK, "", ""


async def test_every_rule_of_the_policy(pki: Pki, mtls_service: str) -> None:
    agent_channel, agent = secure_stub(mtls_service, pki.security(pki.agent))
    report_channel, reporting = secure_stub(mtls_service, pki.security(pki.reporting))
    op_channel, operator = secure_stub(mtls_service, pki.security(pki.operator))
    tenant_channel, tenant = secure_stub(mtls_service, pki.security(pki.tenant_tool))
    async with agent_channel, report_channel, op_channel, tenant_channel:
        # The agent (by its SPIFFE ID) reads and writes anyone's state.
        made = await agent.ResolveConversation(
            pb.ResolveConversationRequest(user_id="alice", external_key="k", create_if_missing=True)
        )
        cid = made.conversation.conversation_id
        await agent.UpsertState(
            pb.UpsertStateRequest(
                user_id="alice", conversation_id=cid, payload=b'{"context": []}', expected_version=0
            )
        )
        before = await agent.GetState(pb.GetStateRequest(user_id="alice", conversation_id=cid))
        # The reporting service (by its common name) only reads.
        got = await reporting.GetState(pb.GetStateRequest(user_id="alice", conversation_id=cid))
        assert got.payload == before.payload
        listed = await reporting.ListConversations(pb.ListConversationsRequest(user_id="alice"))
        assert [c.conversation_id for c in listed.conversations] == [cid]
        for rpc, request in [
            (
                "DeleteConversation",
                pb.DeleteConversationRequest(user_id="alice", conversation_id=cid),
            ),
            (
                "UpsertState",
                pb.UpsertStateRequest(
                    user_id="alice", conversation_id=cid, payload=b"{}", expected_version=1
                ),
            ),
            (
                "BatchDeleteConversations",
                pb.BatchDeleteConversationsRequest(user_id="alice", conversation_ids=[cid]),
            ),
        ]:
            code, reason, message = await _try(reporting, rpc, request)
            assert code == grpc.StatusCode.PERMISSION_DENIED and reason == "PERMISSION_DENIED"
            assert f"reporting (mtls) may not call {rpc} for user 'alice'" in message
            assert "STATE_POLICY_FILE" in message
        # The tenant tool may do anything, for its tenant's users only.
        code, _, _ = await _try(
            tenant, "ListConversations", pb.ListConversationsRequest(user_id="tenant-a:bob")
        )
        assert code == grpc.StatusCode.OK
        code, reason, message = await _try(
            tenant, "GetState", pb.GetStateRequest(user_id="alice", conversation_id=cid)
        )
        assert (code, reason) == (grpc.StatusCode.PERMISSION_DENIED, "PERMISSION_DENIED")
        # The operator may do everything, deletes included.
        deleted = await operator.DeleteConversation(
            pb.DeleteConversationRequest(user_id="alice", conversation_id=cid)
        )
        assert deleted.conversations_deleted == 1
        # Nothing a refusal touched changed before the operator's delete.
        assert got.version == before.version == 1


def test_rpc_groups_cover_the_contract_and_new_rpcs_are_admin() -> None:
    names = {m.name for m in pb.DESCRIPTOR.services_by_name["StateService"].methods}
    assert names == READ_RPCS | WRITE_RPCS | ADMIN_RPCS, "classify each new RPC in policy.py"
    assert not READ_RPCS & WRITE_RPCS and not (READ_RPCS | WRITE_RPCS) & ADMIN_RPCS
    assert all(group_of(rpc) == "admin" for rpc in ADMIN_RPCS)
    assert group_of("EraseUser") == "admin" and group_of("ListAllConversations") == "admin"


def test_cross_user_calls_need_a_rule_for_every_user(pki: Pki, tmp_path: Path) -> None:
    from agentstate.state_service.policy import Caller, load_policy

    path = tmp_path / "policy.json"
    path.write_text(json.dumps(POLICY))
    policy = load_policy(str(path), READ_RPCS | WRITE_RPCS)
    operator = Caller("operator", "mtls")
    tenant = Caller("tenant-tool", "mtls")
    agent = Caller(AGENT_ID, "mtls")
    assert policy.allows(operator, "EraseUser", None)
    assert policy.allows(operator, "EraseUser", "alice")
    assert not policy.allows(agent, "EraseUser", "alice")  # read and write only
    assert not policy.allows(tenant, "EraseUser", None)  # its users only: never across them
    assert policy.allows(tenant, "EraseUser", "tenant-a:x")
    assert not policy.allows(Caller("", "none"), "GetState", "alice")  # "*" is not anonymous
    # "self": any identified caller may read the user that is itself, and no other.
    user_token = Caller("ursula", "token")
    assert policy.allows(user_token, "GetState", "ursula")
    assert not policy.allows(user_token, "GetState", "alice")
    assert not policy.allows(user_token, "UpsertState", "ursula")
    assert not policy.allows(user_token, "ListConversations", None)
    batch = Caller("batch-job", "token")
    assert policy.allows(batch, "UpsertState", "u") and not policy.allows(batch, "EndTurn", "u")
    with pytest.raises(Exception, match="may not call EraseUser across users"):
        policy.check(tenant, "EraseUser", None)


@pytest.mark.parametrize(
    ("document", "words"),
    [
        ("not json", "is not JSON"),
        ("{}", 'needs a non-empty "rules" list'),
        ('{"rules": [{"rpcs": ["read"]}]}', 'rule 1 needs "caller"'),
        ('{"rules": [{"caller": "x", "rpcs": ["GetStat"]}]}', "unknown RPCs ['GetStat']"),
        ('{"rules": [{"caller": "x", "rpcs": []}]}', '"rpcs" must be a non-empty list'),
        ('{"rules": [{"caller": "x", "rpcs": ["read"], "user": "a"}]}', "unknown keys ['user']"),
    ],
)
async def test_a_bad_policy_stops_the_start(
    pki: Pki, tmp_path: Path, document: str, words: str
) -> None:
    path = tmp_path / "policy.json"
    path.write_text(document)
    with pytest.raises(ConfigError, match="STATE_POLICY_FILE") as refused:
        await started(settings(pki, tls_client_ca_file=str(pki.ca.file), policy_file=str(path)))
    assert words in str(refused.value)


async def test_a_policy_needs_a_way_to_identify_callers(pki: Pki, tmp_path: Path) -> None:
    path = tmp_path / "policy.json"
    path.write_text(json.dumps(POLICY))
    with pytest.raises(ConfigError, match="no way to identify themselves"):
        await started(settings(pki, policy_file=str(path)))
    with pytest.raises(ConfigError, match="go together"):
        StateServiceApp(StateServiceSettings(store="memory", tls_key_file=str(pki.server.key)))


# ---- service tokens


def service_token(sub: str, **claims: Any) -> str:
    now = int(time.time())
    payload = {"iss": ISSUER, "aud": AUDIENCE, "sub": sub, "iat": now, "exp": now + 300, **claims}
    return jwt.encode(payload, TOKEN_KEY, algorithm="RS256")


@pytest.fixture
async def token_service(pki: Pki, tmp_path: Path) -> AsyncIterator[str]:
    """TLS without client certificates; callers identify with service tokens."""
    from cryptography.hazmat.primitives import serialization

    key_file = tmp_path / "token-key.pem"
    key_file.write_bytes(
        TOKEN_KEY.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )
    policy = tmp_path / "policy.json"
    policy.write_text(json.dumps(POLICY))
    app, address = await started(
        settings(
            pki,
            policy_file=str(policy),
            token_issuer=ISSUER,
            token_audience=AUDIENCE,
            token_key_file=str(key_file),
        )
    )
    yield address
    await app.stop()


async def test_service_tokens_identify_callers(
    pki: Pki, token_service: str, tmp_path: Path
) -> None:
    token_file = tmp_path / "token"
    token_file.write_text(service_token("batch-job"))
    security = pki.security(token_file=str(token_file))
    env = {
        "AGENTSTATE_STATE_ADDRESS": token_service,
        "AGENTSTATE_STATE_TLS_CA_FILE": str(pki.ca.file),
        "AGENTSTATE_STATE_TOKEN_FILE": str(token_file),
    }
    async with AsyncStateClient.from_settings(ClientSettings.from_env(env)) as state:
        cid = (await state.resolve_conversation("carol", "t")).conversation.conversation_id
        await state.upsert_state("carol", cid, {"context": []}, expected_version=0)
        with pytest.raises(ClientPermissionDenied, match="batch-job \\(token\\) may not call"):
            await state.delete_conversation("carol", cid)
        # The token file is read again when it changes: now the caller is the reporter.
        await asyncio.sleep(0.01)
        token_file.write_text(service_token("reporting"))
        assert (await state.get_state("carol", cid)).version == 1
        with pytest.raises(ClientPermissionDenied, match="reporting \\(token\\)"):
            await state.upsert_state("carol", cid, {"context": [1]}, expected_version=1)
        assert json.loads((await state.get_state("carol", cid)).payload) == {"context": []}
    # No token, a forged one, an expired one: UNAUTHENTICATED, with what to do.
    async with channel_of(token_service, security):
        request = pb.GetStateRequest(user_id="carol", conversation_id=cid)
        other_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        forged = jwt.encode(
            {"iss": ISSUER, "aud": AUDIENCE, "sub": "operator", "exp": int(time.time()) + 60},
            other_key,
            algorithm="RS256",
        )
        expired = service_token("operator", exp=int(time.time()) - 3600)
        plain_channel, plain = secure_stub(token_service, pki.security())
        async with plain_channel:
            code, reason, message = await _try(plain, "GetState", request)
            assert code == grpc.StatusCode.UNAUTHENTICATED
            assert reason == "CALLER_UNAUTHENTICATED"
            assert "client certificate" in message and "Bearer" in message
            for bad, words in [(forged, "was refused"), (expired, "expired")]:
                try:
                    await plain.GetState(request, metadata=(("authorization", f"Bearer {bad}"),))
                except grpc.aio.AioRpcError as exc:
                    assert _refusal(exc) == (
                        grpc.StatusCode.UNAUTHENTICATED,
                        "CALLER_UNAUTHENTICATED",
                    )
                    assert words in (exc.details() or "")
                else:
                    raise AssertionError("a bad token was accepted")


# ---- the audit trail


async def test_every_mutating_call_is_audited_without_user_content(
    pki: Pki, mtls_service: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="agentstate.audit")
    secret_text = "我的订单88235"
    agent_channel, agent = secure_stub(mtls_service, pki.security(pki.agent))
    op_channel, operator = secure_stub(mtls_service, pki.security(pki.operator))
    report_channel, reporting = secure_stub(mtls_service, pki.security(pki.reporting))
    async with agent_channel, op_channel, report_channel:
        made = await agent.ResolveConversation(
            pb.ResolveConversationRequest(
                user_id="dave", external_key="k", title=secret_text, create_if_missing=True
            )
        )
        cid = made.conversation.conversation_id
        payload = json.dumps({"context": [secret_text]}).encode()
        await agent.UpsertState(
            pb.UpsertStateRequest(
                user_id="dave", conversation_id=cid, payload=payload, expected_version=0
            )
        )
        await agent.GetState(pb.GetStateRequest(user_id="dave", conversation_id=cid))  # a read
        stale = pb.UpsertStateRequest(
            user_id="dave", conversation_id=cid, payload=payload, expected_version=0
        )
        assert (await _try(agent, "UpsertState", stale))[0] == grpc.StatusCode.ABORTED
        await _try(
            reporting,
            "BatchDeleteConversations",
            pb.BatchDeleteConversationsRequest(user_id="dave", conversation_ids=[cid]),
        )
        await operator.BatchDeleteConversations(
            pb.BatchDeleteConversationsRequest(user_id="dave", conversation_ids=[cid])
        )
    lines = [r for r in caplog.records if r.name == "agentstate.audit"]
    seen = [(r.audit_caller, r.audit_rpc, r.audit_outcome) for r in lines]  # type: ignore[attr-defined]
    assert seen == [
        (AGENT_ID, "ResolveConversation", "ok"),
        (AGENT_ID, "UpsertState", "ok"),
        (AGENT_ID, "UpsertState", "failed: ABORTED"),
        ("reporting", "BatchDeleteConversations", "refused: PERMISSION_DENIED"),
        ("operator", "BatchDeleteConversations", "ok"),
    ]
    last = lines[-1]
    assert last.audit_user_id == "dave"  # type: ignore[attr-defined]
    assert last.audit_conversation_ids == [cid]  # type: ignore[attr-defined]
    assert last.audit_conversations_deleted == 1  # type: ignore[attr-defined]
    assert last.audit_via == "mtls" and "127.0.0.1" in last.audit_peer  # type: ignore[attr-defined]
    assert secret_text not in caplog.text


async def test_without_tokens_or_a_policy_an_authorization_header_means_nothing(
    pki: Pki, tls_service: str
) -> None:
    """The sidecar's behaviour is unchanged: it neither checks nor refuses a header it was
    never configured to read."""
    channel, stub = secure_stub(tls_service, pki.security())
    async with channel:
        request = pb.GetConversationRequest(user_id="u", conversation_id="424242")
        with pytest.raises(grpc.aio.AioRpcError) as missing:
            await stub.GetConversation(request, metadata=(("authorization", "Bearer x.y.z"),))
        assert missing.value.code() == grpc.StatusCode.NOT_FOUND


def test_authorize_checks_the_current_caller_against_the_current_policy(tmp_path: Path) -> None:
    """What a cross-user servicer calls for each user it touches (policy.authorize)."""
    from agentstate.state_service import policy as p
    from agentstate.state_service.domain import PermissionDenied

    path = tmp_path / "policy.json"
    path.write_text(json.dumps(POLICY))
    loaded = p.load_policy(str(path), READ_RPCS | WRITE_RPCS)
    p.authorize("EraseUser", None)  # no policy in force: nothing to check
    policy_token = p.set_current_policy(loaded)
    caller_token = p.set_current_caller(p.Caller("reporting", "mtls"))
    try:
        p.authorize("GetState", "anyone")
        with pytest.raises(PermissionDenied, match="reporting \\(mtls\\) may not call EraseUser"):
            p.authorize("EraseUser", None)
    finally:
        p.reset_current_caller(caller_token)
        p.reset_current_policy(policy_token)
    assert p.current_caller() == p.ANONYMOUS


async def test_listing_across_users_needs_the_setting_and_a_rule_for_every_user(
    pki: Pki, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="agentstate.audit")
    policy = tmp_path / "policy.json"
    policy.write_text(json.dumps(POLICY))
    app, address = await started(
        settings(
            pki,
            tls_client_ca_file=str(pki.ca.file),
            policy_file=str(policy),
            allow_list_all_users="on",
        )
    )
    op_channel, operator = secure_stub(address, pki.security(pki.operator))
    tenant_channel, tenant = secure_stub(address, pki.security(pki.tenant_tool))
    try:
        async with op_channel, tenant_channel:
            for user in ("alice", "tenant-a:bob"):
                await operator.ResolveConversation(
                    pb.ResolveConversationRequest(
                        user_id=user, external_key="k", create_if_missing=True
                    )
                )
            across = pb.ListConversationsRequest(all_users=True)
            listed = await operator.ListConversations(across)
            assert len(listed.conversations) == 2
            # A read across users is audited (a read of one user's is not).
            await operator.ListConversations(pb.ListConversationsRequest(user_id="alice"))
            lines = [r for r in caplog.records if r.name == "agentstate.audit"]
            listings = [
                (r.audit_caller, r.audit_outcome)  # type: ignore[attr-defined]
                for r in lines
                if r.audit_rpc == "ListConversations"  # type: ignore[attr-defined]
            ]
            assert listings == [("operator", "ok")]
            # The tenant tool's rule covers its tenant's users, not every user.
            code, reason, message = await _try(tenant, "ListConversations", across)
            assert (code, reason) == (grpc.StatusCode.PERMISSION_DENIED, "PERMISSION_DENIED")
            assert "ListConversations" in message
            refused = [r for r in caplog.records if r.name == "agentstate.audit"][-1]
            assert refused.audit_outcome == "refused: PERMISSION_DENIED"  # type: ignore[attr-defined]
            # Its own tenant's user, asked by name, it may still list.
            code, _, _ = await _try(
                tenant,
                "ListConversations",
                pb.ListConversationsRequest(all_users=True, user_id="tenant-a:bob"),
            )
            assert code == grpc.StatusCode.OK
    finally:
        await app.stop()
