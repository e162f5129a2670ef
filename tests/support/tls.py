"""Certificates and web configuration files for the TLS and basic-auth tests, made at test
time (in tmp_path) with the `cryptography` package: a CA, a server certificate for loopback
signed by it, a client certificate it signed and one it did not. No private key is kept in
the repository."""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import bcrypt
import pytest
import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

CLIENT_SAN = "scraper.monitoring.svc"


@dataclass(frozen=True)
class Pki:
    """PEM files in one folder: ca.pem, server.pem/server-key.pem, client.pem/client-key.pem
    (signed by the CA, SAN `CLIENT_SAN`), stranger.pem/stranger-key.pem (self-signed)."""

    folder: Path

    def __getattr__(self, name: str) -> Path:  # pki.ca, pki.server_key, ...
        return self.folder / (name.replace("_", "-") + ".pem")


def make_pki(folder: Path) -> Pki:
    folder.mkdir(parents=True, exist_ok=True)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = _certificate("gpuscope test CA", ca_key, ca_key, None, is_ca=True)
    _write(folder, "ca", ca, ca_key)
    server_key = ec.generate_private_key(ec.SECP256R1())
    sans: list[x509.GeneralName] = [
        x509.DNSName("localhost"),
        x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
        x509.IPAddress(ipaddress.ip_address("::1")),
    ]
    server = _certificate("localhost", server_key, ca_key, ca, sans=sans, server=True)
    _write(folder, "server", server, server_key)
    client_key = ec.generate_private_key(ec.SECP256R1())
    client = _certificate(
        "scraper", client_key, ca_key, ca, sans=[x509.DNSName(CLIENT_SAN)], server=False
    )
    _write(folder, "client", client, client_key)
    stranger_key = ec.generate_private_key(ec.SECP256R1())
    stranger = _certificate(
        "stranger", stranger_key, stranger_key, None, sans=[x509.DNSName(CLIENT_SAN)]
    )
    _write(folder, "stranger", stranger, stranger_key)
    return Pki(folder)


def _certificate(
    name: str,
    key: ec.EllipticCurvePrivateKey,
    issuer_key: ec.EllipticCurvePrivateKey,
    issuer: x509.Certificate | None,
    *,
    is_ca: bool = False,
    sans: list[x509.GeneralName] | None = None,
    server: bool | None = None,
) -> x509.Certificate:
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = datetime.datetime.now(datetime.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer.subject if issuer is not None else subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=2))
        .add_extension(x509.BasicConstraints(ca=is_ca, path_length=None), critical=True)
    )
    if is_ca:
        builder = builder.add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        builder = builder.add_extension(
            x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False
        )
    if issuer is not None:
        builder = builder.add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(issuer_key.public_key()),
            critical=False,
        )
    if sans:
        builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
    if server is not None:
        usage = ExtendedKeyUsageOID.SERVER_AUTH if server else ExtendedKeyUsageOID.CLIENT_AUTH
        builder = builder.add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
    return builder.sign(issuer_key, hashes.SHA256())


def _write(
    folder: Path, name: str, cert: x509.Certificate, key: ec.EllipticCurvePrivateKey
) -> None:
    (folder / f"{name}.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path = folder / f"{name}-key.pem"
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    key_path.chmod(0o600)


def bcrypt_hash(password: str, cost: int = 4) -> str:
    """A hash as `htpasswd -nBC COST` makes it; cost 4 (the least) keeps tests quick."""
    return bcrypt.hashpw(password.encode(), bcrypt.gensalt(cost)).decode()


def write_web_config(path: Path, config: dict[str, Any]) -> Path:
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def count_bcrypt_checks(monkeypatch: pytest.MonkeyPatch) -> list[bytes]:
    """The passwords the agent checks with bcrypt from now on, in order (the check still
    runs): how a test sees that a remembered login costs no bcrypt."""
    import gpuscope.agent.serve.web_config as web_config

    calls: list[bytes] = []
    real = web_config._checkpw

    def counting(password: bytes, hashed: bytes) -> bool:
        calls.append(password)
        return real(password, hashed)

    monkeypatch.setattr(web_config, "_checkpw", counting)
    return calls
