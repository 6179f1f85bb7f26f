"""The vectors that pin every copy of a claim's position and shard to their definitions.

:func:`eoguard.store.dedup.position` and :meth:`eoguard.store.keys.KeySpace.shard_of` are the
definitions; the consumer's decode inlines both (tests/unit/test_decode_inline.py) and the
Spark job spells them as Columns (tests/spark/test_decode.py). Both tests take their cases
from here, so a case added for one is checked against the other too.
"""

from __future__ import annotations

import random
import uuid

SHARDS = (1, 4, 16, 1000)
"""Shard counts: one shard, a few, the default, more shards than a cluster has masters."""

EDGE_IDS = ("", "x", "\u00fc-\U0001f600", "a|b{c}")
"""Ids that are not UUIDs (the Spark job hashes whatever id a row holds; a consumer refuses
them before it builds a key): empty, ASCII, non-ASCII, outside the BMP, key punctuation."""

READERS = ("g", "spark|q:1 \u00fc\U0001f600", "12:x|3", "")
"""Readers (a consumer's group id, a Spark query's reader): '|', ':', digits where a length
prefix is, non-ASCII, outside the BMP, empty."""

TOPICS = ("orders", "a|b:c", "12:x|3", "\u00f6l-\U0001f600", "")

PARTITION_OFFSETS = ((0, 0), (3, 2**40))
"""(partition, offset) pairs of the fixed cases; :func:`partition_offsets` adds random ones."""


def uuid_ids(count: int, seed: int = 7) -> list[str]:
    """``count`` random UUIDs (version 4 layout), reproducible from ``seed``."""
    rng = random.Random(seed)
    return [str(uuid.UUID(int=rng.getrandbits(128), version=4)) for _ in range(count)]


def partition_offsets(count: int, seed: int = 11) -> list[tuple[int, int]]:
    """The fixed pairs, the extremes Kafka allows, and ``count`` random pairs."""
    rng = random.Random(seed)
    extremes = [(2**31 - 1, 2**63 - 1), (0, 2**63 - 1), (2**31 - 1, 0), (1, 9), (10, 10)]
    randoms = [(rng.randrange(2**31), rng.randrange(2**63)) for _ in range(count)]
    return [*PARTITION_OFFSETS, *extremes, *randoms]
