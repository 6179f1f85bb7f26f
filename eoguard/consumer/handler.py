"""What a GuardedConsumer handler sees: the message, a Redis transaction, an output helper.

Exactly-once has two strengths (docs/design.md §1):

- Redis-side effects written through ``ctx.tx`` are applied by the same Lua script that marks
  the message done, only if this consumer still owns the claim: exactly once, full stop. On
  Redis Cluster a script touches one hash slot, so effect keys must share the dedup key's hash
  tag: build them with ``ctx.key_for(name)`` (one key per shard of the scope; sum over shards to
  read a scope-wide total). On a single Redis node any key works.
- External effects: pass ``ctx.message_id`` downstream as the idempotency key. A crash between
  the effect and the done mark repeats the effect once, after the claim's lease.

``ctx.output(...)`` is the read-process-write helper: output envelopes get ids derived from the
input id and the output's index, so a reprocessed input produces the same ids and downstream
dedup drops the repeats. Outputs are produced (acks=all) before the input is marked done.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from confluent_kafka import Message
from redis.crc import key_slot

from eoguard.codec import EnvelopeCodec, PayloadCodec
from eoguard.codec.registry_payloads import RegistryPayloads
from eoguard.envelope import Envelope, derived_message_id, now_ms
from eoguard.errors import InvalidInputError
from eoguard.store.dedup import Claim, Effect
from eoguard.store.keys import KeySpace

EffectArg = str | bytes | int | float


class Deferred(Exception):  # noqa: N818 - a verdict, not an error: the message was not run
    """A batch handler's answer for a message it did not run because an earlier message of
    the same Kafka key failed (the async consumer's ``keep_key_order``): it is retried with
    the failed one, in batch order, and the attempt is not counted against its
    ``max_retries``. Counted as a failure instead when no message of the call failed."""


class RedisTx:
    """Collects a handler's Redis writes; they commit with the done mark or not at all."""

    def __init__(self, keys: KeySpace, scope: str, message_id: str, *, cluster: bool) -> None:
        self._keys = keys
        self._scope = scope
        self._message_id = message_id
        self._slot = key_slot(keys.dedup(scope, message_id).encode()) if cluster else None
        self.effects: list[Effect] = []

    def key(self, name: str) -> str:
        """An effect key in this message's dedup hash slot (required on Redis Cluster)."""
        return self._keys.effect(self._scope, self._message_id, name)

    def _add(self, command: str, key: str, *args: EffectArg) -> None:
        if self._slot is not None and key_slot(key.encode()) != self._slot:
            raise InvalidInputError(f"effect key {key!r} is not in the dedup key's hash slot; "
                                "build it with ctx.key_for(name) on Redis Cluster")
        self.effects.append(Effect(command, key, tuple(args)))

    def set(self, key: str, value: EffectArg, *, px_ms: int | None = None) -> None:
        if px_ms is None:
            self._add("SET", key, value)
        else:
            self._add("SET", key, value, "PX", px_ms)

    def incr(self, key: str, amount: int = 1) -> None:
        self._add("INCRBY", key, amount)

    def decr(self, key: str, amount: int = 1) -> None:
        self._add("DECRBY", key, amount)

    def hset(self, key: str, mapping: Mapping[str, EffectArg]) -> None:
        self._add("HSET", key, *(x for kv in mapping.items() for x in kv))

    def hincrby(self, key: str, field_name: str, amount: int = 1) -> None:
        self._add("HINCRBY", key, field_name, amount)

    def hdel(self, key: str, *fields: str) -> None:
        self._add("HDEL", key, *fields)

    def sadd(self, key: str, *members: EffectArg) -> None:
        self._add("SADD", key, *members)

    def srem(self, key: str, *members: EffectArg) -> None:
        self._add("SREM", key, *members)

    def rpush(self, key: str, *values: EffectArg) -> None:
        self._add("RPUSH", key, *values)

    def lpush(self, key: str, *values: EffectArg) -> None:
        self._add("LPUSH", key, *values)

    def zadd(self, key: str, mapping: Mapping[str, float]) -> None:
        self._add("ZADD", key, *(x for member, score in mapping.items() for x in (score, member)))

    def delete(self, key: str) -> None:
        self._add("DEL", key)

    def expire(self, key: str, seconds: int) -> None:
        self._add("EXPIRE", key, seconds)

    def pexpire(self, key: str, ms: int) -> None:
        self._add("PEXPIRE", key, ms)

    def pexpireat(self, key: str, at_ms: int) -> None:
        self._add("PEXPIREAT", key, at_ms)


@dataclass(frozen=True, slots=True)
class OutputRecord:
    """One read-process-write output, encoded and ready to produce."""

    topic: str
    key: bytes | None
    value: bytes
    message_id: str


@dataclass(frozen=True, slots=True)
class ContextEnv:
    """What every context of one consumer shares."""

    scope: str
    keys: KeySpace
    cluster: bool
    producer_id: str
    codec: EnvelopeCodec
    payloads: PayloadCodec
    framed: RegistryPayloads | None = None  # the header format's Avro payloads, by schema id


@dataclass(slots=True)
class Inbound:
    """A decoded record on its way through the consumer: its claim, its attempts, and the
    Redis effects of its last successful attempt (what its done mark applies)."""

    msg: Message
    envelope: Envelope
    payload: Any
    claim: Claim
    attempts: int = 0
    store_refused: int = 0  # attempts whose done mark Redis refused (full, claim lost)
    error: BaseException | None = None
    effects: Sequence[Effect] = ()  # the Redis writes of the last successful attempt

    @property
    def failures(self) -> int:
        """Attempts that count against ``max_retries``: the handler's own failures, not the
        attempts whose done mark a full Redis or a vanished claim undid (a store outage)."""
        return self.attempts - self.store_refused

    @property
    def topic(self) -> str:
        return self.msg.topic() or ""

    @property
    def partition(self) -> int:
        return self.msg.partition() or 0

    @property
    def offset(self) -> int:
        return self.msg.offset() or 0


class HandlerContext:
    """One message as the handler sees it; a new context for every handler attempt.

    ``message_id`` is the idempotency key for external effects; ``payload`` is the
    application's original form (decoded with the payload's Avro schema, or raw bytes);
    ``key`` is the Kafka record key; ``attempt`` is the handler attempt, from 1
    (``envelope.attempt`` is the producer's send attempt). For a plain record
    (``ConsumerConfig.plain_records``) ``message_id`` is the id rule's, ``payload`` what the
    deserializer returned, and ``envelope`` a synthetic one (:func:`eoguard.codec.read_plain`:
    ``producer == ""``, ``attempt == 1``, ``payload`` the raw value).
    """

    __slots__ = ("_env", "_in", "_outputs", "_tx", "attempt")

    def __init__(self, inbound: Inbound, attempt: int, env: ContextEnv) -> None:
        self._in = inbound
        self._env = env
        self._tx: RedisTx | None = None
        self._outputs: list[OutputRecord] | None = None  # made on first use: most have none
        self.attempt = attempt

    def __repr__(self) -> str:
        return (f"HandlerContext(message_id={self.message_id!r}, topic={self.topic!r}, "
                f"partition={self.partition}, offset={self.offset}, attempt={self.attempt})")

    @property
    def message_id(self) -> str:
        return self._in.envelope.id

    @property
    def envelope(self) -> Envelope:
        return self._in.envelope

    @property
    def payload(self) -> Any:
        return self._in.payload

    @property
    def key(self) -> bytes | None:
        key: bytes | None = self._in.msg.key()
        return key

    @property
    def topic(self) -> str:
        return self._in.topic

    @property
    def partition(self) -> int:
        return self._in.partition

    @property
    def offset(self) -> int:
        return self._in.offset

    @property
    def tx(self) -> RedisTx:
        """The Redis writes committed with the done mark (created on first use)."""
        if self._tx is None:
            env = self._env
            self._tx = RedisTx(env.keys, env.scope, self.message_id, cluster=env.cluster)
        return self._tx

    @property
    def effects(self) -> Sequence[Effect]:
        """The Redis writes queued through :attr:`tx` (empty when it was never used)."""
        return self._tx.effects if self._tx is not None else ()

    @property
    def outputs(self) -> Sequence[OutputRecord]:
        """The output messages queued through :meth:`output`, in order."""
        return self._outputs if self._outputs is not None else ()

    def key_for(self, name: str) -> str:
        """Shorthand for ``ctx.tx.key(name)``: an effect key in this message's hash slot."""
        return self.tx.key(name)

    def output(self, topic: str, value: Any, key: bytes | str | None = None, *,
               payload_schema: str | None = None, ttl_ms: int | None = None,
               headers: Mapping[str, str] | None = None) -> str:
        """Queue an output message; returns its deterministic id.

        ``value`` is encoded with ``payload_schema`` (raw bytes when None). The output expires
        with its input unless ``ttl_ms`` is given.
        """
        if self._outputs is None:
            self._outputs = []
        message_id = derived_message_id(self.message_id, len(self._outputs))
        created = now_ms()
        expires = created + ttl_ms if ttl_ms is not None else self.envelope.expires_at_ms
        env = self._env
        envelope = Envelope(
            id=message_id,
            expires_at_ms=expires,
            # Never after its expiry (a handler that ran past its input's expiry): an expiry
            # before the creation time would make the output malformed, not expired.
            created_at_ms=min(created, expires),
            producer=env.producer_id,
            attempt=1,
            payload_schema=payload_schema,
            payload=env.payloads.encode(value, payload_schema),
            headers=dict(headers or {}),
            payload_fingerprint=env.payloads.writer_fingerprint(payload_schema),
        )
        raw_key = key.encode() if isinstance(key, str) else key
        self._outputs.append(OutputRecord(topic, raw_key, env.codec.encode(envelope), message_id))
        return message_id


Handler = Callable[[HandlerContext], None]
"""Handles one message; raising fails this attempt (the claim is released and retried)."""

BatchHandler = Callable[[Sequence[HandlerContext]], Mapping[str, BaseException] | None]
"""Handles a batch; returns the failed message ids (with their errors), or raises to fail all."""
