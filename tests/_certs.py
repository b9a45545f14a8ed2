"""Throwaway certificates for the security tests, made with the ``cryptography`` package: a
CA, a broker certificate for 127.0.0.1/localhost, and client certificates signed by the CA."""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID


@dataclass(frozen=True)
class Pki:
    ca: Path  # CA certificate (PEM): the clients' ssl.ca.location, the broker's truststore
    broker: Path  # broker key + certificate chain in one PEM: ssl.keystore.location
    directory: Path

    def client(self, name: str, *, ou: str = "eng") -> tuple[Path, Path]:
        """(certificate, key) for a client whose subject is CN=<name>,OU=<ou>,O=samsa."""
        return _client(self.directory, name, ou)


def _name(cn: str, ou: str | None = None) -> x509.Name:
    attrs = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, "samsa")]
    if ou:
        attrs.append(x509.NameAttribute(NameOID.ORGANIZATIONAL_UNIT_NAME, ou))
    attrs.append(x509.NameAttribute(NameOID.COMMON_NAME, cn))
    return x509.Name(attrs)


def _pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _sign(
    subject: x509.Name,
    key: ec.EllipticCurvePrivateKey,
    issuer: x509.Name,
    issuer_key: ec.EllipticCurvePrivateKey,
    *,
    ca: bool = False,
    sans: list[x509.GeneralName] | None = None,
) -> x509.Certificate:
    now = datetime.datetime.now(datetime.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )
    if sans:
        builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
    return builder.sign(issuer_key, hashes.SHA256())


_CA_KEY: dict[Path, ec.EllipticCurvePrivateKey] = {}


def make_pki(directory: Path) -> Pki:
    directory.mkdir(parents=True, exist_ok=True)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = _name("samsa test CA")
    ca_cert = _sign(ca_name, ca_key, ca_name, ca_key, ca=True)
    ca = directory / "ca.pem"
    ca.write_bytes(ca_cert.public_bytes(serialization.Encoding.PEM))
    key = ec.generate_private_key(ec.SECP256R1())
    sans: list[x509.GeneralName] = [
        x509.DNSName("localhost"),
        x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
    ]
    cert = _sign(_name("broker"), key, ca_name, ca_key, sans=sans)
    broker = directory / "broker.pem"
    broker.write_bytes(_pem_key(key) + cert.public_bytes(serialization.Encoding.PEM))
    _CA_KEY[directory] = ca_key
    return Pki(ca, broker, directory)


def _client(directory: Path, name: str, ou: str) -> tuple[Path, Path]:
    ca_key = _CA_KEY[directory]
    key = ec.generate_private_key(ec.SECP256R1())
    cert = _sign(_name(name, ou), key, _name("samsa test CA"), ca_key)
    cert_path, key_path = directory / f"{name}.crt", directory / f"{name}.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(_pem_key(key))
    return cert_path, key_path
