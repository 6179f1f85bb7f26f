"""Helpers of the dedup store tests: claims at positions, results as lists, raw keys."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import redis

from eoguard.envelope import now_ms
from eoguard.store.dedup import (
    Claim,
    ClaimResult,
    DedupStore,
    DoneResult,
    RenewResult,
    position,
)

GRACE_MS = 5_000
LEASE_MS = 10_000
NEW, MINE, DONE_HERE, DUPLICATE, BUSY, EXPIRED, PARTIAL, STALE, PASSED = tuple(ClaimResult)


def claim_of(store: DedupStore, message_id: str, offset: int, *, ttl_ms: int = 60_000,
             reader: str = "g") -> Claim:
    return store.new_claim(message_id, position(reader, "orders", 0, offset), now_ms() + ttl_ms)


def claim_results(store: DedupStore, token: str, claims: Sequence[Claim]) -> list[ClaimResult]:
    return [outcome.result for outcome in store.claim(token, claims)]


def done_results(store: DedupStore, token: str, claims: Sequence[Claim],
                 **kwargs: Any) -> list[DoneResult]:
    return [outcome.result for outcome in store.done(token, claims, **kwargs)]


def value(client: redis.Redis, key: str) -> str | None:
    raw = client.get(key)
    return None if raw is None else raw.decode()


def record_key(store: DedupStore, token: str, claim: Claim) -> str:
    [(_, key)] = store.records(token, [claim])
    return key


def record_of(client: redis.Redis, store: DedupStore, token: str, claim: Claim
              ) -> tuple[str | None, int]:
    """The batch record covering ``claim`` under ``token``: its value and PEXPIRETIME."""
    key = record_key(store, token, claim)
    return value(client, key), int(client.pexpiretime(key))


def deadline_of(record: str | None) -> int:
    assert record is not None
    assert record.startswith("o|"), record
    return int(record[2:])


def keys_under(client: redis.Redis, prefix: str) -> set[str]:
    return {name.decode() for name in client.scan_iter(f"{prefix}:*", count=1000)}


def gone_lapsed(store: DedupStore, token: str, claims: Sequence[Claim]) -> None:
    """End the lease of ``token``'s batch now, as a consumer that stalled would see it lapse."""
    assert set(store.give_back(store.records(token, claims))) == {RenewResult.RENEWED}


def command_calls(client: redis.Redis) -> dict[str, int]:
    """INFO commandstats: calls per command (commands run inside scripts count too)."""
    return {name.removeprefix("cmdstat_"): int(stats["calls"])
            for name, stats in client.info("commandstats").items()}


def calls_since(client: redis.Redis, before: dict[str, int]) -> dict[str, int]:
    after = command_calls(client)
    return {name: n - before.get(name, 0) for name, n in after.items()
            if n != before.get(name, 0) and name not in ("info", "command|info")}
