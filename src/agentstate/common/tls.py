"""TLS for the gRPC servers: certificate and key from files, reloaded when they change.

gRPC asks `_CertificateFiles.fetch` for a new configuration at every TLS handshake; it
answers None (keep the current one) unless a file's modification time or size changed,
so a renewed certificate (cert-manager writes the Secret, the kubelet swaps the mounted
files) serves new connections at once, without a restart; connections already open keep
theirs. A half-written pair (the key replaced, the certificate not yet) fails to load: the
old pair stays in use and the next handshake tries again.

gRPC's TLS stack negotiates TLS 1.2 or 1.3 only (tests/common/test_tls.py). With a
client CA, every client must present a certificate that CA signed (mTLS); the caller's
identity is then its certificate (agentstate.state_service.policy).
"""

from __future__ import annotations

import logging
import os
import ssl
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from agentstate.common.config import ConfigError

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ServerTls:
    """Where a server's certificate, key and (for mTLS) client CA are; `prefix` is the
    settings' prefix (STATE, AGENT, CONSOLE), for messages."""

    cert_file: str
    key_file: str
    client_ca_file: str = ""
    prefix: str = "STATE"

    @property
    def mutual(self) -> bool:
        return bool(self.client_ca_file)

    def files(self) -> list[tuple[str, str]]:
        named = [
            (f"{self.prefix}_TLS_CERT_FILE", self.cert_file),
            (f"{self.prefix}_TLS_KEY_FILE", self.key_file),
        ]
        if self.client_ca_file:
            named.append((f"{self.prefix}_TLS_CLIENT_CA_FILE", self.client_ca_file))
        return named


def server_tls(prefix: str, cert_file: str, key_file: str, client_ca_file: str) -> ServerTls | None:
    """The TLS a service's settings ask for, None for plaintext; ConfigError when they are
    incomplete (a key without a certificate, a client CA without either)."""
    if not (cert_file or key_file or client_ca_file):
        return None
    if not (cert_file and key_file):
        raise ConfigError(
            f"{prefix}_TLS_CERT_FILE and {prefix}_TLS_KEY_FILE go together: set both to "
            "serve TLS (a client CA alone is not enough), or neither for plaintext"
        )
    return ServerTls(cert_file, key_file, client_ca_file, prefix)


def _signature(paths: list[str]) -> tuple[tuple[int, int], ...]:
    out = []
    for path in paths:
        st = os.stat(path)  # follows the symlinks a mounted Secret is made of
        out.append((st.st_mtime_ns, st.st_size))
    return tuple(out)


class _CertificateFiles:
    def __init__(self, tls: ServerTls) -> None:
        self.tls = tls
        self._lock = threading.Lock()  # handshakes may come from several gRPC threads
        self._paths = [path for _, path in tls.files()]
        self._loaded = _signature(self._paths)
        self.initial = self._configuration()
        self.reloads = 0

    def _configuration(self) -> grpc.ServerCertificateConfiguration:
        key = Path(self.tls.key_file).read_bytes()
        chain = Path(self.tls.cert_file).read_bytes()
        if b"PRIVATE KEY" not in key or b"CERTIFICATE" not in chain:
            raise ValueError("not a PEM private key and certificate")
        _check_pair(key, chain)
        roots = Path(self.tls.client_ca_file).read_bytes() if self.tls.mutual else None
        return grpc.ssl_server_certificate_configuration([(key, chain)], roots)

    def fetch(self) -> grpc.ServerCertificateConfiguration | None:
        with self._lock:
            try:
                now = _signature(self._paths)
                if now == self._loaded:
                    return None
                configuration = self._configuration()
            except (OSError, ValueError) as exc:
                log.warning(
                    "TLS files changed but cannot be loaded (%s); serving the previous "
                    "certificate until they can",
                    exc,
                )
                return None
            self._loaded = now
            self.reloads += 1
            log.info("TLS certificate reloaded from %s", self.tls.cert_file)
            return configuration


def _check_pair(key: bytes, chain: bytes) -> None:
    """ValueError unless the key is the certificate's (gRPC would only fail handshakes)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import serialization

    private = serialization.load_pem_private_key(key, password=None)
    certificate = x509.load_pem_x509_certificate(chain)
    spki = serialization.PublicFormat.SubjectPublicKeyInfo
    pem = serialization.Encoding.PEM
    if private.public_key().public_bytes(pem, spki) != certificate.public_key().public_bytes(
        pem, spki
    ):
        raise ValueError("the private key does not belong to the certificate")


def server_credentials(tls: ServerTls) -> grpc.ServerCredentials:
    """Credentials that reload the files when they change; ConfigError naming the
    variable when they cannot be read at start-up."""
    for name, path in tls.files():
        if not os.path.isfile(path):
            raise ConfigError(f"{name}={path!r} cannot be read: no such file")
    try:
        files = _CertificateFiles(tls)
    except (OSError, ValueError) as exc:
        names = " and ".join(name for name, _ in tls.files())
        raise ConfigError(f"{names}: cannot be used for TLS: {exc}") from None
    # grpc's stubs say the fetcher returns a configuration; None ("no change") is what
    # its documentation asks for when nothing changed.
    fetch: Any = files.fetch
    return grpc.dynamic_ssl_server_credentials(
        files.initial, fetch, require_client_authentication=tls.mutual
    )


class _HttpsFiles:
    """The console's TLS: an ssl.SSLContext whose handshake callback (called for every
    ClientHello, with or without SNI) swaps in a context built from the files whenever
    they changed since the last one was built."""

    def __init__(self, tls: ServerTls) -> None:
        self.tls = tls
        self._lock = threading.Lock()
        self._paths = [path for _, path in tls.files()]
        self._loaded = _signature(self._paths)
        self.current = self._context()
        self.base = self._context()
        self.base.sni_callback = self._pick

    def _context(self) -> ssl.SSLContext:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        context.load_cert_chain(self.tls.cert_file, self.tls.key_file)
        if self.tls.mutual:
            context.load_verify_locations(self.tls.client_ca_file)
            context.verify_mode = ssl.CERT_REQUIRED
        return context

    def _pick(self, sock: ssl.SSLObject, name: str | None, _: ssl.SSLContext) -> None:
        with self._lock:
            try:
                now = _signature(self._paths)
                if now != self._loaded:
                    self.current = self._context()
                    self._loaded = now
                    log.info("TLS certificate reloaded from %s", self.tls.cert_file)
            except (OSError, ssl.SSLError, ValueError) as exc:
                log.warning(
                    "TLS files changed but cannot be loaded (%s); serving the previous "
                    "certificate until they can",
                    exc,
                )
            sock.context = self.current


def https_context(tls: ServerTls) -> ssl.SSLContext:
    """An HTTPS server context (TLS 1.2+, mTLS with a client CA) that serves the files'
    current pair to each new connection; ConfigError naming the variables at start-up."""
    for name, path in tls.files():
        if not os.path.isfile(path):
            raise ConfigError(f"{name}={path!r} cannot be read: no such file")
    try:
        return _HttpsFiles(tls).base
    except (OSError, ssl.SSLError, ValueError) as exc:
        names = " and ".join(name for name, _ in tls.files())
        raise ConfigError(f"{names}: cannot be used for TLS: {exc}") from None
