"""`agentstate-state health`: ask the running service's grpc.health whether it serves,
over the same transport its clients use. Kubernetes' own gRPC probe speaks plaintext only,
so a state service serving TLS is probed with this command (an exec probe,
k8s/overlays/central-tls).

It connects to STATE_LISTEN_ADDRESS (0.0.0.0 and :: become loopback), over TLS when
STATE_TLS_CERT_FILE is set: the server's certificate is checked against `ca_file` for
`server_name`, and with STATE_TLS_CLIENT_CA_FILE the probe presents the service's own
certificate as its client certificate (issue it for both server and client auth). Exit 0
when SERVING, 1 otherwise (NOT_SERVING, unreachable, a failed handshake)."""

from __future__ import annotations

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from agentstate.client.tls import ChannelSecurity
from agentstate.common.config import ConfigError
from agentstate.state_service.config import StateServiceSettings

SERVICE = "agentstate.state.v1.StateService"


def probe_address(listen_address: str) -> str:
    host, _, port = listen_address.rpartition(":")
    if host in ("0.0.0.0", "[::]", "::", ""):
        return f"127.0.0.1:{port}"
    return listen_address


def check(
    settings: StateServiceSettings, ca_file: str, server_name: str, timeout: float = 3.0
) -> tuple[bool, str]:
    """(serving, what was seen)."""
    address = probe_address(settings.listen_address)
    if settings.tls_cert_file:
        if not ca_file:
            raise ConfigError("health: a TLS state service needs --ca-file to check it")
        mutual = bool(settings.tls_client_ca_file)
        security = ChannelSecurity(
            ca_file=ca_file,
            cert_file=settings.tls_cert_file if mutual else "",
            key_file=settings.tls_key_file if mutual else "",
            server_name=server_name,
        )
        try:
            credentials = security.credentials()
        except ValueError as exc:
            raise ConfigError(f"health: {exc}") from None
        assert credentials is not None
        channel = grpc.secure_channel(address, credentials, options=security.options())
    else:
        channel = grpc.insecure_channel(address)
    with channel:
        try:
            answer = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service=SERVICE), timeout=timeout
            )
        except grpc.RpcError as exc:
            return False, f"{exc.code().name}: {exc.details()}"
    status = health_pb2.HealthCheckResponse.ServingStatus.Name(answer.status)
    return answer.status == health_pb2.HealthCheckResponse.SERVING, status
