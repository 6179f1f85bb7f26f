"""What a schema id fetch's answer means (``fetch_refusal``, shared by the consumer and the
Spark job) and the short-lived cache of unknown ids (``UnknownIds``): reused only for
records created before the question, within its TTL, for a bounded number of ids."""

from __future__ import annotations

import time

import httpx
import pytest
from confluent_kafka.schema_registry.error import SchemaRegistryError

from eoguard.codec.registry_payloads import UnknownIds, fetch_refusal
from eoguard.errors import RegistryUnavailableError, UnknownSchemaIdError

ASKED_AT = 1_800_000_000_000


def answer(status: int) -> SchemaRegistryError:
    return SchemaRegistryError(status, status * 100 + 1, f"HTTP {status} from the registry")


@pytest.mark.parametrize(("error", "reason"), [
    (answer(404), "schema id 7 is not in Schema Registry"),
    (answer(400), "schema id 7 is refused by Schema Registry (HTTP 400"),
    (answer(422), "schema id 7 is refused by Schema Registry (HTTP 422"),
])
def test_any_answer_but_an_outage_makes_the_records_id_unknown(error: Exception,
                                                               reason: str) -> None:
    refusal = fetch_refusal(error, 7)
    assert isinstance(refusal, UnknownSchemaIdError)
    assert refusal.schema_id == 7
    assert str(refusal).startswith(reason)


@pytest.mark.parametrize("error", [answer(500), answer(503), answer(401), answer(403),
                                   httpx.ConnectError("refused"), TimeoutError("slow")])
def test_an_outage_is_never_an_unknown_id(error: Exception) -> None:
    assert isinstance(fetch_refusal(error, 7), RegistryUnavailableError)


def test_an_answer_is_reused_only_for_records_created_before_the_question() -> None:
    unknown = UnknownIds(ttl_s=60)
    assert unknown.known_unknown(7, ASKED_AT - 1) is None  # never asked
    unknown.remember(7, ASKED_AT, "schema id 7 is not in Schema Registry")
    assert unknown.known_unknown(7, ASKED_AT - 1) == "schema id 7 is not in Schema Registry"
    assert unknown.known_unknown(7, None) == "schema id 7 is not in Schema Registry"
    # created at or after the question: its id may have been registered since: ask again
    assert unknown.known_unknown(7, ASKED_AT) is None
    assert unknown.known_unknown(8, ASKED_AT - 1) is None


def test_an_answer_lives_for_its_ttl_only() -> None:
    unknown = UnknownIds(ttl_s=0.01)
    unknown.remember(7, ASKED_AT, "unknown")
    time.sleep(0.02)  # past the TTL by the monotonic clock: no duration is asserted
    assert unknown.known_unknown(7, ASKED_AT - 1) is None
    assert len(unknown) == 0


def test_the_cache_is_bounded_and_drops_the_oldest_question_first() -> None:
    unknown = UnknownIds(ttl_s=60, limit=3)
    for schema_id in (1, 2, 3):
        unknown.remember(schema_id, ASKED_AT, f"unknown {schema_id}")
    unknown.remember(1, ASKED_AT + 5, "unknown 1")  # asked again: now the newest
    unknown.remember(4, ASKED_AT, "unknown 4")
    assert len(unknown) == 3
    assert unknown.known_unknown(2, ASKED_AT - 1) is None  # the oldest question, dropped
    assert [unknown.known_unknown(i, ASKED_AT - 1) for i in (1, 3, 4)] == [
        "unknown 1", "unknown 3", "unknown 4"]
