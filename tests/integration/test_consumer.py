"""GuardedConsumer against real Kafka and Redis: duplicates, scopes, expiry, dead letters,
retries, transactional effects, read-process-write, outbox acknowledgement, busy claims,
liveness leases."""

from __future__ import annotations

import os
import time
import uuid
from collections import Counter
from datetime import datetime, timezone
from decimal import Decimal
from typing import Any

import pytest
import redis

from eoguard.codec import InputLimits, PayloadCodec
from eoguard.config import KeepUntil
from eoguard.consumer.handler import HandlerContext
from eoguard.envelope import derived_message_id, now_ms
from eoguard.stack.feed import envelope, produce
from eoguard.store.dedup import Claim, DedupStore, position
from eoguard.store.keys import KeySpace
from eoguard.store.liveness import Liveness
from eoguard.store.outbox import Outbox, OutboxRecord
from tests.consumer_kit import CODEC, claims_by_script, drain, headers_of, read_all, recorder

pytestmark = pytest.mark.integration


@pytest.mark.cluster
def test_same_message_twice_is_handled_once(make, new_topic, kafka_bootstrap) -> None:
    topic = new_topic(2)
    dup = envelope(b"the one")
    others = [envelope(b"other %d" % i) for i in range(20)]
    # Duplicate produce of the same bytes, and a resend with attempt + 1.
    produce(kafka_bootstrap, topic, [dup, *others[:10], dup, dup.with_attempt(2), *others[10:]])
    seen, handler = recorder()
    consumer = make([topic], handler)
    drain([consumer], lambda: len(seen) >= 21 and consumer.stats().duplicates >= 2)
    assert Counter(seen) == Counter([dup.id, *(e.id for e in others)])
    stats = consumer.stats()
    assert stats.duplicates == 2
    assert stats.claim_round_trips > 0
    assert stats.redis_wait_s > 0  # its replies were waited on, at least at the start
    # Another group of the same scope re-reads all 23 records: all duplicates.
    again, handler2 = recorder()
    second = make([topic], handler2)
    drain([second], lambda: second.stats().duplicates >= 23)
    assert again == []


@pytest.mark.cluster
@pytest.mark.parametrize("claims", ["script", "fresh"])
def test_copies_in_the_batches_read_ahead_are_handled_once(make, new_topic, kafka_bootstrap,
                                                            claims, monkeypatch) -> None:
    # Batches of 5 on one partition, each group of 5 resent in the batch right after it.
    # That batch's claims go out before the done marks of the group land, so its copies
    # are BUSY, held by this very consumer: claimed again once those done marks landed,
    # they are DONE: never handled twice, never skipped. With the script alone ("script") the
    # BUSY path is taken; a fresh pass ("fresh", the default) claims a copy that found a key
    # once its round trip landed, the group's done marks with it, so it may be DUPLICATE at once.
    if claims == "script":
        claims_by_script(monkeypatch)
    topic = new_topic(1)
    envs = [envelope(b"m%d" % i) for i in range(40)]
    records: list[Any] = []
    for start in range(0, 40, 5):
        records += [*envs[start:start + 5], *(e.with_attempt(2) for e in envs[start:start + 5])]
    produce(kafka_bootstrap, topic, records, partition=0)
    seen, handler = recorder()
    consumer = make([topic], handler, batch_size=5)
    drain([consumer], lambda: len(seen) >= 40 and consumer.stats().duplicates >= 40)
    stats = consumer.stats()
    print(f"handled={stats.handled} duplicates={stats.duplicates} "
          f"busy waits={stats.busy_waits} skipped={stats.busy_skipped}")
    assert Counter(seen) == Counter(e.id for e in envs)
    assert stats.duplicates == 40
    assert stats.busy_skipped == 0
    if claims == "script":
        assert stats.busy_waits > 0  # the path this test is about was taken
    assert stats.handled == 40


def test_two_scopes_each_handle_once(make, new_topic, kafka_bootstrap) -> None:
    topic = new_topic(3)
    envs = [envelope() for _ in range(30)]
    produce(kafka_bootstrap, topic, [*envs, *envs[:5]])
    seen_a, handler_a = recorder()
    seen_b, handler_b = recorder()
    a = make([topic], handler_a, scope="billing")
    b = make([topic], handler_b, scope="shipping")
    drain([a, b], lambda: a.stats().polled >= 35 and b.stats().polled >= 35)
    want = Counter(e.id for e in envs)
    assert Counter(seen_a) == want
    assert Counter(seen_b) == want


def test_expired_never_handled_and_dead_lettered_when_asked(make, new_topic,
                                                            kafka_bootstrap) -> None:
    topic, dlq = new_topic(2), new_topic(1, prefix="dlq")
    good = [envelope() for _ in range(5)]
    stale = [envelope(ttl_ms=-1_000) for _ in range(5)]
    produce(kafka_bootstrap, topic, [x for pair in zip(stale, good, strict=True) for x in pair])
    seen, handler = recorder()
    consumer = make([topic], handler, dead_letter_topic=dlq, expired_to_dead_letter=True)
    drain([consumer], lambda: consumer.stats().polled >= 10)
    assert sorted(seen) == sorted(e.id for e in good)
    assert consumer.stats().expired == 5
    letters = read_all(kafka_bootstrap, dlq, 5)
    assert sorted(headers_of(m)["eoguard.message.id"] for m in letters) == sorted(e.id for e in stale)
    assert {headers_of(m)["eoguard.error.kind"] for m in letters} == {"expired"}


def test_a_message_that_expires_while_its_batch_is_handled_never_reaches_the_handler(
        make, new_topic, kafka_bootstrap) -> None:
    # Found by the seeded chaos suite (cluster seed 2): a slow batch let a short-TTL message
    # expire after the batch's expiry check, and the handler saw it expired.
    topic = new_topic(1)
    short = envelope(b"short", ttl_ms=1_500)
    first = envelope(b"slow")
    produce(kafka_bootstrap, topic, [first, short], partition=0)
    seen: list[str] = []
    late: list[str] = []

    def handler(ctx: HandlerContext) -> None:
        if ctx.envelope.is_expired():
            late.append(ctx.message_id)
        seen.append(ctx.message_id)
        if ctx.message_id == first.id:  # the first of the batch takes past the second's expiry
            time.sleep(max(0.0, (short.expires_at_ms - now_ms()) / 1000 + 0.2))

    consumer = make([topic], handler, batch_size=10)
    drain([consumer], lambda: consumer.stats().polled >= 2 and consumer.stats().expired >= 1,
          timeout_s=30)
    assert seen == [first.id]
    assert late == []
    assert consumer.stats().expired == 1


@pytest.mark.cluster
def test_malformed_records_go_to_dead_letter_and_good_ones_around_them_are_handled(
        make, new_topic, kafka_bootstrap) -> None:
    topic, dlq = new_topic(1), new_topic(1, prefix="dlq")
    encoded = CODEC.encode(envelope(b"x" * 100))
    bad = {
        "random bytes": (os.urandom(64), "BadMagicError"),
        "wrong magic": (b"\xc3\x02" + encoded[2:], "BadMagicError"),
        "unknown fingerprint": (encoded[:2] + os.urandom(8) + encoded[10:], "UnknownFingerprintError"),
        "truncated avro": (encoded[: len(encoded) // 2], "CorruptRecordError"),
        "unknown payload schema": (CODEC.encode(envelope(payload_schema="no.such.Schema")),
                                   "SchemaNotFoundError"),
        "payload not its schema": (CODEC.encode(envelope(b"\xff\xff",
                                                         payload_schema="eoguard.example.Order")),
                                   "CorruptRecordError"),
        "empty value": (b"", "BadMagicError"),
    }
    good = [envelope() for _ in range(len(bad) + 1)]
    values: list[Any] = [good[0]]
    for (raw, _), env in zip(bad.values(), good[1:], strict=True):
        values += [raw, env]
    produce(kafka_bootstrap, topic, values)
    seen, handler = recorder()
    consumer = make([topic], handler, dead_letter_topic=dlq)
    drain([consumer], lambda: len(seen) >= len(good))
    assert sorted(seen) == sorted(e.id for e in good)
    letters = read_all(kafka_bootstrap, dlq, len(bad))
    assert len(letters) == len(bad)
    by_value = {m.value(): headers_of(m) for m in letters}
    for name, (raw, error_type) in bad.items():
        headers = by_value[raw]
        assert headers["eoguard.error.type"] == error_type, name
        assert headers["eoguard.error.kind"] == "malformed"
        assert headers["eoguard.error.reason"]
        assert headers["eoguard.source.topic"] == topic
        assert headers["eoguard.error.attempts"] == "0"
    assert consumer.stats().dead_lettered == len(bad)


def test_handler_failing_past_retries_goes_to_dead_letter_and_partition_moves_on(
        make, new_topic, kafka_bootstrap) -> None:
    topic, dlq = new_topic(1), new_topic(1, prefix="dlq")
    envs = [envelope() for _ in range(10)]
    poison, flaky = envs[2].id, envs[5].id
    produce(kafka_bootstrap, topic, envs)
    handled: list[str] = []
    calls: Counter[str] = Counter()

    def handler(ctx: HandlerContext) -> None:
        calls[ctx.message_id] += 1
        assert ctx.attempt == calls[ctx.message_id]
        if ctx.message_id == poison or (ctx.message_id == flaky and ctx.attempt < 3):
            raise ValueError(f"cannot handle {ctx.message_id}")
        handled.append(ctx.message_id)

    consumer = make([topic], handler, dead_letter_topic=dlq, max_retries=2)
    drain([consumer], lambda: len(handled) >= 9)
    assert sorted(handled) == sorted(e.id for e in envs if e.id != poison)
    assert calls[poison] == 3
    assert calls[flaky] == 3
    assert consumer.stats().retries == 4
    [letter] = read_all(kafka_bootstrap, dlq, 1)
    headers = headers_of(letter)
    assert letter.value() == CODEC.encode(envs[2])
    assert headers["eoguard.error.type"] == "ValueError"
    assert headers["eoguard.error.attempts"] == "3"
    assert poison in headers["eoguard.error.reason"]
    assert headers["eoguard.source.offset"] == "2"


def test_batch_handler_failures_are_per_message(make, new_topic, kafka_bootstrap) -> None:
    topic, dlq = new_topic(1), new_topic(1, prefix="dlq")
    envs = [envelope() for _ in range(8)]
    produce(kafka_bootstrap, topic, envs)
    handled: list[str] = []

    def batch(contexts):
        failed = {c.message_id: RuntimeError("nope") for c in contexts if c.message_id == envs[3].id}
        handled.extend(c.message_id for c in contexts if c.message_id not in failed)
        return failed

    consumer = make([topic], batch_handler=batch, dead_letter_topic=dlq, max_retries=1)
    drain([consumer], lambda: consumer.stats().dead_lettered >= 1)
    assert sorted(handled) == sorted(e.id for e in envs if e.id != envs[3].id)
    assert consumer.stats().handled == 7


@pytest.mark.cluster
def test_transactional_effects_commit_once_and_atomically(make, new_topic, kafka_bootstrap,
                                                          redis_client: redis.Redis,
                                                          key_prefix: str) -> None:
    topic = new_topic(4)
    envs = [envelope() for _ in range(50)]
    bad = envelope(b"bad")
    produce(kafka_bootstrap, topic, [*envs, *envs[:10], bad, bad])
    trap = f"{key_prefix}:trap"
    redis_client.set(trap, "not a number")

    def handler(ctx: HandlerContext) -> None:
        ctx.tx.sadd(ctx.key_for("seen"), ctx.message_id)
        ctx.tx.incr(ctx.key_for(f"count:{ctx.message_id}"))
        if ctx.message_id == bad.id:
            ctx.tx.incr(trap)  # refused by the done script: nothing of this message applies

    consumer = make([topic], handler, max_retries=1, scope="tx")
    drain([consumer], lambda: consumer.stats().polled >= 62 and consumer.stats().dead_lettered >= 1)
    keys = consumer.config.keyspace
    seen: set[bytes] = set()
    for key in redis_client.scan_iter(match=keys.effect_pattern("tx", "seen"), count=1000):
        seen |= redis_client.smembers(key)
    assert seen == {e.id.encode() for e in envs}
    counts = [redis_client.get(keys.effect("tx", e.id, f"count:{e.id}")) for e in envs]
    assert counts == [b"1"] * len(envs)
    assert redis_client.get(keys.effect("tx", bad.id, f"count:{bad.id}")) is None
    stats = consumer.stats()
    assert stats.handled == 50
    assert stats.duplicates >= 10


def test_read_process_write_output_ids_are_deterministic(make, new_topic, kafka_bootstrap) -> None:
    source, sink = new_topic(2), new_topic(2)
    inputs = [envelope(b"in %d" % i) for i in range(6)]
    produce(kafka_bootstrap, source, inputs)

    def handler(ctx: HandlerContext) -> None:
        for i in range(2):
            ctx.output(sink, ctx.envelope.payload + b" -> %d" % i, key=ctx.message_id)

    # Two scopes reading the same inputs stand for a reprocessing of them.
    first = make([source], handler, scope="rpw-1")
    second = make([source], handler, scope="rpw-2")
    drain([first, second], lambda: first.stats().handled >= 6 and second.stats().handled >= 6)
    outputs = [CODEC.decode(m.value()) for m in read_all(kafka_bootstrap, sink, 24)]
    assert len(outputs) == 24
    want = {derived_message_id(e.id, i): e.payload + b" -> %d" % i for e in inputs for i in range(2)}
    assert Counter(o.id for o in outputs) == Counter(dict.fromkeys(want, 2))
    assert {o.id: o.payload for o in outputs} == want
    assert all(o.expires_at_ms == next(e for e in inputs if o.id in
                                       (derived_message_id(e.id, 0), derived_message_id(e.id, 1))
                                       ).expires_at_ms for o in outputs)
    # Downstream, the repeated outputs are duplicates.
    seen, recorder_handler = recorder()
    down = make([sink], recorder_handler, scope="downstream")
    drain([down], lambda: down.stats().polled >= 24)
    assert Counter(seen) == Counter(want.keys())
    assert down.stats().duplicates == 12


def test_payload_is_decoded_to_the_applications_form(make, new_topic, kafka_bootstrap) -> None:
    topic = new_topic(1)
    payloads = PayloadCodec()
    order = {"order_id": "o-1", "customer": "c-9", "amount": Decimal("12.50"),
             "currency": "EUR", "items": [{"sku": "s", "qty": 2, "unit_price": 6.25}],
             "created_at": datetime.now(timezone.utc).replace(microsecond=0), "express": True,
             "attributes": {"a": "b"}, "note": None}
    env = envelope(payloads.encode(order, "eoguard.example.Order"),
                   payload_schema="eoguard.example.Order")
    produce(kafka_bootstrap, topic, [env])
    got: list[Any] = []
    consumer = make([topic], lambda ctx: got.append(ctx.payload))
    drain([consumer], lambda: len(got) >= 1)
    assert got[0]["order_id"] == "o-1"
    assert got[0]["amount"] == order["amount"]
    assert got[0]["created_at"] == order["created_at"]


@pytest.mark.cluster
def test_handled_message_acknowledges_the_outbox(make, new_topic, kafka_bootstrap,
                                                 redis_client: redis.Redis, key_prefix) -> None:
    topic = new_topic(1)
    envs = [envelope() for _ in range(5)]
    outbox = Outbox(redis_client, KeySpace(prefix=key_prefix))
    outbox.put([OutboxRecord(id=e.id, topic=topic, key=None, value=CODEC.encode(e),
                             created_at_ms=e.created_at_ms, expires_at_ms=e.expires_at_ms)
                for e in envs], owner="p1", keep_until=KeepUntil.CONSUMED, resend_after_ms=60_000)
    assert all(outbox.get(e.id) is not None for e in envs)
    produce(kafka_bootstrap, topic, envs)
    seen, handler = recorder()
    consumer = make([topic], handler)
    drain([consumer], lambda: len(seen) >= 5)
    assert [outbox.get(e.id) for e in envs] == [None] * 5


def test_busy_claim_is_waited_on_then_taken_over_or_skipped(make, new_topic, kafka_bootstrap,
                                                            redis_client, key_prefix) -> None:
    topic = new_topic(1)
    lapsing, held = envelope(), envelope()
    keys = KeySpace(prefix=key_prefix)
    # Another owner (a consumer that died mid-handler) claimed both, with short and long leases.
    for env, lease_ms in ((lapsing, 1_000), (held, 120_000)):
        store = DedupStore(redis_client, scope="app", keys=keys, lease_ms=lease_ms)
        elsewhere = position("another-group", "elsewhere", 0, 1)
        store.claim(store.new_token(), [Claim(env.id, elsewhere, env.expires_at_ms)])
    produce(kafka_bootstrap, topic, [lapsing, held])
    seen, handler = recorder()
    started = now_ms()
    consumer = make([topic], handler, busy_wait_s=3.0)
    drain([consumer], lambda: consumer.stats().busy_skipped >= 1)
    assert seen == [lapsing.id]
    assert now_ms() - started >= 900
    assert consumer.stats().busy_waits >= 1


@pytest.mark.cluster
def test_dedup_keys_are_gone_after_expiry_plus_grace(make, new_topic, kafka_bootstrap,
                                                      redis_client, key_prefix) -> None:
    topic = new_topic(1)
    envs = [envelope(ttl_ms=6_000) for _ in range(20)]
    produce(kafka_bootstrap, topic, envs)
    seen, handler = recorder()
    consumer = make([topic], handler, grace_s=1.0, scope="short",
                    input_limits=InputLimits(clock_skew_ms=1_000))
    drain([consumer], lambda: len(seen) >= 20)
    keys = KeySpace(prefix=key_prefix)
    patterns = (keys.dedup_pattern("short"), keys.dedup_batch_pattern("short"))
    # Redis removes a key at its PEXPIRETIME, so no need to sleep until then: every claim
    # key and batch record must carry one, no later than the last expiry plus grace.
    last = max(e.expires_at_ms for e in envs) + 1_000
    first = min(e.expires_at_ms for e in envs) + 1_000
    for pattern in patterns:
        found = list(redis_client.scan_iter(match=pattern, count=1000))
        assert found, pattern  # claim keys and batch records exist
        for key in found:
            expire_at = redis_client.pexpiretime(key)
            assert first <= expire_at <= last, (key, expire_at, first, last)
    print(f"{len(envs)} messages: every dedup key of the scope expires within "
          f"[{first - now_ms()}, {last - now_ms()}] ms from now")


def test_running_consumer_is_live_and_gone_after_close(make, new_topic, kafka_bootstrap,
                                                        redis_client, key_prefix) -> None:
    topic = new_topic(1)
    live = Liveness(redis_client, KeySpace(prefix=key_prefix), role="consumers")
    seen, handler = recorder()
    idle = make([topic], handler)
    idle.poll_once()  # nothing to read: an idle consumer heartbeats too
    assert live.live().is_live(idle.instance_id)
    produce(kafka_bootstrap, topic, [envelope() for _ in range(5)])
    busy = make([topic], handler, scope="other")
    drain([busy], lambda: busy.stats().handled >= 5)
    assert len(seen) == 5
    deadlines = live.live().deadlines
    assert {idle.instance_id, busy.instance_id} <= set(deadlines)
    # The lease runs lease_s (30 s by default) from the last heartbeat, by Redis's clock.
    assert 0 < deadlines[busy.instance_id] - live.live().read_at_ms <= 30_000
    busy.close()
    assert not live.live().is_live(busy.instance_id)
    assert live.live().is_live(idle.instance_id)
    idle.close()
    assert live.live().deadlines == {}


def test_a_static_member_fenced_by_another_with_its_instance_id_fails_loudly(
        make, new_topic, kafka_bootstrap) -> None:
    # Found by the seeded chaos suite (cluster seed 4): after librdkafka's fatal "static
    # consumer fenced" error every poll and commit failed, and the consumer went on polling
    # as if Kafka were briefly down: its partitions never moved again.
    from eoguard.errors import ConsumerFencedError  # noqa: PLC0415

    topic = new_topic(1)
    produce(kafka_bootstrap, topic, [envelope() for _ in range(5)])
    group = f"g-{uuid.uuid4().hex[:8]}"
    static = {"group.id": group, "group.instance.id": "member-a"}
    seen, handler = recorder()
    first = make([topic], handler, kafka=static)
    drain([first], lambda: len(seen) >= 5)
    second = make([topic], handler, kafka=static)
    second.poll_once()  # joins under the same group.instance.id: the first is fenced

    def poll_both_for_a_minute() -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            first.poll_once()
            second.poll_once()

    with pytest.raises(ConsumerFencedError):
        poll_both_for_a_minute()
