"""The header wire format on real Kafka, Redis and Schema Registry: what a GuardedProducer
writes is what any registry client reads; a GuardedConsumer reads what plain registry clients
write (consumers first), both formats and plain records on one topic, each order once per
scope; bad records are dead-lettered with their reason and nothing else stops; payloads are
read by writer schema id into the reader's version; a resend keeps the headers."""

from __future__ import annotations

import copy
import datetime as dt
import json
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections import Counter
from decimal import Decimal
from typing import Any
from urllib.parse import urlsplit

import pytest
import redis
from confluent_kafka import Producer
from confluent_kafka.schema_registry import Schema, SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroDeserializer, AvroSerializer
from confluent_kafka.serialization import MessageField, SerializationContext

from eoguard import (
    InputLimits,
    InvalidMessageError,
    KeepUntil,
    Lifetime,
    PlainRecords,
    ReservedHeaderError,
    SchemaRefusedError,
    SchemaRegistry,
    SchemaRegistryConfig,
    UnknownSchemaIdError,
    WireFormat,
    message_id_for,
)
from eoguard.codec import EnvelopeCodec
from eoguard.codec.headers import (
    ATTEMPT,
    CONTENT_TYPE,
    EXPIRY_TIME,
    ID,
    SPEC_VERSION,
    TIME,
    TYPE,
    parse_time,
    write_headers,
)
from eoguard.codec.plain import id_from_field
from eoguard.codec.registry_payloads import RegistryPayloads, frame
from eoguard.consumer.handler import HandlerContext
from eoguard.envelope import derived_message_id, now_ms
from eoguard.producer.guarded import GuardedProducer
from eoguard.store.keys import KeySpace
from tests.conftest import free_port
from tests.consumer_kit import drain, headers_of, read_all
from tests.integration.test_consumer_plain import counted, plain_producer
from tests.integration.test_producer import make_config
from tests.schema_versions import ORDER, order_schema, schema_dir

pytestmark = pytest.mark.integration


def an_order(number: int) -> dict[str, Any]:
    return {"order_id": str(number), "customer": f"c{number % 7}",
            "amount": Decimal(f"{number}.25"), "currency": "EUR",
            "items": [{"sku": f"s{number}", "qty": 1 + number % 3, "unit_price": 2.5}],
            "created_at": dt.datetime(2026, 11, 28, 8, number % 60, tzinfo=dt.timezone.utc),
            "express": number % 2 == 0, "attributes": {"channel": "web"}, "note": None}


def registry(url: str, **kw: Any) -> SchemaRegistryConfig:
    return SchemaRegistryConfig(url=url, **kw)


def header_producer(kafka_bootstrap: str, redis_url: str, key_prefix: str, url: str,
                    **kw: Any) -> GuardedProducer:
    schemas = kw.pop("schemas", None)
    config = make_config(kafka_bootstrap, redis_url, key_prefix, wire_format=WireFormat.HEADERS,
                         schema_registry=registry(url, **kw.pop("registry", {})), **kw)
    return GuardedProducer(config, registry=schemas)


def avro_serializer(client: SchemaRegistryClient) -> AvroSerializer:
    """What a team already has: confluent-kafka's serializer with the Order schema."""
    return AvroSerializer(client, json.dumps(order_schema("older")))


def value_context(topic: str) -> SerializationContext:
    return SerializationContext(topic, MessageField.VALUE)


def order_number(ctx: HandlerContext) -> int:
    return int(ctx.payload["order_id"])


def counting(seen: Counter[int]) -> Any:
    def handle(ctx: HandlerContext) -> None:
        number = order_number(ctx)
        assert ctx.message_id == message_id_for("orders", str(number))
        ctx.tx.hincrby(ctx.key_for("orders"), str(number), 1)
        seen[number] += 1
    return handle


def test_a_plain_avro_deserializer_reads_every_payload_a_guarded_producer_wrote(
        kafka_bootstrap, redis_url, key_prefix, new_topic, schema_registry_url,
        schema_registry_client) -> None:
    topic = new_topic(2)
    count = 60
    with header_producer(kafka_bootstrap, redis_url, key_prefix, schema_registry_url) as producer:
        handles = [producer.send(topic, an_order(n), key=str(n).encode(), schema=ORDER,
                                 headers={"trace": f"t-{n}"}) for n in range(count)]
        assert producer.flush(30) == 0
    assert all(h.wait(10) for h in handles)
    records = read_all(kafka_bootstrap, topic, count)
    assert len(records) == count

    deserializer = AvroDeserializer(schema_registry_client)
    serializer = avro_serializer(schema_registry_client)
    by_id = {h.id: (n, h) for n, h in enumerate(handles)}
    for record in records:
        heads = headers_of(record)
        number, handle = by_id[heads[ID]]
        assert deserializer(record.value(), value_context(topic)) == an_order(number)
        # the body a plain AvroSerializer writes for the same order, byte for byte
        assert record.value()[5:] == serializer(an_order(number), value_context(topic))[5:]
        assert heads[SPEC_VERSION] == "1.0"
        assert heads[TYPE] == ORDER
        assert heads[CONTENT_TYPE] == "application/avro"
        assert heads[ATTEMPT] == "1"
        assert parse_time(heads[EXPIRY_TIME]) == handle.expires_at_ms
        assert parse_time(heads[TIME]) <= handle.expires_at_ms
        assert heads["trace"] == f"t-{number}"


def _plain_orders(kafka_bootstrap: str, topic: str, client: SchemaRegistryClient,
                  numbers: list[int]) -> int:
    """Orders sent by a plain producer through AvroSerializer."""
    serializer = avro_serializer(client)
    producer = plain_producer(kafka_bootstrap)
    for number in numbers:
        producer.produce(topic, serializer(an_order(number), value_context(topic)),
                         key=f"c{number % 7}".encode())
    producer.flush(30)
    return len(numbers)


def orders_rule(topic: str, client: SchemaRegistryClient) -> PlainRecords:
    """The consumer-first rules for a plain AvroSerializer topic: the AvroDeserializer, the
    id from the order number."""
    deserializer = AvroDeserializer(client)
    return PlainRecords(deserializer=lambda raw: deserializer(raw, value_context(topic)),
                        id_rule=id_from_field("orders", "order_id"),
                        lifetime=Lifetime(ttl_s=600))


def test_a_guarded_consumer_handles_a_plain_avro_serializer_producer_once_per_scope(
        make, new_topic, kafka_bootstrap, redis_client: redis.Redis, key_prefix,
        schema_registry_url, schema_registry_client) -> None:
    topic = new_topic(4)
    count = 150
    # the first life of the producer, copies injected; restarted, it resends 120-149
    first = list(range(120)) + [n for n in range(120) if n % 9 == 0]
    records = _plain_orders(kafka_bootstrap, topic, schema_registry_client, first)
    records += _plain_orders(kafka_bootstrap, topic, schema_registry_client,
                             list(range(100, count)))
    handled_once_per_scope(make, topic, schema_registry_client, schema_registry_url, redis_client,
                           key_prefix, records=records, count=count)


def handled_once_per_scope(make: Any, topic: str, client: SchemaRegistryClient, url: str,
                           redis_client: redis.Redis, key_prefix: str, *, records: int,
                           count: int, **kw: Any) -> None:
    """Consumers of two scopes, reading plain records with :func:`orders_rule`, handle orders
    0 to ``count`` - 1 once each (effects counted in Redis), after polling ``records``."""
    scopes = ("billing", "shipping")
    seen = {scope: Counter[int]() for scope in scopes}
    consumers = [make([topic], counting(seen[scope]), scope=scope, batch_size=50,
                      plain_records=orders_rule(topic, client),
                      schema_registry=registry(url), **kw) for scope in scopes]
    drain(consumers, lambda: all(c.stats().polled >= records for c in consumers)
          and all(len(s) >= count for s in seen.values()), timeout_s=120)
    want = Counter(range(count))
    for consumer, scope in zip(consumers, scopes, strict=True):
        assert seen[scope] == want, scope
        assert counted(redis_client, key_prefix, scope) == want, scope
        stats = consumer.stats()
        print(f"{scope}: polled={stats.polled} handled={stats.handled} "
              f"duplicates={stats.duplicates}")
        assert stats.handled == count, scope
        assert stats.dead_lettered == 0, scope


@pytest.mark.cluster  # the header format's outbox records and claims on Redis Cluster too
def test_one_topic_with_envelopes_header_records_and_plain_records_each_order_once(
        make, new_topic, kafka_bootstrap, redis_url, redis_client: redis.Redis, key_prefix,
        schema_registry_url, schema_registry_client) -> None:
    topic = new_topic(3)
    count = 150
    ids = {n: message_id_for("orders", str(n)) for n in range(count)}
    # Records deleted once Kafka has them: the moved producer sends 50-99 again.
    with GuardedProducer(make_config(kafka_bootstrap, redis_url, key_prefix,
                                     keep_until=KeepUntil.PUBLISHED)) as envelopes:
        for n in range(100):  # the envelope producer: 0-99
            envelopes.send(topic, an_order(n), key=str(n).encode(), schema=ORDER,
                           message_id=ids[n])
        assert envelopes.flush(30) == 0
        records = envelopes.stats().published
    with header_producer(kafka_bootstrap, redis_url, key_prefix, schema_registry_url) as moved:
        for n in range(50, count):  # moved to the header format: 50-149
            moved.send(topic, an_order(n), key=str(n).encode(), schema=ORDER, message_id=ids[n])
        assert moved.flush(30) == 0
        records += moved.stats().published
    # a plain producer not moved yet: 120-149 and 0-19
    plain = _plain_orders(kafka_bootstrap, topic, schema_registry_client,
                          list(range(120, count)) + list(range(20)))
    records += plain
    handled_once_per_scope(make, topic, schema_registry_client, schema_registry_url, redis_client,
                           key_prefix, records=records, count=count, shards=8)


def _marked(ttl_ms: int = 600_000, **changes: bytes | None) -> list[tuple[str, bytes | None]]:
    created = now_ms()
    heads = write_headers(str(uuid.uuid4()), created, created + ttl_ms, attempt=1,
                          producer="foreign", source="/test", schema=ORDER, app=None)
    out: list[tuple[str, bytes | None]] = [(k, v.encode()) for k, v in heads.items()
                                           if k not in changes]
    out += [(k, v) for k, v in changes.items() if v is not None]
    return out


def test_bad_records_are_dead_lettered_with_their_reason_and_the_rest_handled(
        make, new_topic, kafka_bootstrap, redis_url, key_prefix, schema_registry_url,
        schema_registry_client) -> None:
    topic = new_topic(1)
    with header_producer(kafka_bootstrap, redis_url, key_prefix, schema_registry_url) as good:
        first = good.send(topic, an_order(1), schema=ORDER)  # registers the schema
        assert good.flush(30) == 0
    known = schema_registry_client.get_latest_version(f"{topic}-value").schema_id
    body = avro_serializer(schema_registry_client)(an_order(2), value_context(topic))[5:]
    bad = {
        "bad prefix": (b'{"order_id": "3"}', _marked(),
                       "starts with 7b, expected 00"),
        "unknown id": (frame(2_000_000_001, body), _marked(),
                       "schema id 2000000001 is not in Schema Registry"),
        "missing expiry": (frame(known, body), _marked(ce_expirytime=None),
                           "missing header ce_expirytime"),
        "malformed time": (frame(known, body), _marked(ce_time=b"yesterday"),
                           "ce_time 'yesterday' is not an RFC 3339 time"),
        "malformed id": (frame(known, body), _marked(ce_id=b"order-3"),
                         "id 'order-3' (7 characters) is not a UUID"),
        "corrupt body": (frame(known, b"\x02\xff\xff\xff\xff"), _marked(),
                         f"payload is not a valid {ORDER} record"),
    }
    raw = Producer({"bootstrap.servers": kafka_bootstrap})
    for value, heads, _ in bad.values():
        raw.produce(topic, value, headers=heads)
    raw.flush(30)
    with header_producer(kafka_bootstrap, redis_url, key_prefix, schema_registry_url) as good:
        last = good.send(topic, an_order(4), schema=ORDER)
        assert good.flush(30) == 0
    seen: list[str] = []
    consumer = make([topic], lambda ctx: seen.append(ctx.message_id), shards=8,
                    schema_registry=registry(schema_registry_url))
    drain([consumer], lambda: consumer.stats().polled >= len(bad) + 2)
    assert sorted(seen) == sorted([first.id, last.id])
    assert consumer.stats().dead_lettered == len(bad)
    letters = read_all(kafka_bootstrap, consumer.config.dead_letter, len(bad))
    reasons = sorted(headers_of(m)["eoguard.error.reason"] for m in letters)
    assert len(reasons) == len(bad)
    for name, (_, _, want) in bad.items():
        assert any(want in reason for reason in reasons), (name, want, reasons)


class CountingClient:
    """The real registry client, its fetches by id counted."""

    def __init__(self, client: SchemaRegistryClient) -> None:
        self.client = client
        self.fetched: list[int] = []

    def get_schema(self, schema_id: int, *args: Any, **kw: Any) -> Any:
        self.fetched.append(schema_id)
        return self.client.get_schema(schema_id, *args, **kw)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.client, name)


def test_a_flood_of_an_unknown_schema_id_asks_the_registry_once_per_newer_record(
        schema_registry_client) -> None:
    """Records created before the registry said "unknown" reuse the answer (one question for
    the flood); one created after it is asked about again (its id may be registered since)."""
    counting = CountingClient(schema_registry_client)
    payloads = RegistryPayloads(counting)
    unknown = frame(2_000_000_003, b"\x02")
    before = now_ms() - 1000  # created a second before the first question
    for _ in range(300):
        with pytest.raises(UnknownSchemaIdError, match="2000000003 is not in Schema Registry"):
            payloads.decode(unknown, before)
    assert counting.fetched == [2_000_000_003]
    with pytest.raises(UnknownSchemaIdError):
        payloads.decode(unknown, now_ms() + 1)  # created after the question
    assert counting.fetched == [2_000_000_003] * 2


def test_a_handlers_outputs_are_envelopes_whatever_the_inputs_format(
        make, new_topic, kafka_bootstrap, redis_url, key_prefix, schema_registry_url) -> None:
    """ctx.output writes envelopes (a consumer has no wire format of its own, docs/design.md
    §3): an output of a header-format input carries eoguard's fields in its value, no ce_*
    headers, its id derived from the input's."""
    source, sink = new_topic(1), new_topic(1)
    with header_producer(kafka_bootstrap, redis_url, key_prefix, schema_registry_url) as good:
        sent = good.send(source, an_order(3), schema=ORDER)
        assert good.flush(30) == 0
    consumer = make([source], lambda ctx: ctx.output(sink, b"shipped", key=b"3"), shards=8,
                    schema_registry=registry(schema_registry_url))
    drain([consumer], lambda: consumer.stats().handled >= 1)
    (out,) = read_all(kafka_bootstrap, sink, 1)
    assert out.headers() is None
    envelope = EnvelopeCodec().decode(out.value())
    assert (envelope.id, envelope.payload) == (derived_message_id(sent.id, 0), b"shipped")


def test_a_send_may_not_use_eoguards_header_names(kafka_bootstrap, redis_url, key_prefix,
                                                   new_topic, schema_registry_url) -> None:
    topic = new_topic(1)
    with header_producer(kafka_bootstrap, redis_url, key_prefix, schema_registry_url) as producer:
        with pytest.raises(ReservedHeaderError) as caught:
            producer.send(topic, b"x", headers={"CE_ID": "mine"})
        assert caught.value.header == "CE_ID"
        producer.send(topic, b"{}", headers={"content-type": "application/json",
                                              "ce_type": "shop.order.created"})
        assert producer.flush(30) == 0
    (record,) = read_all(kafka_bootstrap, topic, 1)
    assert headers_of(record)["content-type"] == "application/json"
    assert headers_of(record)["ce_type"] == "shop.order.created"


def test_a_registry_refusal_names_the_subject_and_version(
        kafka_bootstrap, redis_url, key_prefix, new_topic, schema_registry_url, schema_registry_client,
        tmp_path) -> None:
    topic = new_topic(1)
    subject = f"{topic}-value"
    with header_producer(kafka_bootstrap, redis_url, key_prefix, schema_registry_url,
                         registry={"auto_register": False}) as producer, \
            pytest.raises(SchemaRefusedError) as unregistered:
        producer.send(topic, an_order(1), schema=ORDER)
    assert (unregistered.value.subject, unregistered.value.registered) == (subject, False)
    schema_registry_client.register_schema(subject, Schema(json.dumps(order_schema("older")), "AVRO"))
    schema_registry_client.set_compatibility(subject, "BACKWARD")
    incompatible = copy.deepcopy(order_schema("older"))
    incompatible["fields"].append({"name": "region", "type": "string"})  # no default
    breaking = schema_dir(tmp_path, "older")  # a copy of schemas/, the Order schema changed:
    (breaking / "order.avsc").write_text(json.dumps(incompatible))
    with header_producer(kafka_bootstrap, redis_url, key_prefix, schema_registry_url,
                         schemas=SchemaRegistry.from_dir(breaking)) as producer, \
            pytest.raises(SchemaRefusedError) as refused:
        producer.send(topic, {**an_order(1), "region": "eu"}, schema=ORDER)
    assert (refused.value.subject, refused.value.version) == (subject, 1)
    assert subject in str(refused.value)


def test_payloads_are_read_by_writer_id_into_the_readers_version(
        make, new_topic, kafka_bootstrap, redis_url, key_prefix, schema_registry_url,
        tmp_path) -> None:
    topic = new_topic(1)
    older = SchemaRegistry.from_dir(schema_dir(tmp_path, "older"))
    newer = SchemaRegistry.from_dir(schema_dir(tmp_path, "newer"))
    with header_producer(kafka_bootstrap, redis_url, key_prefix, schema_registry_url,
                         schemas=older) as producer:
        for n in range(5):
            producer.send(topic, an_order(n), schema=ORDER)
        assert producer.flush(30) == 0
    renewed = {k: v for k, v in an_order(9).items() if k != "note"} | {"gift_wrap": True}
    with header_producer(kafka_bootstrap, redis_url, key_prefix, schema_registry_url,
                         schemas=newer) as producer:
        producer.send(topic, renewed, schema=ORDER)
        assert producer.flush(30) == 0
    ids = {m.value()[1:5] for m in read_all(kafka_bootstrap, topic, 6)}
    assert len(ids) == 2  # two writer versions, two schema ids
    for reader, check in ((newer, lambda p: p["gift_wrap"] is (p["order_id"] == "9")),
                          (older, lambda p: p["note"] is None and "gift_wrap" not in p)):
        payloads = _read_payloads(make, topic, schema_registry_url, reader, 6)
        assert sorted(p["order_id"] for p in payloads) == ["0", "1", "2", "3", "4", "9"]
        assert all(check(p) for p in payloads)


def _read_payloads(make: Any, topic: str, url: str, reader: SchemaRegistry, count: int
                   ) -> list[dict[str, Any]]:
    """The payloads a GuardedConsumer whose schemas are ``reader`` hands its handler."""
    payloads: list[dict[str, Any]] = []
    consumer = make([topic], lambda ctx: payloads.append(ctx.payload),
                    scope=f"read-{uuid.uuid4().hex[:6]}", shards=8,  # a scope of its own
                    schema_registry=registry(url), registry=reader)
    drain([consumer], lambda: len(payloads) >= count)
    return payloads


def test_a_resend_from_the_outbox_keeps_the_headers_and_raises_the_attempt(
        kafka_bootstrap, redis_url, key_prefix, new_topic) -> None:
    topic = new_topic(1)
    keys = KeySpace(prefix=key_prefix, shards=8)
    dead = make_config(f"127.0.0.1:{free_port()}", redis_url, key_prefix, keyspace=keys,
                       wire_format=WireFormat.HEADERS, recover_on_start=False,
                       kafka={"message.timeout.ms": 1000}, resend_after_s=2)
    with GuardedProducer(dead) as lost:  # persist-first: in the outbox, never on Kafka
        handle = lost.send(topic, b'{"order": 7}', headers={"trace": "t-7"})
        assert handle.wait(10)
        lost.close(timeout_s=1)
    alive = make_config(kafka_bootstrap, redis_url, key_prefix, keyspace=keys)
    with GuardedProducer(alive) as recovering:  # recovers at start
        assert recovering.flush(30) == 0
        assert recovering.stats().resent == 1
    (record,) = read_all(kafka_bootstrap, topic, 1)
    heads = headers_of(record)
    assert record.value() == b'{"order": 7}'
    assert (heads[ID], heads[ATTEMPT], heads["trace"]) == (handle.id, "2", "t-7")
    assert parse_time(heads[EXPIRY_TIME]) == handle.expires_at_ms


def test_the_headers_a_consumer_counts_stay_within_input_limits(
        kafka_bootstrap, redis_url, key_prefix, new_topic, schema_registry_url) -> None:
    """ce_source and ce_type count as the application's, as a consumer counts them."""
    topic = new_topic(1)
    limits = InputLimits(header_count=3)
    with header_producer(kafka_bootstrap, redis_url, key_prefix, schema_registry_url,
                         input_limits=limits) as producer:
        producer.send(topic, b"x", headers={"trace": "t"})  # 3 counted: within
        with pytest.raises(InvalidMessageError, match="ce_source and ce_type included"):
            producer.send(topic, b"x", headers={"trace": "t", "span": "s"})
    with header_producer(kafka_bootstrap, redis_url, key_prefix, schema_registry_url,
                         input_limits=InputLimits(header_count=1)) as producer, \
            pytest.raises(InvalidMessageError, match="2 headers"):
        producer.send(topic, b"x")


def test_a_registry_outage_is_retried_never_dead_lettered(
        make, new_topic, kafka_bootstrap, redis_url, key_prefix, schema_registry_url) -> None:
    """A consumer that cannot reach the registry rewinds and re-reads (a store outage in its
    stats), commits nothing past the record; one that can then handles it."""
    topic = new_topic(1)
    with header_producer(kafka_bootstrap, redis_url, key_prefix, schema_registry_url) as good:
        sent = good.send(topic, an_order(5), schema=ORDER)
        assert good.flush(30) == 0
    group = f"g-{uuid.uuid4().hex[:8]}"
    seen: list[str] = []
    down = make([topic], lambda ctx: seen.append(ctx.message_id), shards=8, group=group,
                schema_registry=registry(f"http://127.0.0.1:{free_port()}"))
    drain([down], lambda: down.stats().store_outages >= 2, timeout_s=120)
    assert (seen, down.stats().dead_lettered, down.stats().handled) == ([], 0, 0)
    down.close()
    up = make([topic], lambda ctx: seen.append(ctx.message_id), shards=8, group=group,
              schema_registry=registry(schema_registry_url))
    drain([up], lambda: bool(seen))
    assert seen == [sent.id]


_RELAY = """
import socket, sys, threading
up = ("127.0.0.1", int(sys.argv[2]))
srv = socket.create_server(("127.0.0.1", int(sys.argv[1])))
def pipe(a, b):
    try:
        while data := a.recv(65536):
            b.sendall(data)
    except OSError:
        pass
    for s in (a, b):
        try:
            s.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
while True:
    c, _ = srv.accept()
    u = socket.create_connection(up)
    threading.Thread(target=pipe, args=(c, u), daemon=True).start()
    threading.Thread(target=pipe, args=(u, c), daemon=True).start()
"""


def test_a_registry_that_hangs_mid_stream_rewinds_the_batch_in_order(
        make, new_topic, kafka_bootstrap, redis_url, key_prefix, schema_registry_url,
        tmp_path) -> None:
    """The registry stops answering (its process stopped: here a relay in front of it, this
    test's own) after a consumer cached one writer id and before it meets another: nothing is
    dead-lettered, the batch is re-read once it answers, every order handled once, in order.
    The consumer's client has eoguard's default bound on a request (no ``timeout`` given: a
    client without one would wait in ``recv`` for good)."""
    topic = new_topic(1)
    older = SchemaRegistry.from_dir(schema_dir(tmp_path, "older"))
    newer = SchemaRegistry.from_dir(schema_dir(tmp_path, "newer"))
    sent: list[str] = []
    with header_producer(kafka_bootstrap, redis_url, key_prefix, schema_registry_url,
                         schemas=older) as producer:
        sent += [producer.send(topic, an_order(n), schema=ORDER).id for n in range(5)]
        assert producer.flush(30) == 0
    url = urlsplit(schema_registry_url)
    port = free_port()
    relay = subprocess.Popen([sys.executable, "-c", _RELAY, str(port), str(url.port)])
    try:
        deadline = time.monotonic() + 30
        while True:  # the relay listens
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert time.monotonic() < deadline
                time.sleep(0.05)
        seen: list[str] = []
        consumer = make([topic], lambda ctx: seen.append(ctx.message_id), shards=8,
                        batch_size=2,
                        schema_registry=registry(
                            f"http://127.0.0.1:{port}{url.path}", options={"max.retries": 0}))
        drain([consumer], lambda: len(seen) >= len(sent))  # the older writer id cached
        os.kill(relay.pid, signal.SIGSTOP)
        renewed = {k: v for k, v in an_order(9).items() if k != "note"} | {"gift_wrap": True}
        with header_producer(kafka_bootstrap, redis_url, key_prefix, schema_registry_url,
                             schemas=newer) as producer:
            sent.append(producer.send(topic, renewed, schema=ORDER).id)
            assert producer.flush(30) == 0
        with header_producer(kafka_bootstrap, redis_url, key_prefix, schema_registry_url,
                             schemas=older) as producer:
            sent += [producer.send(topic, an_order(n), schema=ORDER).id for n in (5, 6)]
            assert producer.flush(30) == 0
        drain([consumer], lambda: consumer.stats().store_outages >= 2, timeout_s=120)
        assert consumer.stats().dead_lettered == 0
        assert seen == sent[:len(seen)]
        os.kill(relay.pid, signal.SIGCONT)
        drain([consumer], lambda: len(seen) >= len(sent), timeout_s=120)
        assert consumer.stats().dead_lettered == 0
        assert seen == sent
    finally:
        os.kill(relay.pid, signal.SIGCONT)
        relay.kill()
        relay.wait()
