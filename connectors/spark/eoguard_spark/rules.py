"""The input rules of ``eoguard.codec.rules`` as Spark Column expressions (docs/design.md §3).

Same rules, same order, same words in the reasons as the GuardedConsumer, so a record is
malformed for the Spark job exactly when it is for a consumer of the same limits:
:func:`canonical_id` mirrors :func:`eoguard.envelope.canonical_id` step by step, and
:func:`broken_rule` mirrors :func:`eoguard.codec.check_envelope`. Times are epoch
milliseconds (the envelope is decoded without logical types, so an absurd expiry is a long
to compare, not a timestamp that overflows).
"""

from __future__ import annotations

from pyspark.sql import Column
from pyspark.sql import functions as F  # noqa: N812 - the PySpark convention

from eoguard.codec import InputLimits
from eoguard.envelope import MAX_ID_CHARS

__all__ = ["broken_rule", "canonical_id"]

_SPELLED = r"^[0-9a-f]{8}-?[0-9a-f]{4}-?[0-9a-f]{4}-?[0-9a-f]{4}-?[0-9a-f]{12}\z"
_CANONICAL = r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\z"


def canonical_id(text: Column) -> Column:
    """Lowercase hyphenated UUID text of ``text``, or null when it is not a UUID.

    One regular expression for an id already canonical (eoguard's own: nearly every row);
    the other spellings take the longer way.
    """
    low = F.lower(text)
    bare = F.regexp_replace(low, r"^urn:uuid:", "")
    bare = F.when(bare.startswith("{") & bare.endswith("}"),
                  bare.substr(F.lit(2), F.length(bare) - 2)).otherwise(bare)
    digits = F.regexp_replace(bare, "-", "")
    canonical = F.concat_ws("-", digits.substr(1, 8), digits.substr(9, 4), digits.substr(13, 4),
                            digits.substr(17, 4), digits.substr(21, 12))
    return F.when(text.rlike(_CANONICAL), text).when(
        (F.length(text) <= MAX_ID_CHARS) & bare.rlike(_SPELLED), canonical)


def broken_rule(env: Column, canonical: Column, *, now_ms: Column, max_ttl_ms: int,
                limits: InputLimits) -> Column:
    """Why the decoded envelope struct ``env`` breaks an input rule, or null when it does not.

    ``env`` has the envelope's fields with ``expires_at``/``created_at`` as epoch ms longs;
    ``canonical`` is :func:`canonical_id` of its id (computed once, also the output's id).
    The map of headers is walked (a lambda: slow in Spark) only on rows that have headers.
    """
    mid, expires, created = env.getField("id"), env.getField("expires_at"), env.getField("created_at")
    producer, payload, headers = (env.getField("producer"), env.getField("payload"),
                                  env.getField("headers"))
    header_bytes = F.when(F.size(headers) > 0, F.aggregate(
        F.map_entries(headers), F.lit(0),
        lambda acc, e: acc + F.octet_length(e.getField("key"))
        + F.octet_length(e.getField("value")))).otherwise(F.lit(0))
    shown = F.when(F.length(mid) <= MAX_ID_CHARS, mid).otherwise(
        F.concat(mid.substr(1, MAX_ID_CHARS), F.lit("...")))
    return (
        F.when(canonical.isNull(),
               F.format_string("id '%s' (%d characters) is not a UUID", shown, F.length(mid)))
        .when(expires < created,
              F.format_string("expires_at %d is before created_at %d", expires, created))
        .when(expires > now_ms + F.lit(max_ttl_ms + limits.clock_skew_ms),
              F.format_string("expires_at %d is beyond now + max_ttl (%d + %d ms)", expires,
                              now_ms, F.lit(max_ttl_ms)))
        .when(env.getField("attempt") < 1,
              F.format_string("attempt %d is below 1", env.getField("attempt")))
        .when(F.length(producer) > limits.producer_chars,
              F.format_string("producer is %d characters, over %d", F.length(producer),
                              F.lit(limits.producer_chars)))
        .when(F.octet_length(payload) > limits.payload_bytes,
              F.format_string("payload is %d bytes, over %d", F.octet_length(payload),
                              F.lit(limits.payload_bytes)))
        .when(F.size(headers) > limits.header_count,
              F.format_string("%d headers, over %d", F.size(headers),
                              F.lit(limits.header_count)))
        .when(header_bytes > limits.header_bytes,
              F.format_string("headers are %d bytes, over %d", header_bytes,
                              F.lit(limits.header_bytes)))
    )
