"""The producer's persistence modes and wire format, the outbox record's lifetime and Redis
durability.

A bottom-layer module (it imports nothing of eoguard): the store, the producer and the
configuration all name these enums, and none of them should import another to do so.
"""

from __future__ import annotations

import enum

__all__ = ["Durability", "KeepUntil", "PersistenceMode", "WireFormat"]


class PersistenceMode(str, enum.Enum):
    """When the producer writes a message to the Redis outbox.

    ``PERSIST_FIRST``: every message is written to Redis (batched, one round trip) before it
    is produced; ``on_guaranteed`` fires after the write. Costs one Redis write per message.
    ``DELAYED``: produce at once, keep the message in memory, and write it to Redis only if
    Kafka has not acknowledged it within the adaptive delay; ``on_guaranteed`` fires on the
    first of the two. Saves most Redis writes; a crash inside the delay loses only messages
    not yet guaranteed, which the application still holds.
    """

    PERSIST_FIRST = "persist-first"
    DELAYED = "delayed"


class KeepUntil(str, enum.Enum):
    """When an outbox record is deleted (its TTL deletes it at expiry in every case)."""

    CONSUMED = "consumed"  # the consumer scope's end-to-end ack deletes it
    PUBLISHED = "published"  # Kafka's acknowledgement deletes it


class Durability(str, enum.Enum):
    """When a Redis write counts (``RedisConfig.durability``; docs/design.md §4).

    ``LOCAL``: once the node that took it has it (in memory and in its AOF). ``REPLICATED``:
    once a replica holds it too (``WAIT`` after each round trip of writes), so a failover
    that promotes that replica does not lose it.
    """

    LOCAL = "local"
    REPLICATED = "replicated"


class WireFormat(str, enum.Enum):
    """How a producer writes a message into a Kafka record (docs/design.md §3).

    ``ENVELOPE``: the value is eoguard's Avro envelope (single-object encoding), the payload
    nested in it; only eoguard readers read it. ``HEADERS``: the value is the payload alone,
    as a Schema Registry serializer writes it (magic byte 0, 4-byte schema id, Avro body) or
    the raw bytes, and eoguard's fields travel as CloudEvents-style Kafka headers; any
    registry client reads it. Every eoguard reader reads both, record by record.
    """

    ENVELOPE = "envelope"
    HEADERS = "headers"
