"""A producer's header-format headers (producer/record_headers.py) are write_headers' own,
name for name and in order, with their size as header_bytes counts it; the limits refuse
what a consumer would."""

from __future__ import annotations

import json
import uuid

import pytest
from hypothesis import given
from hypothesis import strategies as st

from eoguard.codec.headers import write_headers
from eoguard.codec.rules import InputLimits, header_bytes
from eoguard.errors import InvalidMessageError
from eoguard.producer.record_headers import RecordHeaders
from eoguard.store.outbox_types import OutboxRecord, record_body

PRODUCER, SOURCE = "host-1-abcdef12", "/orders"


def defined(mid: str, created: int, expires: int, schema: str | None,
            app: dict[str, str] | None) -> dict[str, str]:
    return write_headers(mid, created, expires, attempt=1, producer=PRODUCER, source=SOURCE,
                         schema=schema, app=app)


@given(created=st.integers(0, 2**42), ttl=st.integers(1, 2**36),
       schema=st.sampled_from([None, "shop.Order", "eoguard.example.Órder"]),
       app=st.one_of(st.none(), st.just({}),
                     st.dictionaries(st.text("abcé-_", min_size=1, max_size=8),
                                     st.text(max_size=12), max_size=4)))
def test_the_headers_and_their_size_are_write_headers_own(created: int, ttl: int,
                                                           schema: str | None,
                                                           app: dict[str, str] | None) -> None:
    writer = RecordHeaders(producer=PRODUCER, source=SOURCE, limits=InputLimits())
    mid = str(uuid.uuid4())
    for _ in range(2):  # the template's first use, then a copy of it
        headers, size, text = writer.write(mid, created, created + ttl, schema, app)
        assert list(headers.items()) == list(defined(mid, created, created + ttl, schema,
                                                     app).items())
        assert size == header_bytes(headers)
        assert text in (None, json.dumps(headers).encode())  # the outbox's JSON of them
        assert (text is None) == bool(app)


@pytest.mark.parametrize("producer", [PRODUCER, "<eoguard:id>", 'host "1"\u00e9\n'])
def test_the_outbox_record_of_a_send_is_the_one_json_dumps_gives(producer: str) -> None:
    """The JSON made from the template is json.dumps', even for a producer id holding a mark
    (not cut then) or characters JSON escapes."""
    writer = RecordHeaders(producer=producer, source=SOURCE, limits=InputLimits())
    mid = str(uuid.uuid4())
    for _ in range(2):
        headers, _, text = writer.write(mid, 1_800_000_000_123, 1_800_000_600_123,
                                        "shop.Order", None)
        assert (text is None) == (producer == "<eoguard:id>")  # a mark in a value: not cut
        fields = {"id": mid, "topic": "orders", "key": b"k", "value": b"v", "created_at_ms": 1,
                  "expires_at_ms": 2, "headers": headers}
        assert record_body(OutboxRecord(headers_json=text, **fields), b"published") == \
            record_body(OutboxRecord(**fields), b"published")


def test_the_headers_a_consumer_counts_are_held_to_the_limits_on_every_send() -> None:
    tight = RecordHeaders(producer=PRODUCER, source=SOURCE, limits=InputLimits(header_count=1))
    for _ in range(2):  # ce_source and ce_type: two counted headers, never cached as fine
        with pytest.raises(InvalidMessageError, match="2 headers"):
            tight.write(str(uuid.uuid4()), 1, 2, "shop.Order", None)
    three = RecordHeaders(producer=PRODUCER, source=SOURCE, limits=InputLimits(header_count=3))
    three.write(str(uuid.uuid4()), 1, 2, None, {"trace": "t"})
    with pytest.raises(InvalidMessageError, match="ce_source and ce_type included"):
        three.write(str(uuid.uuid4()), 1, 2, None, {"trace": "t", "span": "s"})
