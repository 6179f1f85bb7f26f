"""The input rules of ``eoguard.codec.rules`` as Spark Column expressions (docs/design.md §3).

Same rules, same order, same words in the reasons as the GuardedConsumer, so a record is
malformed for the Spark job exactly when it is for a consumer of the same limits:
:func:`canonical_id` mirrors :func:`eoguard.envelope.canonical_id` step by step, and
:func:`envelope_rules` with :func:`beyond_max_ttl` (the one rule that reads a clock) mirror
:func:`eoguard.codec.check_envelope`. Times are epoch milliseconds (the envelope is decoded
without logical types, so an absurd expiry is a long to compare, not a timestamp that
overflows).
"""

from __future__ import annotations

from typing import Any

from pyspark.sql import Column
from pyspark.sql import functions as F  # noqa: N812 - the PySpark convention

from eoguard.codec import InputLimits
from eoguard.envelope import MAX_ID_CHARS

__all__ = ["Rule", "beyond_max_ttl", "canonical_id", "envelope_rules", "first_broken"]

_CANONICAL = r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\z"
_DIGITS = r"([0-9a-f]{8})-?([0-9a-f]{4})-?([0-9a-f]{4})-?([0-9a-f]{4})-?([0-9a-f]{12})"
# Python's steps as one pattern over the lowercased text: an optional ``urn:uuid:`` prefix,
# then the digits alone or inside one pair of braces (a lone brace is refused).
_SPELLED = rf"^(?:urn:uuid:)?(?:\{{{_DIGITS}\}}|{_DIGITS})\z"


def canonical_id(text: Column) -> Column:
    """Lowercase hyphenated UUID text of ``text``, or null when it is not a UUID.

    One regular expression for an id already canonical (eoguard's own: nearly every row);
    the other spellings take a second one, which also rewrites them. Kept small on purpose:
    the code Spark generates for the decode must stay in methods the JVM compiles
    (:func:`eoguard_spark.decode.fence`).
    """
    low = F.lower(text)
    groups = "$1$6-$2$7-$3$8-$4$9-$5$10"  # one alternative's groups are empty
    return F.when(text.rlike(_CANONICAL), text).when(
        (F.length(text) <= MAX_ID_CHARS) & low.rlike(_SPELLED),
        F.regexp_replace(low, _SPELLED, groups))


Rule = tuple[Column, Column]
"""A malformed-record rule: (the row breaks it, the reason); the first broken rule wins."""


def first_broken(rules: list[Rule]) -> Column:
    """The reason of the first rule a row breaks, else null."""
    reason: Any = F
    for broken, why in rules:
        reason = reason.when(broken, why)
    out: Column = reason
    return out


def envelope_rules(env: Column, canonical: Column, *, limits: InputLimits
                   ) -> tuple[list[Rule], list[Rule]]:
    """The rules of ``check_envelope`` that need no clock: those before its expiry bound
    (:func:`beyond_max_ttl`) and those after it, in its order.

    ``env`` has the envelope's fields with ``expires_at``/``created_at`` as epoch ms longs;
    ``canonical`` is :func:`canonical_id` of its id (computed once, also the output's id).
    Spark expressions only, no lambdas, so the projection keeps whole-stage codegen.
    """
    mid, expires, created = env.getField("id"), env.getField("expires_at"), env.getField("created_at")
    producer, payload, headers = (env.getField("producer"), env.getField("payload"),
                                  env.getField("headers"))
    # Byte-level concatenations, not a lambda: a higher-order function has no generated code,
    # and one in a projection turns whole-stage codegen off for all of it.
    header_bytes = (F.octet_length(F.concat_ws("", F.map_keys(headers)))
                    + F.octet_length(F.concat_ws("", F.map_values(headers))))
    shown = F.when(F.length(mid) <= MAX_ID_CHARS, mid).otherwise(
        F.concat(mid.substr(1, MAX_ID_CHARS), F.lit("...")))
    before: list[Rule] = [
        (canonical.isNull(),
         F.format_string("id '%s' (%d characters) is not a UUID", shown, F.length(mid))),
        (expires < created,
         F.format_string("expires_at %d is before created_at %d", expires, created)),
    ]
    after: list[Rule] = [
        (env.getField("attempt") < 1,
         F.format_string("attempt %d is below 1", env.getField("attempt"))),
        (F.length(producer) > limits.producer_chars,
         F.format_string("producer is %d characters, over %d", F.length(producer),
                         F.lit(limits.producer_chars))),
        (F.octet_length(payload) > limits.payload_bytes,
         F.format_string("payload is %d bytes, over %d", F.octet_length(payload),
                         F.lit(limits.payload_bytes))),
        (F.size(headers) > limits.header_count,
         F.format_string("%d headers, over %d", F.size(headers), F.lit(limits.header_count))),
        (header_bytes > limits.header_bytes,
         F.format_string("headers are %d bytes, over %d", header_bytes,
                         F.lit(limits.header_bytes))),
    ]
    return before, after


def beyond_max_ttl(env: Column, *, now_ms: Column, max_ttl_ms: int, limits: InputLimits
                   ) -> Rule:
    """The expiry bound of ``check_envelope``: no later than now + ``max_ttl`` (+ clock skew)."""
    expires = env.getField("expires_at")
    return (expires > now_ms + F.lit(max_ttl_ms + limits.clock_skew_ms),
            F.format_string("expires_at %d is beyond now + max_ttl (%d + %d ms)", expires,
                            now_ms, F.lit(max_ttl_ms)))
