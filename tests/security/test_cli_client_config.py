"""``eoguard browse -F FILE`` and ``eoguard dlq replay -F FILE`` reach Kafka's SASL_SSL
listener with the login the file holds; a refused login is a one-line error (a JSON one under
``--json``); the password shows in neither output."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest
from click.testing import CliRunner
from confluent_kafka import Producer

from eoguard.cli import cli
from eoguard.codec import EnvelopeCodec
from eoguard.stack import create_topics
from eoguard.stack.kafka_broker import SCRAM_MECHANISM
from tests.cli.conftest import outbox_record
from tests.consumer_kit import read_all
from tests.security.secure_kit import USER, SecureStack

pytestmark = [pytest.mark.integration, pytest.mark.security]


def _properties(path: Path, stack: SecureStack, password: str) -> Path:
    path.write_text("\n".join([
        "# a SASL_SSL cluster, as kcat -F reads it",
        f"bootstrap.servers={stack.kafka_bootstrap}",
        "security.protocol=SASL_SSL",
        f"sasl.mechanism={SCRAM_MECHANISM}",
        f"ssl.ca.location={stack.ca}",
        f"sasl.username={USER}",
        f"sasl.password={password}",
        "",
    ]))
    return path


def test_browse_reaches_a_sasl_listener_through_the_file(
        secure_stack: SecureStack, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("EOGUARD_KAFKA_SASL_USERNAME", "EOGUARD_KAFKA_SASL_PASSWORD",
                 "EOGUARD_KAFKA_SASL_PASSWORD_FILE"):
        monkeypatch.delenv(name, raising=False)  # the login comes from the file alone
    topic = f"browse-{uuid.uuid4().hex[:8]}"
    create_topics(secure_stack.kafka_admin, {topic: 1})
    record = outbox_record(topic)
    producer = Producer({"bootstrap.servers": secure_stack.kafka_admin})
    producer.produce(topic, record.value)
    assert producer.flush(30) == 0
    runner = CliRunner()

    good = _properties(tmp_path / "good.properties", secure_stack, secure_stack.kafka_password)
    result = runner.invoke(cli, ["--json", "browse", topic, "-F", str(good)])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert [r["id"] for r in data["records"]] == [record.id]
    assert data["client"]["sasl.password"] == "***"
    assert secure_stack.kafka_password not in result.output

    wrong = _properties(tmp_path / "wrong.properties", secure_stack, f"wrong-{uuid.uuid4().hex}")
    refused = runner.invoke(cli, ["browse", topic, "-F", str(wrong), "--timeout", "10"])
    assert refused.exit_code == 1
    assert "SASL" in refused.output
    assert "wrong-" not in refused.output
    assert len(refused.output.strip().splitlines()) == 1


def test_dlq_replay_reaches_a_sasl_listener_through_the_file(
        secure_stack: SecureStack, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("EOGUARD_KAFKA_SASL_USERNAME", "EOGUARD_KAFKA_SASL_PASSWORD",
                 "EOGUARD_KAFKA_SASL_PASSWORD_FILE"):
        monkeypatch.delenv(name, raising=False)
    topic, dlq = f"orders-{uuid.uuid4().hex[:8]}", f"dlq-{uuid.uuid4().hex[:8]}"
    create_topics(secure_stack.kafka_admin, {topic: 1, dlq: 1})
    record = outbox_record(topic)
    producer = Producer({"bootstrap.servers": secure_stack.kafka_admin})
    producer.produce(dlq, record.value, headers=[
        ("eoguard.error.kind", b"handler-failed"), ("eoguard.source.topic", topic.encode()),
        ("eoguard.source.partition", b"0"), ("eoguard.source.offset", b"0")])
    assert producer.flush(30) == 0
    runner = CliRunner()

    good = _properties(tmp_path / "good.properties", secure_stack, secure_stack.kafka_password)
    result = runner.invoke(cli, ["--json", "dlq", "replay", dlq, "--all", "-y", "-F", str(good)])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert (data["replayed"], data["records"][0]["id"]) == (1, record.id)
    assert secure_stack.kafka_password not in result.output
    [copy] = read_all(secure_stack.kafka_admin, topic, 1)
    replayed = EnvelopeCodec().decode(copy.value())
    assert (replayed.id, replayed.attempt) == (record.id, 2)

    wrong = _properties(tmp_path / "wrong.properties", secure_stack, f"wrong-{uuid.uuid4().hex}")
    refused = runner.invoke(cli, ["--json", "dlq", "list", dlq, "-F", str(wrong),
                                  "--timeout", "10"])
    assert refused.exit_code == 1
    assert refused.stdout == ""
    error = json.loads(refused.stderr)["error"]
    assert error["type"] == "failed"
    assert "SASL" in error["message"]
    assert "wrong-" not in refused.output
