"""``eoguard dlq list|replay``: dead letters sent back to their topics as new attempts of the
same messages, in their own wire format, so each scope's dedup store decides again; on the
real Kafka and Redis, with real GuardedConsumers doing the dead-lettering and the handling."""

from __future__ import annotations

import json
import uuid
from collections import Counter
from collections.abc import Callable

import pytest
from confluent_kafka import Producer

from eoguard.codec import EnvelopeCodec
from eoguard.codec.headers import ATTEMPT, read_headers, write_headers
from eoguard.consumer.guarded import GuardedConsumer
from eoguard.consumer.handler import HandlerContext
from eoguard.envelope import new_message_id, now_ms
from eoguard.stack.feed import envelope, produce
from tests.consumer_kit import consumer_config, drain, read_all

pytestmark = pytest.mark.integration

CODEC = EnvelopeCodec()


def _header_record(bootstrap: str, topic: str) -> str:
    """One raw-bytes record in the header format (no registry needed); its id."""
    mid = new_message_id()
    now = now_ms()
    headers = write_headers(mid, now, now + 600_000, attempt=1, producer="test-producer",
                            source="/test", schema=None, app={"trace": "t-1"})
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all"})
    producer.produce(topic, b"header-format payload", b"k-h",
                     headers=[(k, v.encode()) for k, v in headers.items()])
    assert producer.flush(30) == 0
    return mid


class Scope:
    """A GuardedConsumer group of one scope whose handler fails the ids in ``poison``."""

    def __init__(self, kafka_bootstrap: str, redis_url: str, key_prefix: str, topic: str,
                 dlq: str, scope: str) -> None:
        self.poison: set[str] = set()
        self.handled: Counter[str] = Counter()
        self.args = (kafka_bootstrap, redis_url, [topic])
        self.kw = {"prefix": key_prefix, "scope": scope, "group": f"g-{uuid.uuid4().hex[:8]}",
                   "dead_letter_topic": dlq, "max_retries": 1}

    def handler(self, ctx: HandlerContext) -> None:
        if ctx.message_id in self.poison:
            raise ValueError(f"cannot handle {ctx.message_id} yet")
        self.handled[ctx.message_id] += 1

    def run_until(self, done: Callable[[GuardedConsumer], bool]) -> GuardedConsumer:
        """A consumer of the group (from its committed offsets) polled until ``done``."""
        consumer = GuardedConsumer(consumer_config(*self.args, **self.kw), handler=self.handler)
        try:
            drain([consumer], lambda: done(consumer))
        finally:
            consumer.close()
        return consumer


@pytest.fixture
def scope_of(kafka_bootstrap, redis_url, key_prefix) -> Callable[..., Scope]:
    def make(topic: str, dlq: str, scope: str = "billing") -> Scope:
        return Scope(kafka_bootstrap, redis_url, key_prefix, topic, dlq, scope)
    return make


def _replay(run_cli, bootstrap: str, dlq: str, *args: str) -> dict:
    result = run_cli("--json", "dlq", "replay", dlq, "-b", bootstrap, *args)
    assert result.exit_code == 0, (result.stdout, result.stderr)
    return json.loads(result.stdout)


def test_poison_replayed_by_reason_is_handled_once(run_cli, as_json, kafka_bootstrap, new_topic,
                                                   scope_of) -> None:
    topic, dlq = new_topic(1), new_topic(1, prefix="dlq")
    good = [envelope(b"good %d" % i) for i in range(3)]
    poison = envelope(b"poison")
    produce(kafka_bootstrap, topic, [good[0], poison, good[1]], key=b"k-e")
    poison_h = _header_record(kafka_bootstrap, topic)
    produce(kafka_bootstrap, topic, [b"not an envelope", good[2]])
    billing = scope_of(topic, dlq)
    billing.poison = {poison.id, poison_h}
    billing.run_until(lambda c: c.stats().dead_lettered >= 3 and len(billing.handled) >= 3)
    assert set(billing.handled) == {e.id for e in good}

    listed = as_json(run_cli("--json", "dlq", "list", dlq, "-b", kafka_bootstrap))
    by_reason = Counter(r["reason"] for r in listed["records"])
    assert by_reason == {"handler-failed": 2, "malformed": 1}
    assert {(r["id"], r["format"], r["attempt"], r["replayable"]) for r in listed["records"]
            if r["reason"] == "handler-failed"} == {(poison.id, "envelope", 1, True),
                                                    (poison_h, "headers", 1, True)}
    [bad] = [r for r in listed["records"] if r["reason"] == "malformed"]
    assert bad["replayable"] is False
    assert "not an eoguard message" in bad["skip_reason"]
    assert bad["source"] == {"topic": topic, "partition": 0, "offset": 4}

    # The dry run says what would go and sends nothing.
    dry = _replay(run_cli, kafka_bootstrap, dlq, "--reason", "handler-failed", "--dry-run")
    assert (dry["matched"], dry["would-replay"], dry["replayed"]) == (2, 2, 0)
    assert len(read_all(kafka_bootstrap, topic, 7, timeout_s=5)) == 6

    # The handler is fixed; the replay by reason sends both back, acknowledged.
    billing.poison = set()
    done = _replay(run_cli, kafka_bootstrap, dlq, "--reason", "handler-failed", "--yes")
    assert (done["replayed"], done["skipped"], done["failed"], done["unacknowledged"]) == (2, 0, 0, 0)
    assert {r["replayed_to"]["topic"] for r in done["records"]} == {topic}
    records = read_all(kafka_bootstrap, topic, 8)
    assert len(records) == 8
    again = {r.offset(): r for r in records[6:]}
    envelope_copy = CODEC.decode(again[6].value())
    assert (envelope_copy.id, envelope_copy.attempt) == (poison.id, 2)
    assert envelope_copy.payload == poison.payload
    assert again[6].key() == b"k-e"
    fields = read_headers(again[7].headers())
    assert fields is not None
    assert (fields.id, fields.attempt, fields.app["trace"]) == (poison_h, 2, "t-1")
    assert again[7].value() == b"header-format payload"
    assert not any(name.startswith("eoguard.") for name, _ in again[7].headers())
    assert dict(again[7].headers())[ATTEMPT] == b"2"

    billing.run_until(lambda c: billing.handled[poison.id] and billing.handled[poison_h] > 0)
    # Replayed once more: the scope's dedup store drops both as duplicates.
    _replay(run_cli, kafka_bootstrap, dlq, "--reason", "handler-failed", "--yes")
    billing.run_until(lambda c: c.stats().duplicates >= 2)
    assert billing.handled == Counter([*(e.id for e in good), poison.id, poison_h])


def test_replay_of_an_id_already_done_is_not_handled_again(run_cli, kafka_bootstrap, new_topic,
                                                           scope_of) -> None:
    topic = new_topic(1)
    billing_dlq, shipping_dlq = new_topic(1, prefix="dlq"), new_topic(1, prefix="dlq")
    message = envelope(b"one order")
    produce(kafka_bootstrap, topic, [message])
    billing = scope_of(topic, billing_dlq, "billing")
    shipping = scope_of(topic, shipping_dlq, "shipping")
    shipping.poison = {message.id}
    billing.run_until(lambda c: billing.handled[message.id] > 0)
    shipping.run_until(lambda c: c.stats().dead_lettered >= 1)

    shipping.poison = set()
    dry = _replay(run_cli, kafka_bootstrap, shipping_dlq, "--id", message.id, "--dry-run",
                  "-s", "billing", "-s", "shipping")
    [row] = dry["records"]
    assert row["dedup"]["billing"] == "done"  # billing will drop the replay
    assert row["dedup"]["shipping"] != "done"  # shipping gave its claim up: it will handle it
    done = _replay(run_cli, kafka_bootstrap, shipping_dlq, "--id", message.id, "-y")
    assert done["replayed"] == 1
    # Billing did it already: its dedup store drops the new attempt; shipping handles it.
    billing.run_until(lambda c: c.stats().duplicates >= 1)
    shipping.run_until(lambda c: shipping.handled[message.id] > 0)
    assert billing.handled == Counter({message.id: 1})
    assert shipping.handled == Counter({message.id: 1})


def test_filters_and_the_table(run_cli, kafka_bootstrap, new_topic, scope_of) -> None:
    topic, dlq = new_topic(1), new_topic(1, prefix="dlq")
    expired = envelope(b"late", ttl_ms=-5_000)
    produce(kafka_bootstrap, topic, [b"garbage", expired])
    billing = scope_of(topic, dlq)
    billing.kw["expired_to_dead_letter"] = True
    billing.run_until(lambda c: c.stats().dead_lettered >= 2)

    expired_only = _replay(run_cli, kafka_bootstrap, dlq, "--reason", "expired", "--dry-run")
    [row] = expired_only["records"]
    assert (row["id"], row["outcome"]) == (expired.id, "skipped")
    assert row["skip_reason"].startswith("expired at")
    assert _replay(run_cli, kafka_bootstrap, dlq, "--since", "1h", "--until", "2099-01-01T00:00:00Z",
                   "--dry-run")["matched"] == 2
    assert _replay(run_cli, kafka_bootstrap, dlq, "--until", "1h", "--dry-run")["matched"] == 0
    assert _replay(run_cli, kafka_bootstrap, dlq, "--source-topic", "elsewhere",
                   "--dry-run")["matched"] == 0
    # Nothing replayable: the replay sends nothing and says why.
    nothing = _replay(run_cli, kafka_bootstrap, dlq, "--all", "--yes")
    assert (nothing["skipped"], nothing["replayed"]) == (2, 0)
    assert len(read_all(kafka_bootstrap, topic, 3, timeout_s=5)) == 2

    table = run_cli("dlq", "list", dlq, "-b", kafka_bootstrap)
    assert table.exit_code == 0, table.output
    assert "malformed" in table.stdout
    assert "expired" in table.stdout


@pytest.mark.parametrize(("args", "kind", "code", "words"), [
    (["--reason", "bogus"], "bad-input", 2, "bogus"),
    (["--since", "yesterday"], "bad-input", 2, "RFC 3339"),
    (["--since", "1h", "--until", "2h"], "bad-input", 2, "--since must be before --until"),
    ([], "bad-input", 2, "--all"),
    (["--reason", "expired", "--all"], "bad-input", 2, "--all"),
    (["--id", "order-1"], "bad-input", 2, "not a UUID"),
    (["--id", "01900000-0000-7000-8000-000000000000"], "not-found", 3, "no dead letter"),
])
def test_bad_filters_are_typed_json_errors(run_cli, kafka_bootstrap, new_topic, args, kind, code,
                                           words) -> None:
    dlq = new_topic(1, prefix="dlq")
    result = run_cli("--json", "dlq", "replay", dlq, "-b", kafka_bootstrap, "--dry-run", *args)
    assert result.exit_code == code, (result.stdout, result.stderr)
    [line] = result.stderr.splitlines()
    error = json.loads(line)["error"]
    assert (error["type"], error["exit_code"]) == (kind, code)
    assert words in error["message"]
    assert result.stdout == ""


def test_a_replay_kafka_does_not_take_is_reported_and_exits_1(run_cli, kafka_bootstrap,
                                                               new_topic) -> None:
    topic, dlq = new_topic(1), new_topic(1, prefix="dlq")
    taken, refused = envelope(b"to partition 0"), envelope(b"to partition 7")
    producer = Producer({"bootstrap.servers": kafka_bootstrap, "acks": "all"})
    for message, partition in ((taken, b"0"), (refused, b"7")):  # the topic has no partition 7
        producer.produce(dlq, CODEC.encode(message), headers=[
            ("eoguard.error.kind", b"handler-failed"), ("eoguard.source.topic", topic.encode()),
            ("eoguard.source.partition", partition), ("eoguard.source.offset", b"0")])
    assert producer.flush(30) == 0

    result = run_cli("--json", "dlq", "replay", dlq, "-b", kafka_bootstrap, "--all", "-y",
                     "--timeout", "5")
    assert result.exit_code == 1, (result.stdout, result.stderr)
    report = json.loads(result.stdout)  # the report, then the error
    outcomes = {r["id"]: r["outcome"] for r in report["records"]}
    assert outcomes[taken.id] == "replayed"
    assert outcomes[refused.id] in ("failed", "unacknowledged")
    assert report["replayed"] == 1
    error = json.loads(result.stderr)["error"]
    assert (error["type"], error["exit_code"]) == ("failed", 1)
    assert "1 of 2 replay(s) not acknowledged" in error["message"]
    [copy] = read_all(kafka_bootstrap, topic, 1)
    assert CODEC.decode(copy.value()).id == taken.id
