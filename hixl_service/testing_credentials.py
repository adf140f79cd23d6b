"""Real credentials made at run time, for tests and hixl-bench: a CA and
certificates (``cryptography``), token files, and the ``[security]``
settings of a daemon that uses them. Nothing of the daemon imports it."""

from __future__ import annotations

import datetime
import ipaddress
import os
import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

__all__ = ["CertificateAuthority", "Issued", "mtls_settings", "token_settings", "write_token"]

_VALID = datetime.timedelta(days=1)


def _pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


@dataclass(frozen=True)
class Issued:
    """A certificate and its key, written as PEM files."""

    cert: Path
    key: Path
    ca: Path


class CertificateAuthority:
    """A throw-away CA in ``directory`` that issues daemon certificates."""

    def __init__(self, directory: Path, name: str = "hixl test CA") -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self.directory = directory
        self._key = ec.generate_private_key(ec.SECP256R1())
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
        now = datetime.datetime.now(datetime.timezone.utc)
        self._cert = (
            x509.CertificateBuilder().subject_name(subject).issuer_name(subject)
            .public_key(self._key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + _VALID)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True,
                                         crl_sign=True, content_commitment=False,
                                         key_encipherment=False, data_encipherment=False,
                                         key_agreement=False, encipher_only=False,
                                         decipher_only=False), critical=True)
            .sign(self._key, hashes.SHA256()))
        self.ca_path = directory / "ca.pem"
        self.ca_path.write_bytes(self._cert.public_bytes(serialization.Encoding.PEM))

    def issue(self, name: str, *, spiffe: str | None = None, dns: tuple[str, ...] = ("localhost",),
              ips: tuple[str, ...] = ("127.0.0.1",)) -> Issued:
        """A certificate for ``name`` (its CN), usable as TLS server and client."""
        key = ec.generate_private_key(ec.SECP256R1())
        names: list[x509.GeneralName] = []
        if spiffe is not None:
            names.append(x509.UniformResourceIdentifier(spiffe))
        names += [x509.DNSName(d) for d in dns]
        names += [x509.IPAddress(ipaddress.ip_address(ip)) for ip in ips]
        now = datetime.datetime.now(datetime.timezone.utc)
        builder = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
            .issuer_name(self._cert.subject).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + _VALID)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH,
                                                  x509.oid.ExtendedKeyUsageOID.CLIENT_AUTH]),
                           critical=False))
        if names:
            builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
        cert = builder.sign(self._key, hashes.SHA256())
        cert_path = self.directory / f"{name}.pem"
        key_path = self.directory / f"{name}.key"
        cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        key_path.write_bytes(_pem_key(key))
        os.chmod(key_path, 0o600)
        return Issued(cert_path, key_path, self.ca_path)


def write_token(path: Path, secret: str | None = None, mode: int = 0o600) -> Path:
    """A token file holding ``secret`` (a fresh one by default)."""
    path.write_text((secret or secrets.token_hex(32)) + "\n")
    os.chmod(path, mode)
    return path


def token_settings(token_file: Path, **extra: Any) -> dict[str, Any]:
    return {"mode": "token", "token_file": str(token_file), **extra}


def mtls_settings(issued: Issued, **extra: Any) -> dict[str, Any]:
    return {"mode": "mtls", "tls_cert": str(issued.cert), "tls_key": str(issued.key),
            "tls_ca": str(issued.ca), **extra}
