"""Why a TLS connection failed, in the words a person acts on.

librdkafka says only "certificate verify failed: broker certificate could not be verified" whatever
the reason; Python's ``ssl`` module knows it (an unknown CA, an expired certificate, a name the
certificate does not cover). :func:`diagnose` makes one handshake of its own with the same trust
and client certificate to learn it; :func:`verify_failure` finds it in an error a client raised.
"""

from __future__ import annotations

import base64
import re
import socket
import ssl
from typing import TYPE_CHECKING, Final

from ingest.errors import ConfigError

if TYPE_CHECKING:
    from ingest.config.source import TlsSpec

#: the DER of PBES2's object identifier (RFC 8018): how OpenSSL and most tools encrypt a PKCS#8 key
_PBES2: Final = bytes.fromhex("06092a864886f70d01050d")
_ENCRYPTED_KEY: Final = re.compile(r"-----BEGIN ENCRYPTED PRIVATE KEY-----(.+?)-----END ENCRYPTED PRIVATE KEY-----",
                                   re.DOTALL)
#: what the Kafka clients' error text holds when the TLS handshake failed
TLS_MARKERS = ("SSL handshake failed", "certificate verify failed", "SSL routines", "_SSL:")


def is_tls_failure(text: str) -> bool:
    """Whether a client's error text says its TLS handshake failed."""
    return any(marker in text for marker in TLS_MARKERS)


def diagnose(address: str, tls: TlsSpec | None, key_password: str | None = None, *,
             timeout: float = 5.0) -> str | None:
    """The reason a TLS handshake with ``address`` (``host:port``) fails under ``tls``; ``None`` when
    it succeeds, or when the server cannot be reached at all (then that is the cause, not TLS)."""
    host, _, port = address.strip().rpartition(":")
    context = ssl.create_default_context(cafile=str(tls.ca_file) if tls is not None and tls.ca_file else None)
    try:
        if tls is not None and tls.cert_file is not None:
            context.load_cert_chain(tls.cert_file, tls.key_file or tls.cert_file, key_password)
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout) as raw, \
                context.wrap_socket(raw, server_hostname=host.strip("[]")) as secured:
            secured.do_handshake()
    except ssl.SSLError as exc:
        return _reason(exc)
    except (OSError, ValueError):
        return None
    return None


def verify_failure(exc: BaseException) -> str | None:
    """The certificate verification failure among ``exc``'s causes, as "certificate verify failed:
    <reason>" (``None``: it is not one)."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, ssl.SSLError):
            return _reason(current)
        current = current.__cause__ or current.__context__
    return None


def check_java_key(tls: TlsSpec) -> None:
    """Refuse, before Spark starts, a client key that Spark's Kafka source cannot read.

    The Java client decrypts a PEM key with the JDK's own algorithms, and the JDK has none for
    PBES2 (``NoSuchAlgorithmException: PBES2 SecretKeyFactory not available``, deep in the query's
    failure); librdkafka and Python read it.

    Raises:
        ConfigError: the key is encrypted with PBES2.
    """
    if tls.cert_file is None:
        return
    path = tls.key_file or tls.cert_file
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return  # missing or unreadable: the client says so itself
    for block in _ENCRYPTED_KEY.findall(text):
        if _PBES2 in base64.b64decode("".join(block.split())):
            raise ConfigError(
                f"source.kafka.tls: the key in {path} is encrypted with PBES2, which Spark's Kafka source (the "
                "Java client) cannot decrypt: re-encrypt it with `openssl pkcs8 -topk8 -v1 PBE-SHA1-3DES`, keep "
                "it unencrypted (readable by the service only), or use kafka.reader: python")


def _reason(exc: ssl.SSLError) -> str:
    """What a failed handshake says: the verification's own words, or the TLS reason code in words."""
    if isinstance(exc, ssl.SSLCertVerificationError):
        return f"certificate verify failed: {(exc.verify_message or str(exc)).rstrip('.')}"
    return str(exc.reason or exc).lower().replace("_", " ")
