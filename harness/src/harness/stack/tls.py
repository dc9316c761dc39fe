"""The stack's own certificate authority: the certificates its TLS endpoints present and the one a
client presents to the broker.

Made once per stack directory (``$STACK_DIR/tls``) and made again when a certificate would expire
within a week: a CA, a server certificate for ``127.0.0.1`` and ``localhost`` (the broker's SASL_SSL
listener, the registry's HTTPS port) and a client certificate (``CN=<kafka user>``) for the broker,
which requires one on that listener. PEM files; the private keys are unencrypted PKCS#8, readable by
the owner only. Tests make certificates of their own (another CA, an expired certificate) with
:func:`issue`, and present them on a loopback port with :func:`serve`.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import ipaddress
import socket
import ssl
import tempfile
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

#: how long the stack's certificates are valid, and how close to the end they are made again
VALIDITY = dt.timedelta(days=365)
RENEW_BEFORE = dt.timedelta(days=7)


@dataclass(frozen=True)
class TlsFiles:
    """Where the stack's TLS material is."""

    directory: Path

    @property
    def ca(self) -> Path:
        """The CA certificate clients trust."""
        return self.directory / "ca.pem"

    @property
    def ca_key(self) -> Path:
        return self.directory / "ca-key.pem"

    @property
    def server(self) -> Path:
        """The servers' certificate chain and key in one file (what Kafka's PEM keystore reads)."""
        return self.directory / "server.pem"

    @property
    def server_cert(self) -> Path:
        return self.directory / "server-cert.pem"

    @property
    def server_key(self) -> Path:
        return self.directory / "server-key.pem"

    @property
    def client(self) -> Path:
        """The client's certificate and key in one file."""
        return self.directory / "client.pem"


@dataclass(frozen=True)
class Issued:
    """A certificate and its private key, as PEM."""

    cert: bytes
    key: bytes

    @property
    def bundle(self) -> bytes:
        """Certificate and key in one PEM file."""
        return self.cert + self.key


def issue(common_name: str, *, ca: Issued | None = None, hosts: tuple[str, ...] = (), client: bool = False,
          not_before: dt.datetime | None = None, validity: dt.timedelta = VALIDITY) -> Issued:
    """A certificate for ``common_name``, signed by ``ca`` (none: a self-signed CA).

    Args:
        hosts: the DNS names and IP addresses it is valid for (a server's).
        client: for a client's authentication rather than a server's.
        not_before: when it starts being valid (default: an hour ago); with ``validity``, a test
            makes an expired one.
    """
    key = ec.generate_private_key(ec.SECP256R1())
    start = not_before or dt.datetime.now(dt.UTC) - dt.timedelta(hours=1)
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    if ca is None:
        issuer, signing_key = subject, key
    else:
        ca_cert = x509.load_pem_x509_certificate(ca.cert)
        issuer = ca_cert.subject
        signing_key = serialization.load_pem_private_key(ca.key, password=None)  # type: ignore[assignment]
    builder = (x509.CertificateBuilder().subject_name(subject).issuer_name(issuer).public_key(key.public_key())
               .serial_number(x509.random_serial_number()).not_valid_before(start)
               .not_valid_after(start + validity)
               .add_extension(x509.BasicConstraints(ca=ca is None, path_length=None), critical=True))
    if ca is None:
        builder = builder.add_extension(x509.KeyUsage(
            digital_signature=True, key_cert_sign=True, crl_sign=True, content_commitment=False,
            key_encipherment=False, data_encipherment=False, key_agreement=False, encipher_only=False,
            decipher_only=False), critical=True)
    else:
        names: list[x509.GeneralName] = []
        for host in hosts:
            try:
                names.append(x509.IPAddress(ipaddress.ip_address(host)))
            except ValueError:
                names.append(x509.DNSName(host))
        if names:
            builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
        usage = ExtendedKeyUsageOID.CLIENT_AUTH if client else ExtendedKeyUsageOID.SERVER_AUTH
        builder = builder.add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
    cert = builder.sign(signing_key, hashes.SHA256())
    return Issued(cert.public_bytes(serialization.Encoding.PEM),
                  key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                    serialization.NoEncryption()))


def ensure(directory: Path, client_name: str) -> TlsFiles:
    """The stack's CA and certificates under ``directory``, made if missing or about to expire."""
    files = TlsFiles(directory)
    if _valid(files.server_cert) and _valid(files.client) and _valid(files.ca):
        return files
    directory.mkdir(parents=True, exist_ok=True)
    ca = issue("cdc-lakehouse stack CA", validity=VALIDITY * 2)
    server = issue("127.0.0.1", ca=ca, hosts=("127.0.0.1", "localhost"))
    client = issue(client_name, ca=ca, client=True)
    for path, data in ((files.ca, ca.cert), (files.ca_key, ca.key), (files.server_cert, server.cert + ca.cert),
                       (files.server_key, server.key), (files.server, server.cert + ca.cert + server.key),
                       (files.client, client.bundle)):
        path.write_bytes(data)
        path.chmod(0o644 if path in (files.ca, files.server_cert) else 0o600)
    return files


def _valid(path: Path) -> bool:
    if not path.exists():
        return False
    cert = x509.load_pem_x509_certificate(path.read_bytes())
    return cert.not_valid_after_utc - dt.datetime.now(dt.UTC) > RENEW_BEFORE


@contextlib.contextmanager
def serve(cert: Issued) -> Iterator[str]:
    """A TLS endpoint on loopback presenting ``cert``: it completes handshakes and says nothing else,
    so a client learns what it thinks of the certificate. Yields ``host:port``."""
    with tempfile.TemporaryDirectory() as scratch:
        pem = Path(scratch) / "server.pem"
        pem.write_bytes(cert.bundle)
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(pem)
    listener = socket.create_server(("127.0.0.1", 0))

    def accept() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:  # closed
                return
            with contextlib.suppress(OSError):
                context.wrap_socket(conn, server_side=True).close()
            conn.close()

    threading.Thread(target=accept, daemon=True).start()
    try:
        yield f"127.0.0.1:{listener.getsockname()[1]}"
    finally:
        listener.close()
