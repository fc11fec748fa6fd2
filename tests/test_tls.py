"""HTTPS end to end with a CA made here: ``cproxy serve --tls-cert/--tls-key`` as a real
subprocess, the SDK (client, producer, consumer), the CLI and the Spark sink's preflight
trusting that CA, and bearer tokens configured only as SHA-256 digests.

Also the refusals around it: a client without the CA, TLS flags given half, a key that does
not match its certificate, malformed digests.
"""

from __future__ import annotations

import ipaddress
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from consumer_sdk import (
    AsyncClient,
    CertificateError,
    Client,
    Consumer,
    Message,
    NotAuthenticated,
    PermissionDenied,
    Producer,
    QueueResult,
    TransportError,
)
from cproxy.cli import main
from cproxy.config import load_settings, settings_from_mapping
from cproxy.errors import ConfigError
from cproxy.tokens import Token, token_digest
from spark_sink import SinkOptions
from spark_sink.errors import SinkConfigError
from spark_sink.producer import check_service
from tests.support import wait_until
from tests.test_cli import free_port
from tests.test_docs_snippets import ROOT, extract

ADMIN = "tls-admin-token-0001"
CONSUMER = "tls-consumer-token-01"


# -- a private CA and a server certificate for 127.0.0.1 / localhost ----------------------------
@dataclass(frozen=True)
class Pki:
    ca_file: Path
    cert_file: Path
    key_file: Path
    other_key_file: Path  # a valid key that does not belong to cert_file


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _write_key(key: ec.EllipticCurvePrivateKey, path: Path) -> None:
    path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )


def make_pki(directory: Path) -> Pki:
    """A CA, and a server certificate it signed for localhost and 127.0.0.1 (one day)."""
    now = datetime.now(UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_cert = (
        x509.CertificateBuilder()
        .subject_name(_name("cproxy test CA"))
        .issuer_name(_name("cproxy test CA"))
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - timedelta(minutes=5))
        .not_valid_after(now + timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
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
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), False)
        .sign(ca_key, hashes.SHA256())
    )
    server_key = ec.generate_private_key(ec.SECP256R1())
    server_cert = (
        x509.CertificateBuilder()
        .subject_name(_name("localhost"))
        .issuer_name(ca_cert.subject)
        .public_key(server_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - timedelta(minutes=5))
        .not_valid_after(now + timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName(
                [
                    x509.DNSName("localhost"),
                    x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
                ]
            ),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), False
        )
        .sign(ca_key, hashes.SHA256())
    )
    pki = Pki(
        directory / "ca.crt",
        directory / "server.crt",
        directory / "server.key",
        directory / "other.key",
    )
    pki.ca_file.write_bytes(ca_cert.public_bytes(serialization.Encoding.PEM))
    pki.cert_file.write_bytes(server_cert.public_bytes(serialization.Encoding.PEM))
    _write_key(server_key, pki.key_file)
    _write_key(ec.generate_private_key(ec.SECP256R1()), pki.other_key_file)
    return pki


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


# -- cproxy serve over TLS, tokens only as digests ----------------------------------------------
@dataclass(frozen=True)
class TlsServer:
    url: str
    pki: Pki


CONFIG = f"""
[[tokens]]
name = "ops"
token_sha256 = "{token_digest(ADMIN)}"
role = "admin"

[[tokens]]
name = "billing"
token_sha256 = "{token_digest(CONSUMER).upper()}"
role = "consumer"
topics = ["tls-rides"]
groups = ["tls-billing"]

[topics.tls-rides]
queues = 2

[groups.tls-billing]
topics = {{ tls-rides = {{ order_by = "key" }} }}
"""


@contextmanager
def serving_tls(work: Path, config_text: str, cert: Path, key: Path, ca: Path) -> Iterator[str]:
    """``cproxy serve --tls-cert --tls-key`` as a subprocess until the block ends; its URL."""
    config = work / "cproxy.toml"
    config.write_text(config_text, encoding="utf-8")
    port = free_port()
    log = work / "server.log"
    command = [
        *(sys.executable, "-m", "cproxy.cli", "serve", "--port", str(port)),
        *("--data-dir", str(work / "data"), "--config", str(config)),
        *("--tls-cert", str(cert), "--tls-key", str(key)),
    ]
    with log.open("wb") as out:
        proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)
    url = f"https://127.0.0.1:{port}"

    def ready() -> bool:
        if proc.poll() is not None:
            raise AssertionError(f"server exited: {log.read_text()}")
        try:
            with Client(url, timeout_ms=1000, verify=ca) as client:
                return client.ready()
        except TransportError:
            return False

    try:
        wait_until(ready, 30, 0.05, "TLS server ready")
        assert "serving on https://127.0.0.1" in log.read_text()
        yield url
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


@pytest.fixture(scope="module")
def tls_server(pki: Pki, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TlsServer]:
    assert ADMIN not in CONFIG and CONSUMER not in CONFIG  # the file holds no secret
    work = tmp_path_factory.mktemp("tls-server")
    with serving_tls(work, CONFIG, pki.cert_file, pki.key_file, pki.ca_file) as url:
        yield TlsServer(url, pki)


def test_produce_and_pull_over_tls_with_digest_tokens(tls_server: TlsServer) -> None:
    ca = tls_server.pki.ca_file
    with Producer(tls_server.url, token=ADMIN, verify=ca) as producer:
        sent = producer.send("tls-rides", {"ride": 7, "event": "call"}, key="ride-7")
        producer.send("tls-rides", {"ride": 7, "event": "pickup"}, key="ride-7")
    # A str path works as well as a Path; the consumer token was configured in upper-case hex.
    with Client(tls_server.url, token=CONSUMER, verify=str(ca)) as client:
        first = client.pull("tls-billing", max_messages=10, wait_ms=5000)
        assert [m.body for m in first.messages] == [{"ride": 7, "event": "call"}]
        assert (first.messages[0].qid, first.messages[0].offset) == (sent.qid, sent.offset)
        acked = QueueResult("tls-rides", sent.qid, acks=(sent.offset,))
        second = client.pull("tls-billing", max_messages=10, wait_ms=5000, results=[acked])
        assert [m.body["event"] for m in second.messages] == ["pickup"]
        client.ack("tls-billing", [QueueResult("tls-rides", sent.qid, acks=(sent.offset + 1,))])
        # The consumer role is still a consumer: digests change how a token is stored, not
        # what it may do.
        with pytest.raises(PermissionDenied):
            client.create_topic("tls-other", 1)


def test_unknown_token_is_refused_over_tls(tls_server: TlsServer) -> None:
    ca = tls_server.pki.ca_file
    # The digest itself is not a password: presenting it is an unknown token too.
    for token in ("not-a-configured-token", token_digest(ADMIN)):
        with Client(tls_server.url, token=token, verify=ca) as c, pytest.raises(NotAuthenticated):
            c.list_topics()


def test_a_client_without_the_ca_fails_at_once_with_a_clear_error(tls_server: TlsServer) -> None:
    started = time.monotonic()
    # The usual trusted CAs only.
    with Client(tls_server.url, token=ADMIN) as c, pytest.raises(CertificateError) as caught:
        c.list_topics()
    message = str(caught.value)
    assert "certificate" in message and "verify" in message and "--ca-file" in message, message
    assert not caught.value.retryable
    # Not retried with backoff: the default policy would take seconds over 5 attempts.
    assert time.monotonic() - started < 2.0


async def test_async_client_over_tls_trusts_the_ca_and_refuses_without_it(
    tls_server: TlsServer,
) -> None:
    # AsyncClient's own HTTP/1.1 pool (no transport=), which builds its SSL context itself.
    ca = tls_server.pki.ca_file
    async with AsyncClient(tls_server.url, token=ADMIN, verify=ca) as client:
        await client.create_topic("tls-async", 1)
        assert "tls-async" in [t.name for t in await client.list_topics()]
    started = time.monotonic()
    async with AsyncClient(tls_server.url, token=ADMIN) as client:
        with pytest.raises(CertificateError) as caught:
            await client.list_topics()
    message = str(caught.value)
    assert "certificate" in message and "verify" in message and "--ca-file" in message, message
    assert time.monotonic() - started < 2.0


def test_consumer_pulls_over_tls(tls_server: TlsServer) -> None:
    ca = tls_server.pki.ca_file
    with Client(tls_server.url, token=ADMIN, verify=ca) as admin:
        admin.create_topic("tls-consumed", 1)
        admin.put_group("tls-consumer", {"topics": {"tls-consumed": {"order_by": "key"}}})
        admin.produce("tls-consumed", [{"body": {"n": 1}, "key": "k"}])
    seen: list[Message] = []
    done = threading.Event()

    def handle(message: Message) -> None:
        seen.append(message)
        done.set()

    consumer = Consumer(
        tls_server.url,
        group="tls-consumer",
        handler=handle,
        token=ADMIN,
        verify=ca,
        wait_ms=200,
        handle_signals=False,
    )
    consumer.start()
    try:
        assert done.wait(20), "the consumer got nothing over TLS"
    finally:
        consumer.stop()
    assert [m.body for m in seen] == [{"n": 1}]


def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "cproxy.cli", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={**os.environ, **(env or {})},
    )


def test_cli_trusts_the_ca_from_a_flag_or_the_environment(tls_server: TlsServer) -> None:
    ca = str(tls_server.pki.ca_file)
    common = ["--url", tls_server.url, "--token", ADMIN]
    made = _cli("topics", "create", "tls-cli", "--queues", "1", *common, "--ca-file", ca)
    assert made.returncode == 0, made.stderr
    produced = _cli("produce", "tls-cli", '{"via": "env"}', *common, env={"CPROXY_CA_FILE": ca})
    assert produced.returncode == 0, produced.stderr
    assert json.loads(produced.stdout)["results"][0]["offset"] == 0
    untrusted = _cli("topics", "list", *common, env={"CPROXY_CA_FILE": ""})
    assert untrusted.returncode == 1
    assert untrusted.stderr.startswith("cproxy: error: ") and "certificate" in untrusted.stderr
    assert "Traceback" not in untrusted.stderr


def test_spark_sink_preflight_trusts_ca_file(tls_server: TlsServer) -> None:
    with Client(tls_server.url, token=ADMIN, verify=tls_server.pki.ca_file) as admin:
        admin.create_topic("tls-spark", 3)
    raw = {"url": tls_server.url, "topic": "tls-spark", "keyCol": "k", "token": ADMIN}
    options = SinkOptions.from_strings({**raw, "caFile": str(tls_server.pki.ca_file)})
    assert check_service(options) == 3
    with pytest.raises(SinkConfigError, match="ca_file"):
        check_service(SinkOptions.from_strings(raw))


# -- settings: TLS and digests validated when loaded --------------------------------------------
def test_tls_settings_come_from_the_file_or_flags(pki: Pki, tmp_path: Path) -> None:
    config = tmp_path / "c.toml"
    config.write_text(f'[server]\ntls_cert = "{pki.cert_file}"\ntls_key = "{pki.key_file}"\n')
    from_file = load_settings(config)
    assert (from_file.tls_cert, from_file.tls_key) == (pki.cert_file, pki.key_file)
    assert from_file.tls_enabled
    from_flags = load_settings(None, tls_cert=str(pki.cert_file), tls_key=str(pki.key_file))
    assert from_flags.tls_cert == pki.cert_file and from_flags.tls_enabled
    assert not load_settings(None).tls_enabled


@pytest.mark.parametrize("flag", ["--tls-cert", "--tls-key"])
def test_serve_refuses_half_of_tls_in_one_line(pki: Pki, tmp_path: Path, flag: str) -> None:
    with pytest.raises(SystemExit) as caught:
        main(["serve", "--data-dir", str(tmp_path), flag, str(pki.cert_file)])
    message = str(caught.value.code)
    assert message.startswith("cproxy: error: tls_cert and tls_key go together"), message
    assert "\n" not in message


def test_serve_refuses_a_key_of_another_certificate(pki: Pki, tmp_path: Path) -> None:
    with pytest.raises(SystemExit) as caught:
        main(
            [
                "serve",
                "--data-dir",
                str(tmp_path),
                "--tls-cert",
                str(pki.cert_file),
                "--tls-key",
                str(pki.other_key_file),
            ]
        )
    assert str(caught.value.code).startswith("cproxy: error: cannot load TLS certificate")
    # A key with a passphrase is refused at start, never prompted for.
    locked = tmp_path / "locked.key"
    key = serialization.load_pem_private_key(pki.key_file.read_bytes(), None)
    locked.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.BestAvailableEncryption(b"passphrase"),
        )
    )
    with pytest.raises(ConfigError, match="without a passphrase"):
        load_settings(None, tls_cert=str(pki.cert_file), tls_key=str(locked))
    with pytest.raises(ConfigError, match="No such file"):
        load_settings(None, tls_cert=str(tmp_path / "missing.crt"), tls_key=str(pki.key_file))


def test_a_ca_file_that_does_not_load_fails_where_it_is_given(tmp_path: Path) -> None:
    not_pem = tmp_path / "not.pem"
    not_pem.write_text("not a certificate\n")
    for path in (tmp_path / "missing.pem", not_pem):
        with pytest.raises(ValueError, match="cannot load CA file"):
            Client("https://127.0.0.1:1", verify=path)
        with pytest.raises(SinkConfigError, match="cannot load ca_file"):
            SinkOptions.create(url="https://h:1", topic="t", key_col="k", ca_file=str(path))
    cli = _cli("topics", "list", "--url", "https://127.0.0.1:1", "--ca-file", str(not_pem))
    assert cli.returncode == 2 and "cannot load CA file" in cli.stderr, cli.stderr


def _tokens(*items: Mapping[str, object]) -> dict[str, object]:
    return {"tokens": [{"role": "admin", **item} for item in items]}


def test_token_digests_are_validated() -> None:
    good = token_digest("a-secret-token")
    settings = settings_from_mapping(_tokens({"token_sha256": good.upper()}))
    assert settings.tokens[0].token is None and settings.tokens[0].token_sha256 == good
    assert "a-secret-token" not in repr(settings_from_mapping(_tokens({"token": "a-secret-token"})))
    for bad, words in [
        ({"token_sha256": "abc"}, "64 hex digits"),
        ({"token_sha256": "g" * 64}, "64 hex digits"),
        ({"token": "a-secret-token", "token_sha256": good}, "exactly one of"),
        ({}, "exactly one of"),
    ]:
        with pytest.raises(ConfigError, match=words):
            settings_from_mapping(_tokens(bad))
    # The same secret in plain text and as a digest is one token given twice.
    with pytest.raises(ConfigError, match="unique"):
        settings_from_mapping(_tokens({"token": "a-secret-token"}, {"token_sha256": good}))
    with pytest.raises(ConfigError, match="exactly one of"):
        Token(None, "admin")


def test_token_new_and_hash(capsys: pytest.CaptureFixture[str]) -> None:
    main(["token", "new"])
    made = json.loads(capsys.readouterr().out)
    assert len(made["token"]) >= 40 and made["token_sha256"] == token_digest(made["token"])
    main(["token", "new"])
    assert json.loads(capsys.readouterr().out)["token"] != made["token"]

    hashed = _cli_with_input("token", "hash", stdin=made["token"] + "\n")
    assert hashed.returncode == 0, hashed.stderr
    assert hashed.stdout == made["token_sha256"] + "\n"
    short = _cli_with_input("token", "hash", stdin="short\n")
    assert short.returncode == 1 and "at least 8 characters" in short.stderr


def _cli_with_input(*args: str, stdin: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "cproxy.cli", *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


# -- the documents' recipe ----------------------------------------------------------------------
def test_the_ca_recipe_of_operations_md_makes_certificates_cproxy_serves(tmp_path: Path) -> None:
    """docs/operations.md's openssl steps give a CA and a certificate that the server loads
    and the SDK verifies (the docs test only runs them; here they are used)."""
    if shutil.which("openssl") is None:
        pytest.skip("no openssl command to run the documented recipe with")
    recipe = [
        s
        for s in extract(ROOT / "docs" / "operations.md")
        if s.lang == "bash" and "openssl verify -CAfile ca.crt server.crt" in s.code
    ]
    assert len(recipe) == 1, "the CA recipe moved: update this test"
    made = subprocess.run(
        ["bash", "-e", "-o", "pipefail", "-c", recipe[0].code],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert made.returncode == 0 and "server.crt: OK" in made.stdout, made.stderr
    tls = tmp_path / "tls"
    digest = token_digest(ADMIN)
    config = f'[[tokens]]\nname = "ops"\nrole = "admin"\ntoken_sha256 = "{digest}"\n'
    ca = tls / "ca.crt"
    with serving_tls(tmp_path, config, tls / "server.crt", tls / "server.key", ca) as url:
        for host in (url, url.replace("127.0.0.1", "localhost")):
            with Client(host, token=ADMIN, verify=ca) as client:
                assert client.create_topic("recipe", 1).queues == 1


def test_the_example_config_loads() -> None:
    settings = load_settings(ROOT / "deploy" / "cproxy.toml")
    assert settings.topics == {"rides": 8} and not settings.tls_enabled
