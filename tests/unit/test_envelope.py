"""The Envelope value object and the message id rules (UUIDv7 ids, derived UUIDv8 ids)."""

from __future__ import annotations

import dataclasses
import hashlib
import os
import threading
import time
import uuid

import pytest

from eoguard.envelope import Envelope, derived_message_id, new_message_id, now_ms


def make_envelope(**overrides: object) -> Envelope:
    fields: dict[str, object] = {
        "id": new_message_id(),
        "expires_at_ms": 2_000,
        "created_at_ms": 1_000,
        "producer": "producer-1",
        "attempt": 1,
        "payload_schema": None,
        "payload": b"payload",
        "headers": {"trace": "t-1"},
    }
    fields.update(overrides)
    return Envelope(**fields)  # type: ignore[arg-type]


def uuid_ms(value: str) -> int:
    return uuid.UUID(value).int >> 80


# --- UUIDv7 ------------------------------------------------------------------------------


def test_new_message_id_is_a_canonical_uuid_v7_carrying_the_current_millisecond() -> None:
    before = now_ms()
    value = new_message_id()
    after = now_ms()
    parsed = uuid.UUID(value)
    assert str(parsed) == value
    assert len(value) == 36
    assert parsed.version == 7
    assert parsed.variant == uuid.RFC_4122
    assert before <= uuid_ms(value) <= after


def test_ids_generated_in_a_tight_loop_are_unique_and_sorted_in_generation_order() -> None:
    ids = [new_message_id() for _ in range(100_000)]
    assert len(set(ids)) == len(ids)
    assert sorted(ids) == ids  # string order is time order for canonical lowercase UUIDs
    per_ms: dict[int, int] = {}
    for value in ids:
        per_ms[uuid_ms(value)] = per_ms.get(uuid_ms(value), 0) + 1
    assert max(per_ms.values()) > 1, "the loop never produced two ids in one millisecond"


def test_ids_from_many_threads_are_unique() -> None:
    results: list[list[str]] = [[] for _ in range(8)]

    def work(out: list[str]) -> None:
        out.extend(new_message_id() for _ in range(10_000))

    threads = [threading.Thread(target=work, args=(out,)) for out in results]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    every = [value for out in results for value in out]
    assert len(set(every)) == 80_000
    for out in results:
        assert sorted(out) == out


@pytest.mark.skipif(not hasattr(os, "fork"), reason="os.fork is not available on this platform")
def test_a_forked_child_does_not_repeat_the_parents_ids() -> None:
    new_message_id()  # the parent's state now holds a timestamp and a counter
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: without the at-fork reseed it would continue the parent's counter
        try:
            os.write(write_end, ",".join(new_message_id() for _ in range(200)).encode())
        finally:
            os._exit(0)
    os.close(write_end)
    parent_ids = {new_message_id() for _ in range(200)}
    chunks = []
    while chunk := os.read(read_end, 65536):
        chunks.append(chunk)
    os.close(read_end)
    os.waitpid(pid, 0)
    child_ids = set(b"".join(chunks).decode().split(","))
    assert len(child_ids) == 200
    assert parent_ids.isdisjoint(child_ids)


# --- derived ids ---------------------------------------------------------------------------


def test_derived_ids_are_deterministic_distinct_and_keep_the_parents_timestamp() -> None:
    parent = new_message_id()
    first = [derived_message_id(parent, i) for i in range(1_000)]
    again = [derived_message_id(parent, i) for i in range(1_000)]
    assert first == again
    assert len(set(first)) == 1_000
    assert parent not in first
    for value in first[:10]:
        parsed = uuid.UUID(value)
        assert parsed.version == 8
        assert parsed.variant == uuid.RFC_4122
        assert uuid_ms(value) == uuid_ms(parent)


def test_derived_ids_differ_between_parents() -> None:
    parents = [new_message_id() for _ in range(100)]
    children = {derived_message_id(p, 0) for p in parents}
    assert len(children) == 100


def test_derived_id_is_stable_across_releases() -> None:
    # Pinned: changing the derivation would make retried read-process-write steps emit
    # new ids for messages already sent, and downstream dedup would let both through.
    parent = "01922f3a-5b6c-7d8e-9f01-23456789abcd"
    assert derived_message_id(parent, 0) == derived_message_id(parent.upper(), 0)
    assert derived_message_id(parent, 3) == "01922f3a-5b6c-8508-91f0-5ed9203193c7"
    # ... which is the documented recipe: parent's first 48 bits, version 8, then 74 bits of
    # SHA-256("eoguard.derived" || parent bytes || index as 8-byte big-endian), variant 10.
    digest = hashlib.sha256(b"eoguard.derived" + uuid.UUID(parent).bytes
                            + (3).to_bytes(8, "big")).digest()
    bits = int.from_bytes(digest[:10], "big") & ((1 << 74) - 1)
    expected = ((uuid.UUID(parent).int >> 80) << 80 | 0x8 << 76 | (bits >> 62) << 64
                | 0b10 << 62 | bits & ((1 << 62) - 1))
    assert derived_message_id(parent, 3) == str(uuid.UUID(int=expected))


def test_derived_id_rejects_a_bad_parent_or_index() -> None:
    with pytest.raises(ValueError, match="badly formed"):
        derived_message_id("not-a-uuid", 0)
    with pytest.raises(ValueError, match="index"):
        derived_message_id(new_message_id(), -1)


# --- Envelope --------------------------------------------------------------------------------


def test_envelope_is_frozen_and_keyword_only() -> None:
    env = make_envelope()
    with pytest.raises(dataclasses.FrozenInstanceError):
        env.attempt = 2  # type: ignore[misc]
    with pytest.raises(TypeError):
        Envelope("id", 1, 2, "p", 1, None, b"", {})  # type: ignore[call-arg]


def test_is_expired_from_the_expiry_instant_on() -> None:
    env = make_envelope(expires_at_ms=10_000)
    assert not env.is_expired(9_999)
    assert env.is_expired(10_000)
    assert env.is_expired(10_001)
    assert make_envelope(expires_at_ms=now_ms() - 1).is_expired()
    assert not make_envelope(expires_at_ms=now_ms() + 60_000).is_expired()


def test_with_attempt_changes_only_the_attempt() -> None:
    env = make_envelope()
    resent = env.with_attempt(3)
    assert resent.attempt == 3
    assert env.attempt == 1
    assert dataclasses.replace(resent, attempt=1) == env


def test_create_fills_a_first_attempt_with_a_new_id_and_expiry() -> None:
    headers = {"a": "b"}
    env = Envelope.create(b"x", ttl_ms=5_000, producer="p-1", payload_schema="s.T",
                          headers=headers, created_at_ms=1_000)
    assert uuid.UUID(env.id).version == 7
    assert (env.created_at_ms, env.expires_at_ms, env.attempt) == (1_000, 6_000, 1)
    assert env.payload_schema == "s.T"
    assert env.payload == b"x"
    assert env.headers == headers
    assert env.headers is not headers  # the caller's dict is copied
    assert Envelope.create(b"", ttl_ms=1, producer="p").headers == {}


def test_now_ms_is_the_wall_clock_in_milliseconds() -> None:
    assert abs(now_ms() - time.time() * 1000) < 1_000
