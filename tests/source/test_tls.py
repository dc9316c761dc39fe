"""TLS settings and TLS failures, without the stack (issue 43, point 4).

The settings each client gets from ``source.*.tls``; and what a person reads when a certificate does
not verify: librdkafka (the admin client) and the registry client each meet a real TLS endpoint on
loopback that presents a certificate from an unknown CA, an expired one, or one for another name,
and each failure is one line naming the endpoint and the reason. The real broker and registry over
TLS: tests/stack/test_security.py.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest
import yaml
from cryptography.hazmat.primitives import serialization
from harness.stack.tls import Issued, issue, serve

from ingest.config import KafkaSpec, TlsSpec, load_config
from ingest.decode.registry import ConfluentSchemaRegistry
from ingest.errors import ConfigError, RegistryUnavailableError, SourceUnavailableError
from ingest.source.kafka_admin import KafkaAdmin, admin_config
from ingest.tls import check_java_key, diagnose


@pytest.fixture(scope="module")
def ca() -> Issued:
    return issue("test CA")


@pytest.fixture
def ca_file(ca: Issued, tmp_path: Path) -> Path:
    path = tmp_path / "ca.pem"
    path.write_bytes(ca.cert)
    return path


def test_each_client_gets_the_same_trust_and_certificate(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CDC_INGEST_TLS_KEY_PASSWORD", "k3y-pass")
    tls = TlsSpec(ca_file=Path("/certs/ca.pem"), cert_file=Path("/certs/client.pem"))
    spec = KafkaSpec(bootstrap_servers="b:9093", options={"kafka.security.protocol": "SSL"}, tls=tls)
    conf = admin_config(spec, None)
    assert {k: conf[k] for k in conf if k.startswith("ssl.")} == {
        "ssl.ca.location": "/certs/ca.pem", "ssl.certificate.location": "/certs/client.pem",
        "ssl.key.location": "/certs/client.pem", "ssl.key.password": "k3y-pass"}
    assert tls.java_options("k3y-pass") == {
        "kafka.ssl.truststore.type": "PEM", "kafka.ssl.truststore.location": "/certs/ca.pem",
        "kafka.ssl.keystore.type": "PEM", "kafka.ssl.keystore.location": "/certs/client.pem",
        "kafka.ssl.key.password": "k3y-pass"}
    assert TlsSpec(ca_file=Path("/ca.pem")).java_options(None) == {
        "kafka.ssl.truststore.type": "PEM", "kafka.ssl.truststore.location": "/ca.pem"}


def test_the_files_resolve_beside_the_configuration_and_spark_needs_one_key_file(tmp_path: Path) -> None:
    raw = {"source": {"kind": "kafka", "kafka": {"bootstrap_servers": "b:9093", "tls": {"ca_file": "certs/ca.pem"}},
                      "registry": {"kind": "confluent", "url": "https://r", "tls": {"ca_file": "/abs/ca.pem"}}},
           "tables": [{"name": "t", "topic": "x.t"}]}
    (tmp_path / "conf").mkdir()
    path = tmp_path / "conf" / "c.yaml"
    path.write_text(yaml.safe_dump(raw))
    config = load_config(path)
    assert config.source.kafka is not None and config.source.kafka.tls is not None
    assert config.source.kafka.tls.ca_file == tmp_path / "conf" / "certs" / "ca.pem"
    assert config.source.registry.tls is not None and config.source.registry.tls.ca_file == Path("/abs/ca.pem")

    raw["source"]["kafka"].update(reader="spark", tls={"cert_file": "c.pem", "key_file": "k.pem"})
    path.write_text(yaml.safe_dump(raw))
    with pytest.raises(ConfigError, match="one PEM file"):
        load_config(path)
    raw["source"]["kafka"]["tls"] = {"key_file": "k.pem"}
    path.write_text(yaml.safe_dump(raw))
    with pytest.raises(ConfigError, match="key_file needs cert_file"):
        load_config(path)


@pytest.mark.parametrize(("case", "reason"), [
    ("unknown CA", "certificate verify failed: self-signed certificate"),
    ("expired", "certificate verify failed: certificate has expired"),
    ("another name", "certificate verify failed: IP address mismatch"),
])
def test_a_certificate_that_does_not_verify_is_one_line_naming_the_endpoint(
        case: str, reason: str, ca: Issued, ca_file: Path) -> None:
    signer = issue("a CA nobody trusts") if case == "unknown CA" else ca
    cert = issue("127.0.0.1", ca=signer, hosts=("host.example",) if case == "another name" else ("127.0.0.1",),
                 not_before=dt.datetime.now(dt.UTC) - dt.timedelta(days=30) if case == "expired" else None,
                 validity=dt.timedelta(days=1) if case == "expired" else dt.timedelta(days=30))
    if case == "unknown CA":  # the server sends its CA along: the client sees a chain it does not trust
        cert = Issued(cert.cert + signer.cert, cert.key)
    tls = TlsSpec(ca_file=ca_file)
    with serve(cert) as address:
        assert diagnose(address, tls) is not None and reason in (diagnose(address, tls) or "")
        admin = KafkaAdmin(KafkaSpec(bootstrap_servers=address, options={"kafka.security.protocol": "SSL"},
                                     tls=tls), timeout=10)
        with pytest.raises(SourceUnavailableError) as kafka:
            admin.topics()
        registry = ConfluentSchemaRegistry.from_settings(f"https://{address}/apis/ccompat/v7", credentials_env=None,
                                                         tls=tls)
        with pytest.raises(RegistryUnavailableError) as answered:
            registry.subject_schemas(["t-value"])
    for line in (str(kafka.value), str(answered.value)):
        assert "\n" not in line and address in line and reason in line, line
    assert f"TLS handshake with {address} failed" in str(kafka.value)


def test_a_server_that_verifies_is_no_tls_failure(ca: Issued, ca_file: Path) -> None:
    with serve(issue("127.0.0.1", ca=ca, hosts=("127.0.0.1",))) as address:
        assert diagnose(address, TlsSpec(ca_file=ca_file)) is None
    assert diagnose(address, TlsSpec(ca_file=ca_file)) is None  # nobody listens: not a TLS reason


def test_a_key_the_java_client_cannot_decrypt_is_refused_before_spark_starts(ca: Issued, tmp_path: Path) -> None:
    client = issue("cdc", ca=ca, client=True)
    key = serialization.load_pem_private_key(client.key, password=None)
    pbes2 = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                              serialization.BestAvailableEncryption(b"pass-word"))
    (tmp_path / "pbes2.pem").write_bytes(client.cert + pbes2)
    with pytest.raises(ConfigError, match=r"PBES2.*openssl pkcs8 -topk8 -v1 PBE-SHA1-3DES"):
        check_java_key(TlsSpec(cert_file=tmp_path / "pbes2.pem"))
    (tmp_path / "plain.pem").write_bytes(client.bundle)
    check_java_key(TlsSpec(cert_file=tmp_path / "plain.pem"))  # an unencrypted key: Java reads it
    check_java_key(TlsSpec(ca_file=tmp_path / "plain.pem"))  # no client certificate: nothing to read
