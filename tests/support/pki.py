"""A throw-away certificate authority for TLS tests: made fresh by each test, loopback names only.

``TestCA(folder)`` writes ``ca.pem``; ``issue(name)`` writes ``<name>.pem`` and ``<name>-key.pem``,
a certificate the CA signed for ``localhost`` and ``127.0.0.1`` (server) or for a client
(``client=True``). Keys are P-256: quick to make, and every TLS stack here speaks them.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

LOOPBACK_NAMES = ("localhost", "127.0.0.1")


@dataclass(frozen=True)
class Issued:
    """A certificate and its key, as PEM files, and the certificate of the CA that signed it."""

    cert: Path
    key: Path
    ca: Path


class TestCA:
    """A self-signed CA in ``folder``; ``cert`` is its certificate (what clients trust)."""

    __test__ = False  # not a pytest class

    def __init__(self, folder: Path, name: str = "busscrape test CA") -> None:
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        self._key = ec.generate_private_key(ec.SECP256R1())
        self._name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
        now = _now()
        certificate = (
            x509.CertificateBuilder()
            .subject_name(self._name)
            .issuer_name(self._name)
            .public_key(self._key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + dt.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                         content_commitment=False, key_encipherment=False,
                                         data_encipherment=False, key_agreement=False,
                                         encipher_only=False, decipher_only=False), critical=True)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(self._key.public_key()), critical=False)
            .sign(self._key, hashes.SHA256())
        )
        self._certificate = certificate
        self.cert = self.folder / "ca.pem"
        self.cert.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))

    def issue(self, name: str, *, client: bool = False, hosts: tuple[str, ...] = LOOPBACK_NAMES) -> Issued:
        """A leaf certificate for ``hosts`` (server) or a client, signed by this CA."""
        key = ec.generate_private_key(ec.SECP256R1())
        now = _now()
        usage = ExtendedKeyUsageOID.CLIENT_AUTH if client else ExtendedKeyUsageOID.SERVER_AUTH
        builder = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
            .issuer_name(self._name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + dt.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(self._key.public_key()),
                           critical=False)
        )
        if not client:
            builder = builder.add_extension(x509.SubjectAlternativeName([_general_name(h) for h in hosts]),
                                            critical=False)
        certificate = builder.sign(self._key, hashes.SHA256())
        issued = Issued(self.folder / f"{name}.pem", self.folder / f"{name}-key.pem", self.cert)
        issued.cert.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
        issued.key.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                                 serialization.NoEncryption()))
        issued.key.chmod(0o600)
        return issued


def _general_name(host: str) -> x509.GeneralName:
    try:
        return x509.IPAddress(ipaddress.ip_address(host))
    except ValueError:
        return x509.DNSName(host)


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)
