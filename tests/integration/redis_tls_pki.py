"""A throwaway PKI for the Redis TLS tests (test_redis_tls*.py), made with `cryptography`: a CA
that signs the server and client certificates, and another CA that nobody trusts. The `pki`
fixture (tests/integration/conftest.py) builds one per test module."""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

LOOPBACK = "127.0.0.1"


@dataclass(frozen=True)
class Issuer:
    """A CA: its key signs leaf certificates; `cert_file` is what a verifier trusts."""

    key: ec.EllipticCurvePrivateKey
    cert: x509.Certificate
    cert_file: Path


@dataclass(frozen=True)
class Leaf:
    cert_file: Path
    key_file: Path


@dataclass(frozen=True)
class Pki:
    ca: Issuer
    other_ca: Issuer  # trusted by nobody here: "the wrong CA"
    server: Leaf  # for 127.0.0.1 (IP SAN), signed by `ca`
    wrong_host: Leaf  # signed by `ca`, but for 127.0.0.2 only
    client: Leaf  # signed by `ca`, client-auth usage


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _validity(builder: x509.CertificateBuilder) -> x509.CertificateBuilder:
    now = datetime.datetime.now(datetime.UTC)
    return builder.not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(
        now + datetime.timedelta(days=1)
    )


def _write(path: Path, cert: x509.Certificate, key: ec.EllipticCurvePrivateKey | None) -> Path:
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    if key is not None:
        key_pem = key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
        path.with_suffix(".key").write_bytes(key_pem)
    return path


def make_ca(directory: Path, common_name: str) -> Issuer:
    key = ec.generate_private_key(ec.SECP256R1())
    builder = (
        _validity(x509.CertificateBuilder())
        .subject_name(_name(common_name))
        .issuer_name(_name(common_name))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True, content_commitment=False, key_encipherment=False,
                data_encipherment=False, key_agreement=False, key_cert_sign=True,
                crl_sign=True, encipher_only=False, decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), False)
    )  # fmt: skip
    cert = builder.sign(key, hashes.SHA256())
    return Issuer(key, cert, _write(directory / f"{common_name}.pem", cert, None))


def issue(issuer: Issuer, directory: Path, common_name: str, *, ips: tuple[str, ...] = ()) -> Leaf:
    """A leaf signed by `issuer`: a server certificate for `ips`, or a client one without."""
    key = ec.generate_private_key(ec.SECP256R1())
    usage = ExtendedKeyUsageOID.SERVER_AUTH if ips else ExtendedKeyUsageOID.CLIENT_AUTH
    builder = (
        _validity(x509.CertificateBuilder())
        .subject_name(_name(common_name))
        .issuer_name(issuer.cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(issuer.key.public_key()), False
        )
    )
    if ips:
        names = [x509.IPAddress(ipaddress.ip_address(ip)) for ip in ips]
        builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
    cert_file = _write(
        directory / f"{common_name}.pem", builder.sign(issuer.key, hashes.SHA256()), key
    )
    return Leaf(cert_file, cert_file.with_suffix(".key"))
