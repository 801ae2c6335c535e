"""How a channel reaches a server that serves TLS: trust, a client certificate (mTLS), the
name to check, and a service token.

`ChannelSecurity()` (nothing set) is plaintext: the sidecar on loopback or a unix socket.
Any file, or `tls=True`, makes the channel TLS: the server's certificate is checked
against `ca_file` (the system's roots when empty) for the address's host name, or for
`server_name` when the address is an IP or a Service name the certificate does not carry.
`cert_file` and `key_file` present a client certificate (the server's
STATE_TLS_CLIENT_CA_FILE must trust its CA). `token_file` holds a service token sent as
`authorization: Bearer` on every call; the file is read again when it changes (a
Kubernetes projected token is rotated in place). gRPC sends such a token over TLS only.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc


@dataclass(frozen=True, kw_only=True)
class ChannelSecurity:
    tls: bool = False
    ca_file: str = ""
    cert_file: str = ""
    key_file: str = ""
    server_name: str = ""
    token_file: str = ""

    def __post_init__(self) -> None:
        if bool(self.cert_file) != bool(self.key_file):
            raise ValueError(
                "a client certificate needs both its certificate and its key file "
                f"(cert_file={self.cert_file!r}, key_file={self.key_file!r})"
            )
        if self.token_file and not self.uses_tls:
            raise ValueError(
                "a service token is sent over TLS only: set tls (or a CA file) as well"
            )

    @property
    def uses_tls(self) -> bool:
        return self.tls or bool(self.ca_file or self.cert_file or self.server_name)

    def credentials(self) -> grpc.ChannelCredentials | None:
        """None for plaintext; ValueError naming a file that cannot be read."""
        if not self.uses_tls:
            return None
        ssl = grpc.ssl_channel_credentials(
            root_certificates=_read(self.ca_file, "CA") if self.ca_file else None,
            private_key=_read(self.key_file, "client key") if self.key_file else None,
            certificate_chain=_read(self.cert_file, "client certificate")
            if self.cert_file
            else None,
        )
        if not self.token_file:
            return ssl
        token = grpc.metadata_call_credentials(_TokenFile(self.token_file))
        return grpc.composite_channel_credentials(ssl, token)

    def options(self) -> list[tuple[str, str]]:
        if self.uses_tls and self.server_name:
            return [("grpc.ssl_target_name_override", self.server_name)]
        return []


def _read(path: str, what: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise ValueError(f"the {what} file {path!r} cannot be read: {exc}") from None


class _TokenFile(grpc.AuthMetadataPlugin):
    """`authorization: Bearer <the file's contents>`, read again when the file changes."""

    def __init__(self, path: str) -> None:
        self._path = path
        self._lock = threading.Lock()
        self._seen: tuple[int, int] | None = None
        self._token = ""
        try:
            self._load()  # a missing file fails at connect time, not on the first call
        except OSError as exc:
            raise ValueError(f"the service token file {path!r} cannot be read: {exc}") from None

    def _load(self) -> str:
        with self._lock:
            st = os.stat(self._path)
            seen = (st.st_mtime_ns, st.st_size)
            if seen != self._seen:
                self._token = Path(self._path).read_text().strip()
                self._seen = seen
            return self._token

    def __call__(self, context: Any, callback: Any) -> None:
        try:
            token = self._load()
        except OSError as exc:
            callback((), exc)
            return
        callback((("authorization", f"Bearer {token}"),), None)
