"""GuardedConsumers on topics no eoguard producer wrote (ConsumerConfig.plain_records), on real
Kafka and Redis: every order handled once per scope, keyed by its order number, whatever the
producer repeated; envelopes and plain records of one order are one message; a record whose
rule fails is dead-lettered with its reason and the records around it are handled."""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
import redis
from confluent_kafka import Producer

from eoguard import KeepUntil, Lifetime, PlainRecord, PlainRecords, message_id_for, now_ms
from eoguard.consumer.handler import HandlerContext
from eoguard.producer.guarded import GuardedProducer
from eoguard.stack.feed import envelope, produce
from eoguard.store.keys import DEFAULT_MAX_TTL_MS, KeySpace
from tests.consumer_kit import drain, headers_of, read_all
from tests.integration.test_producer import make_config

pytestmark = pytest.mark.integration


def order_id(rec: PlainRecord) -> str:
    return message_id_for("orders", str(rec.value["order"]))


ORDERS = PlainRecords(deserializer=json.loads, id_rule=order_id, lifetime=Lifetime(ttl_s=600))


def order_of(ctx: HandlerContext) -> dict[str, Any]:
    """The order a context carries: a plain record's decoded JSON, an envelope's raw bytes."""
    payload = ctx.payload
    return payload if isinstance(payload, dict) else json.loads(payload)  # type: ignore[no-any-return]


def counting(seen: Counter[int]) -> Any:
    """A handler counting each order in Redis (ctx.tx: with the done mark) and in ``seen``."""
    def handle(ctx: HandlerContext) -> None:
        number = order_of(ctx)["order"]
        assert ctx.message_id == message_id_for("orders", str(number))
        ctx.tx.hincrby(ctx.key_for("orders"), str(number), 1)
        seen[number] += 1
    return handle


def counted(client: redis.Redis, prefix: str, scope: str) -> Counter[int]:
    """Per order number, how many times the scope's done marks applied its effect."""
    total: Counter[int] = Counter()
    for key in client.scan_iter(KeySpace(prefix=prefix).effect_pattern(scope, "orders"),
                                count=1000):
        for field, value in client.hgetall(key).items():
            total[int(field)] += int(value)
    return total


def plain_producer(bootstrap: str) -> Producer:
    """What a team has already: a confluent-kafka producer, acks=all, no idempotence."""
    return Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 5,
                     "enable.idempotence": False})


def order_value(number: int) -> bytes:
    return json.dumps({"order": number, "customer": f"c{number % 7}",
                       "total_cents": 100 * number}).encode()


@pytest.mark.cluster
def test_a_plain_producer_with_copies_and_a_restart_is_handled_once_per_scope(
        make, new_topic, kafka_bootstrap, redis_client, key_prefix) -> None:
    topic = new_topic(4)
    count = 300
    first = plain_producer(kafka_bootstrap)
    copies = 0
    for number in range(200):  # the first life of the producer: orders 0-199
        first.produce(topic, order_value(number), key=f"c{number % 7}".encode())
        if number % 9 == 0:  # a copy the application sent again (another key: another partition)
            first.produce(topic, order_value(number), key=f"retry-{number}".encode())
            copies += 1
    first.flush(30)
    # Restarted: unsure what its predecessor got acknowledged, it resends 160-199, then goes on.
    second = plain_producer(kafka_bootstrap)
    for number in range(160, count):
        second.produce(topic, order_value(number), key=f"c{number % 7}".encode())
    second.flush(30)
    copies += 40
    records = count + copies

    scopes = ("billing", "shipping")
    seen = {scope: Counter[int]() for scope in scopes}
    consumers = [make([topic], counting(seen[scope]), scope=scope, plain_records=ORDERS,
                      batch_size=64) for scope in scopes]

    def finished() -> bool:
        return all(c.stats().polled >= records and len(seen[s]) >= count
                   for c, s in zip(consumers, scopes, strict=True))
    drain(consumers, finished, timeout_s=120)

    want = Counter(range(count))
    for consumer, scope in zip(consumers, scopes, strict=True):
        stats = consumer.stats()
        print(f"{scope}: handled={stats.handled} duplicates={stats.duplicates} "
              f"busy waits={stats.busy_waits} dead-lettered={stats.dead_lettered}")
        assert seen[scope] == want, scope
        assert counted(redis_client, key_prefix, scope) == want, scope
        assert stats.handled == count
        assert stats.dead_lettered == 0


@pytest.mark.cluster
def test_envelopes_and_plain_records_of_one_order_are_one_message(
        make, new_topic, kafka_bootstrap, redis_client, key_prefix) -> None:
    topic = new_topic(2)
    count = 120
    values: list[Any] = []
    for number in range(count):
        mid = message_id_for("orders", str(number))
        if number % 3 != 1:  # orders 0, 2, 3, 5...: sent as eoguard envelopes (raw JSON payload)
            values.append(envelope(order_value(number), message_id=mid))
        if number % 3 != 0:  # orders 1, 2, 4, 5...: as plain records (2, 5...: both ways)
            values.append(order_value(number))
    produce(kafka_bootstrap, topic, values)

    scopes = ("billing", "audit")
    seen = {scope: Counter[int]() for scope in scopes}
    consumers = [make([topic], counting(seen[scope]), scope=scope, plain_records=ORDERS)
                 for scope in scopes]
    drain(consumers, lambda: all(c.stats().polled >= len(values) for c in consumers)
          and all(len(s) >= count for s in seen.values()))

    want = Counter(range(count))
    both = sum(1 for number in range(count) if number % 3 == 2)
    for consumer, scope in zip(consumers, scopes, strict=True):
        stats = consumer.stats()
        assert seen[scope] == want, scope
        assert counted(redis_client, key_prefix, scope) == want, scope
        assert stats.duplicates + stats.busy_skipped >= both - stats.redelivered
        assert stats.dead_lettered == 0


def test_a_record_whose_rule_fails_is_dead_lettered_with_its_reason(
        make, new_topic, kafka_bootstrap, redis_client, key_prefix) -> None:
    topic, dlq = new_topic(1), new_topic(1, prefix="dlq")

    def id_rule(rec: PlainRecord) -> str:
        if "ref" in rec.value:  # an id taken as written: nonsense unless it is a UUID
            return str(rec.value["ref"])
        return message_id_for("orders", str(rec.value["order"]))

    def expiry(rec: PlainRecord) -> int:
        assert rec.timestamp_ms is not None
        if "expires_at" in rec.value:
            return int(rec.value["expires_at"])
        return rec.timestamp_ms + int(rec.value.get("expires_in_ms", 600_000))

    rules = PlainRecords(deserializer=json.loads, id_rule=id_rule, lifetime=Lifetime(rule=expiry))
    far = now_ms() + DEFAULT_MAX_TTL_MS + 3_600_000
    bad: dict[str, tuple[bytes, str]] = {  # value: (the rule, words in the reason)
        "raises": (b'{"no_order": 1}', "id rule raised KeyError"),
        "not a uuid": (b'{"order": 5, "ref": "order-5"}', "not a UUID string"),
        "beyond max_ttl": (json.dumps({"order": 6, "expires_at": far}).encode(),
                           "beyond now + max_ttl"),
        "not json": (b"{truncated", "deserializer raised JSONDecodeError"),
        "before its timestamp": (json.dumps({"order": 8, "expires_at": now_ms() // 1000})
                                 .encode(), "before the record's timestamp"),
    }
    expired = json.dumps({"order": 7, "expires_in_ms": 1}).encode()
    good = [order_value(number) for number in range(len(bad) + 1)]
    values = [good[0]]
    for (raw, _), after in zip(bad.values(), good[1:], strict=True):
        values += [raw, after]
    values.append(expired)
    produce(kafka_bootstrap, topic, values)

    seen: Counter[int] = Counter()
    consumer = make([topic], counting(seen), plain_records=rules, dead_letter_topic=dlq)
    drain([consumer], lambda: consumer.stats().polled >= len(values) and len(seen) >= len(good))

    assert seen == Counter(range(len(good)))
    stats = consumer.stats()
    assert stats.expired == 1  # dropped like an expired envelope, never dead-lettered
    letters = read_all(kafka_bootstrap, dlq, len(bad))
    assert len(letters) == len(bad)
    by_value = {m.value(): headers_of(m) for m in letters}
    for name, (raw, words) in bad.items():
        headers = by_value[raw]
        assert headers["eoguard.error.kind"] == "malformed", name
        assert headers["eoguard.error.type"] == "InvalidRecordError", name
        assert words in headers["eoguard.error.reason"], (name, headers["eoguard.error.reason"])
        assert headers["eoguard.source.topic"] == topic
    claimed = {k.decode().rsplit(":", 1)[1]
               for k in redis_client.scan_iter(f"{key_prefix}:dc:*", count=1000)}
    assert claimed == {message_id_for("orders", str(n)) for n in range(len(good))}


def test_without_plain_records_a_plain_record_is_malformed(make, new_topic,
                                                           kafka_bootstrap) -> None:
    topic, dlq = new_topic(1), new_topic(1, prefix="dlq")
    env = envelope()
    produce(kafka_bootstrap, topic, [order_value(1), env])
    seen: list[str] = []
    consumer = make([topic], lambda ctx: seen.append(ctx.message_id), dead_letter_topic=dlq)
    drain([consumer], lambda: len(seen) >= 1 and consumer.stats().polled >= 2)
    assert seen == [env.id]
    (letter,) = read_all(kafka_bootstrap, dlq, 1)
    assert headers_of(letter)["eoguard.error.type"] == "BadMagicError"


@pytest.mark.cluster
def test_a_topic_half_moved_to_a_guarded_producer_handles_each_order_once(
        make, new_topic, kafka_bootstrap, redis_url, redis_client, key_prefix) -> None:
    """Migration, step 2: a GuardedProducer takes over orders 0-59 (same business-key ids)
    while the old plain producer still writes 30-89; each order once, and the outbox records
    the consumer handled (as envelope or as plain record) are acknowledged."""
    topic = new_topic(2)
    config = make_config(kafka_bootstrap, redis_url, key_prefix,
                         keyspace=KeySpace(prefix=key_prefix), keep_until=KeepUntil.CONSUMED)
    with GuardedProducer(config) as producer:
        handles = [producer.send(topic, order_value(n), key=f"c{n % 7}",
                                 message_id=message_id_for("orders", str(n)))
                   for n in range(60)]
        assert all(handle.wait(30) for handle in handles)
    assert len(list(redis_client.scan_iter(f"{key_prefix}:ob:*:r:*", count=1000))) == 60
    old = plain_producer(kafka_bootstrap)
    for number in range(30, 90):
        old.produce(topic, order_value(number), key=f"c{number % 7}".encode())
    old.flush(30)

    seen: Counter[int] = Counter()
    consumer = make([topic], counting(seen), scope="billing", plain_records=ORDERS)
    drain([consumer], lambda: consumer.stats().polled >= 120 and len(seen) >= 90)

    assert seen == Counter(range(90))
    assert counted(redis_client, key_prefix, "billing") == Counter(range(90))
    deadline = time.monotonic() + 10
    while list(redis_client.scan_iter(f"{key_prefix}:ob:*:r:*", count=1000)):
        assert time.monotonic() < deadline, "outbox records left unacknowledged"
        consumer.poll_once()


@dataclass
class Order:  # what a team's deserializer builds from its JSON: Order(**json.loads(raw))
    order: int


def order_object(raw: bytes) -> Order:
    return Order(**json.loads(raw))


def order_object_id(rec: PlainRecord) -> str:
    return message_id_for("orders", str(rec.value.order))


def order_only(number: int) -> bytes:
    return json.dumps({"order": number}).encode()


# Valid ASCII JSON whose key is the escape of a lone surrogate: the deserializer's TypeError
# quotes the key, so the reason to dead-letter it holds a lone surrogate UTF-8 cannot encode.
HOSTILE = b'{"\\udcff": 1}'


def hostile_between_two(kafka_bootstrap: str, topic: str
                        ) -> tuple[Counter[int], Callable[[HandlerContext], None], PlainRecords]:
    """Orders 0 and 1 with HOSTILE between them on ``topic``; the orders seen, a handler
    counting them, and the plain-record rules that read them."""
    produce(kafka_bootstrap, topic, [order_only(0), HOSTILE, order_only(1)])
    seen: Counter[int] = Counter()

    def handle(ctx: HandlerContext) -> None:
        seen[ctx.payload.order] += 1

    rules = PlainRecords(deserializer=order_object, id_rule=order_object_id,
                         lifetime=Lifetime(ttl_s=600))
    return seen, handle, rules


def test_a_record_whose_reason_holds_a_lone_surrogate_is_dead_lettered(
        make, new_topic, kafka_bootstrap) -> None:
    """An adversarial read (adv5) found DeadLetterRouter.route encoding the reason with
    ``str.encode()``: a lone surrogate quoted from a hostile record raised UnicodeEncodeError
    out of poll_once, so one record stopped its partition. The reason is now sent escaped
    (backslashreplace) and the records around it are handled."""
    topic, dlq = new_topic(1), new_topic(1, prefix="dlq")
    seen, handle, rules = hostile_between_two(kafka_bootstrap, topic)
    consumer = make([topic], handle, plain_records=rules, dead_letter_topic=dlq)
    drain([consumer], lambda: consumer.stats().polled >= 3 and len(seen) >= 2)
    assert seen == Counter({0: 1, 1: 1})
    (letter,) = read_all(kafka_bootstrap, dlq, 1)
    assert letter.value() == HOSTILE
    headers = headers_of(letter)
    assert headers["eoguard.error.type"] == "InvalidRecordError"
    assert "\\udcff" in headers["eoguard.error.reason"]  # escaped, as backslashreplace writes it


def test_the_records_read_with_a_hostile_one_are_not_lost(make, new_topic,
                                                          kafka_bootstrap) -> None:
    """The same adversarial read: the UnicodeEncodeError escaped poll_once after the batch's
    records were read, so an application polling on (or a supervisor restarting the consumer)
    lost the good records of that batch once later batches committed past them. Nothing
    escapes now, and every record is handled once."""
    topic = new_topic(1)
    seen, handle, rules = hostile_between_two(kafka_bootstrap, topic)
    consumer = make([topic], handle, plain_records=rules)
    errors: list[BaseException] = []

    def poll_forgiving() -> None:
        try:
            consumer.poll_once()
        except Exception as exc:  # what a supervising loop does: log it, poll on
            errors.append(exc)

    for _ in range(10):
        poll_forgiving()
    produce(kafka_bootstrap, topic, [order_only(n) for n in range(2, 6)])
    deadline = time.monotonic() + 30
    while len(seen) < 6 and time.monotonic() < deadline:
        poll_forgiving()
    assert errors == []
    assert seen == Counter(range(6))


def test_a_deserializer_outage_is_retried_not_dead_lettered(make, new_topic,
                                                            kafka_bootstrap) -> None:
    """An adversarial read (adv5) found a deserializer failing for its service being down
    (confluent-kafka's AvroDeserializer while Schema Registry is unreachable raises a
    connection error) made valid records malformed: dead-lettered for good. A ConnectionError,
    TimeoutError or UnavailableError is now an outage: the consumer rewinds and re-reads the
    record after a backoff (stats().store_outages), and handles it once the service is back."""
    topic, dlq = new_topic(1), new_topic(1, prefix="dlq")
    produce(kafka_bootstrap, topic, [order_value(n) for n in range(3)])
    registry_down = [True]

    def deserializer(raw: bytes) -> Any:  # AvroDeserializer with the registry unreachable
        if registry_down[0]:
            raise ConnectionError("Schema Registry: connection refused")
        return json.loads(raw)

    rules = PlainRecords(deserializer=deserializer, id_rule=order_id, lifetime=Lifetime(ttl_s=600))
    seen: Counter[int] = Counter()
    consumer = make([topic], counting(seen), plain_records=rules, dead_letter_topic=dlq)
    deadline = time.monotonic() + 30
    while consumer.stats().store_outages < 2 and time.monotonic() < deadline:
        consumer.poll_once()  # the registry is down for these polls
    assert consumer.stats().store_outages >= 2
    assert seen == Counter()
    registry_down[0] = False
    drain([consumer], lambda: len(seen) >= 3)
    assert seen == Counter(range(3))
    assert consumer.stats().dead_lettered == 0
    assert read_all(kafka_bootstrap, dlq, 1, timeout_s=3) == []
