"""Real X.509 certificates for the TLS tests: a CA, server certificates for 127.0.0.1 and
localhost, client certificates with a SPIFFE ID or only a common name. Written as PEM
files into a test's temporary directory."""

from __future__ import annotations

import datetime as dt
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID


@dataclass(frozen=True)
class Pair:
    cert: Path
    key: Path


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


class CertificateAuthority:
    def __init__(self, directory: Path, name: str = "agentstate test CA") -> None:
        self.directory = directory
        directory.mkdir(parents=True, exist_ok=True)
        self.name = name
        self._key = ec.generate_private_key(ec.SECP256R1())
        now = dt.datetime.now(dt.UTC)
        self._cert = (
            x509.CertificateBuilder()
            .subject_name(_name(name))
            .issuer_name(_name(name))
            .public_key(self._key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + dt.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(self._key, hashes.SHA256())
        )
        self.file = directory / f"{name.replace(' ', '-')}.pem"
        self.file.write_bytes(self._cert.public_bytes(serialization.Encoding.PEM))

    def issue(
        self,
        stem: str,
        cn: str,
        *,
        server: bool = False,
        client: bool = False,
        spiffe: str = "",
        into: Path | None = None,
    ) -> Pair:
        """A certificate and key signed by this CA, written to `into` (default the CA's
        directory) as STEM.pem and STEM.key."""
        key = ec.generate_private_key(ec.SECP256R1())
        now = dt.datetime.now(dt.UTC)
        names: list[x509.GeneralName] = []
        if server:
            names += [
                x509.DNSName("localhost"),
                x509.DNSName("state.agentstate.svc"),
                x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
            ]
        if spiffe:
            names.append(x509.UniformResourceIdentifier(spiffe))
        builder = (
            x509.CertificateBuilder()
            .subject_name(_name(cn))
            .issuer_name(self._cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + dt.timedelta(days=1))
            .add_extension(
                x509.ExtendedKeyUsage(
                    [ExtendedKeyUsageOID.SERVER_AUTH]
                    if server and not client
                    else [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
                    if server
                    else [ExtendedKeyUsageOID.CLIENT_AUTH]
                ),
                critical=False,
            )
        )
        if names:
            builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
        cert = builder.sign(self._key, hashes.SHA256())
        where = into or self.directory
        where.mkdir(parents=True, exist_ok=True)
        pair = Pair(where / f"{stem}.pem", where / f"{stem}.key")
        pair.key.write_bytes(_key_pem(key))
        pair.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        return pair
