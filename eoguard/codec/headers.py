"""The header wire format (``WireFormat.HEADERS``): eoguard's fields as Kafka record headers.

The record value is the payload alone, exactly as a Schema Registry serializer writes it (or
the raw bytes), so any registry client reads it; the fields an envelope would carry travel as
headers, named by the CloudEvents Kafka binding (binary mode) where it names the field
(docs/design.md §3, "The header format")::

    ce_specversion      1.0
    ce_id               the message id (canonical UUID text)
    ce_time             created_at, RFC 3339 in UTC with milliseconds
    ce_expirytime       expires_at, the same form (the CloudEvents Expiry Time extension)
    ce_source           the producer's event_source, unless the send gives its own
    ce_type             the payload schema's full name (raw bytes: eoguard.bytes), unless given
    ce_eoguardattempt   the attempt, decimal (1, then +1 per resend from the outbox)
    ce_eoguardproducer  the instance id of the producer that created it
    content-type        application/avro (a registry-framed Avro value), else the raw bytes'

Which records are in this format: those with a ``ce_eoguardattempt`` header (:data:`MARKER`),
a name only eoguard writes. ``ce_id`` alone does not make one: any CloudEvents producer writes
it with ids of its own (any text, unique per ``ce_source``), which are not eoguard's message
ids; such a record is plain (the application's rules, §6, may key it by ``ce_id``).

A record with the marker must carry every other header above but ``ce_source`` and
``ce_type``, once each, well formed; else it is malformed (:class:`InvalidEnvelopeError`,
rule ``headers``, naming the header), dead-lettered. The names in :data:`RESERVED` are
eoguard's: a ``send`` whose headers use one (in any letter case) is refused
(:class:`ReservedHeaderError`); a raw-bytes send may give its own ``content-type`` (not the
Avro one), and any send its own ``ce_source`` and ``ce_type``.
"""

from __future__ import annotations

import calendar
import functools
import re
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, cast

from eoguard.envelope import Envelope
from eoguard.errors import CodecError, InvalidEnvelopeError, ReservedHeaderError

__all__ = [
    "ATTEMPT",
    "AVRO_CONTENT_TYPE",
    "BYTES_CONTENT_TYPE",
    "BYTES_TYPE",
    "CONTENT_TYPE",
    "EXPIRY_TIME",
    "ID",
    "MARKER",
    "PRODUCER",
    "REQUIRED",
    "RESERVED",
    "SOURCE",
    "SPEC_VERSION",
    "TIME",
    "TYPE",
    "FramedReader",
    "HeaderFields",
    "RawHeaders",
    "app_headers",
    "check_app_headers",
    "format_time",
    "header_envelope",
    "header_payload",
    "parse_time",
    "read_headers",
    "write_headers",
]

SPEC_VERSION = "ce_specversion"
ID = "ce_id"
TIME = "ce_time"
EXPIRY_TIME = "ce_expirytime"
SOURCE = "ce_source"
TYPE = "ce_type"
ATTEMPT = "ce_eoguardattempt"
PRODUCER = "ce_eoguardproducer"
CONTENT_TYPE = "content-type"
MARKER = ATTEMPT
"""The header that puts a record in this format (module docstring)."""

AVRO_CONTENT_TYPE = "application/avro"
"""A registry-framed Avro value: magic byte 0, 4-byte big-endian schema id, Avro body."""
BYTES_CONTENT_TYPE = "application/octet-stream"
"""Raw bytes, when the send names no content type of its own."""
BYTES_TYPE = "eoguard.bytes"
"""``ce_type`` of a raw-bytes payload, when the send names none."""

RESERVED = frozenset({SPEC_VERSION, ID, TIME, EXPIRY_TIME, ATTEMPT, PRODUCER, CONTENT_TYPE})
"""Header names only eoguard writes (compared in lowercase)."""
REQUIRED = (SPEC_VERSION, ID, TIME, EXPIRY_TIME, ATTEMPT, PRODUCER, CONTENT_TYPE)
"""eoguard's headers a record in this format must carry, in the order they are judged."""

_TIME = re.compile(r"(\d{4})-(\d{2})-(\d{2})[Tt](\d{2}):(\d{2}):(\d{2})(?:\.(\d{1,9}))?"
                   r"(?:([Zz])|([+-])(\d{2}):(\d{2}))", re.ASCII)
_ATTEMPT = re.compile(r"[1-9][0-9]{0,9}", re.ASCII)  # what fits Avro's int (the envelope's), checked below


@functools.lru_cache(maxsize=64)
def _second(seconds: int) -> str:
    """The text of a whole second (a producer writes two times per message, mostly in the
    same few seconds: cached)."""
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds))


def format_time(ms: int) -> str:
    """Epoch milliseconds as RFC 3339 text in UTC with milliseconds (``...T12:00:00.123Z``)."""
    seconds, millis = divmod(ms, 1000)
    return f"{_second(seconds)}.{millis:03d}Z"


_WRITTEN = re.compile(r"([0-9]{4}-[0-9]{2}-[0-9]{2})T([0-9]{2}):([0-9]{2}):([0-9]{2})\.([0-9]{3})Z",
                      re.ASCII)
"""The form :func:`format_time` writes: read by a shorter path (the consumer's, per record)."""


@functools.lru_cache(maxsize=64)
def _day_ms(date: str) -> int:
    """Epoch milliseconds of a date's midnight UTC (ValueError for a date that is not one)."""
    return _parse_time(f"{date}T00:00:00Z")


def parse_time(text: str) -> int:
    """RFC 3339 text (any offset, any fraction) as epoch milliseconds, the fraction beyond
    milliseconds cut; ValueError when it is not RFC 3339."""
    written = _WRITTEN.fullmatch(text)
    if written is not None:
        hour, minute, second = int(written[2]), int(written[3]), int(written[4])
        if hour <= 23 and minute <= 59 and second <= 60:
            return (_day_ms(written[1]) + hour * 3_600_000 + minute * 60_000 + second * 1000
                    + int(written[5]))
    return _parse_time(text)


def _parse_time(text: str) -> int:
    """:func:`parse_time` of any form."""
    match = _TIME.fullmatch(text)
    if match is None:
        raise ValueError(f"{text!r} is not an RFC 3339 time")
    year, month, day, hour, minute, second = (int(g) for g in match.groups()[:6])
    if not (1 <= month <= 12 and 1 <= day <= calendar.monthrange(year, month)[1]
            and hour <= 23 and minute <= 59 and second <= 60):  # 60: a leap second
        raise ValueError(f"{text!r} is not a valid time")
    fraction = (match.group(7) or "").ljust(3, "0")[:3]
    ms = calendar.timegm((year, month, day, hour, minute, second)) * 1000 + int(fraction)
    if match.group(9):  # an offset: local time minus the offset is UTC
        offset_h, offset_m = int(match.group(10)), int(match.group(11))
        if offset_h > 23 or offset_m > 59:
            raise ValueError(f"{text!r} has an invalid offset")
        sign = 1 if match.group(9) == "+" else -1
        ms -= sign * (offset_h * 60 + offset_m) * 60_000
    return ms


def app_headers(headers: Mapping[str, str]) -> dict[str, str]:
    """The headers a reader hands the application (and counts against ``input_limits``):
    every one but the reserved."""
    return {k: v for k, v in headers.items() if k.lower() not in RESERVED}


def check_app_headers(headers: Mapping[str, str], *, raw: bool) -> None:
    """:class:`ReservedHeaderError` when ``headers`` (a send's) use a reserved name; a raw
    payload (``raw``) may name its own ``content-type``, other than the Avro one, once (two
    spellings would be one header twice on the record, which every reader refuses)."""
    named = False
    for name, value in headers.items():
        lower = name.lower()
        if lower not in RESERVED:
            continue
        if lower == CONTENT_TYPE and raw and value.lower() != AVRO_CONTENT_TYPE:
            if named:
                raise ReservedHeaderError(f"header {name!r}: content-type given more than "
                                          f"once (in two spellings)", header=name)
            named = True
            continue
        raise ReservedHeaderError(
            f"header {name!r} is reserved by the header wire format (eoguard writes it)"
            + (": a raw payload may name its content type, not application/avro"
               if lower == CONTENT_TYPE and raw else ""), header=name)


def write_headers(message_id: str, created_at_ms: int, expires_at_ms: int, *, attempt: int,
                  producer: str, source: str, schema: str | None,
                  app: Mapping[str, str] | None) -> dict[str, str]:
    """The headers of a record in this format; ``app`` (checked by :func:`check_app_headers`)
    follows eoguard's and may give ``ce_source``, ``ce_type`` and a raw ``content-type``."""
    headers = {
        SPEC_VERSION: "1.0",
        ID: message_id,
        TIME: format_time(created_at_ms),
        EXPIRY_TIME: format_time(expires_at_ms),
        SOURCE: source,
        TYPE: BYTES_TYPE if schema is None else schema,
        ATTEMPT: str(attempt),
        PRODUCER: producer,
        CONTENT_TYPE: BYTES_CONTENT_TYPE if schema is None else AVRO_CONTENT_TYPE,
    }
    if app:
        for name, value in app.items():  # a given content-type in its own spelling: ours goes
            if name.lower() == CONTENT_TYPE and name != CONTENT_TYPE:
                del headers[CONTENT_TYPE]
            headers[name] = value
    return headers


@dataclass(frozen=True, slots=True)
class HeaderFields:
    """eoguard's fields read from a record's headers (not yet checked by the input rules),
    and the application's headers (every other one, as text)."""

    id: str
    created_at_ms: int
    expires_at_ms: int
    attempt: int
    producer: str
    avro: bool  # the value is registry-framed Avro; else raw bytes
    app: dict[str, str]


def _malformed(message: str) -> InvalidEnvelopeError:
    return InvalidEnvelopeError(f"header format: {message}", rule="headers")


RawHeaders = Iterable[tuple[str, str | bytes | None]] | Mapping[str, str | bytes | None]
"""A record's headers as confluent-kafka gives them (pairs, or a dict)."""


_WRITTEN_ORDER = (SPEC_VERSION, ID, TIME, EXPIRY_TIME, SOURCE, TYPE, ATTEMPT, PRODUCER,
                  CONTENT_TYPE)
"""The names :func:`write_headers` writes for a send without headers of its own, in order."""


def read_headers(raw: RawHeaders | None) -> HeaderFields | None:
    """eoguard's fields from a record's headers; None when the record is not in this format
    (no :data:`MARKER`); :class:`InvalidEnvelopeError` (rule ``headers``) naming the header
    that is repeated, without a value, not UTF-8, missing or malformed (in that order, each
    judged in the order of :data:`REQUIRED`; the Spark job gives the same reasons in the same
    order). The application's headers keep the last value of a name, as text."""
    if not raw:
        return None
    if raw.__class__ is list and len(raw) == len(_WRITTEN_ORDER):
        fields = _as_written(cast("list[tuple[str, Any]]", raw))
        if fields is not None:
            return fields
    return _read_any(raw)


def _as_written(raw: list[tuple[str, Any]]) -> HeaderFields | None:
    """:func:`read_headers` of the headers eoguard writes for a send without its own, as
    confluent-kafka gives them (its names in its order, values as bytes): the consumer's
    per-record path, a few microseconds shorter. None for anything else, or anything wrong
    (the general path judges it and names the reason); tests/unit/test_wire_headers.py pins
    this path to the general one."""
    try:
        ((a, spec), (b, mid), (c, created), (d, expires), (e, source), (f, kind),
         (g, attempt), (h, producer), (i, content)) = raw
        if (a, b, c, d, e, f, g, h, i) != _WRITTEN_ORDER or spec != b"1.0":
            return None
        number = attempt.decode()
        if _ATTEMPT.fullmatch(number) is None or int(number) > 2**31 - 1:
            return None
        return HeaderFields(mid.decode(), parse_time(created.decode()),
                            parse_time(expires.decode()), int(number), producer.decode(),
                            content.decode().lower() == AVRO_CONTENT_TYPE,
                            {SOURCE: source.decode("utf-8", "replace"),
                             TYPE: kind.decode("utf-8", "replace")})
    except (AttributeError, TypeError, ValueError):  # not bytes, not UTF-8, not a time
        return None


def _read_any(raw: RawHeaders) -> HeaderFields | None:
    """:func:`read_headers` of any headers."""
    ours: dict[str, str | bytes | None] = {}
    app: dict[str, str] = {}
    repeated: set[str] = set()
    for name, value in raw.items() if isinstance(raw, Mapping) else raw:
        if name not in RESERVED:  # eoguard writes its names in lowercase: one lookup
            lower = name.lower()
            if lower not in RESERVED:
                if value is not None:
                    app[name] = value if value.__class__ is str else \
                        value.decode("utf-8", "replace")  # type: ignore[union-attr]
                continue
            name = lower  # noqa: PLW2901 - a reserved name in another letter case
        if name in ours:
            repeated.add(name)
        else:
            ours[name] = value
    if MARKER not in ours:
        return None
    texts = _texts(ours, repeated)
    if texts[SPEC_VERSION] != "1.0":
        raise _malformed(f"{SPEC_VERSION} is '{texts[SPEC_VERSION][:40]}', not '1.0'")
    attempt = texts[ATTEMPT]
    if _ATTEMPT.fullmatch(attempt) is None or int(attempt) > 2**31 - 1:
        raise _malformed(f"{ATTEMPT} '{attempt[:40]}' is not a whole number from 1 to "
                         f"2^31-1")
    try:
        created = parse_time(texts[TIME])
    except ValueError:
        raise _malformed(f"{TIME} '{texts[TIME][:60]}' is not an RFC 3339 time") from None
    try:
        expires = parse_time(texts[EXPIRY_TIME])
    except ValueError:
        raise _malformed(f"{EXPIRY_TIME} '{texts[EXPIRY_TIME][:60]}' is not an RFC 3339 "
                         f"time") from None
    return HeaderFields(texts[ID], created, expires, int(attempt), texts[PRODUCER],
                        texts[CONTENT_TYPE].lower() == AVRO_CONTENT_TYPE, app)


def _texts(ours: dict[str, str | bytes | None], repeated: set[str]) -> dict[str, str]:
    """eoguard's headers as text (what :func:`read_headers` judges first)."""
    texts: dict[str, str] = {}
    for name in REQUIRED:
        if name in repeated:
            raise _malformed(f"header {name} appears more than once")
        if name not in ours:
            continue
        value = ours[name]
        if value is None:
            raise _malformed(f"header {name} has no value")
        if isinstance(value, str):
            texts[name] = value
            continue
        try:
            texts[name] = value.decode("utf-8")
        except UnicodeDecodeError:
            raise _malformed(f"header {name} is not UTF-8 text") from None
    if len(texts) < len(REQUIRED):
        missing = [name for name in REQUIRED if name not in texts]
        raise _malformed(f"missing header{'s' if len(missing) > 1 else ''} "
                         f"{', '.join(missing)}")
    return texts


FramedReader = Callable[[bytes | None, int | None], tuple[Any, str]]
"""Decodes a registry-framed value of a record created at the given epoch ms: the object and
its writer schema's full name."""


def header_envelope(fields: HeaderFields, value: bytes | None) -> Envelope:
    """The envelope a record in this format stands for, to check by the input rules before
    its payload is read (:func:`header_payload`): ``payload`` is the record value as written
    (framing included), ``payload_schema`` None (``ce_type`` names the schema), ``headers``
    the application's."""
    return Envelope(id=fields.id, expires_at_ms=fields.expires_at_ms,
                    created_at_ms=fields.created_at_ms, producer=fields.producer,
                    attempt=fields.attempt, payload_schema=None,
                    payload=b"" if value is None else value, headers=fields.app)


def header_payload(fields: HeaderFields, value: bytes | None, framed: FramedReader | None
                   ) -> Any:
    """The payload of a record in this format: decoded through ``framed``
    (:meth:`~eoguard.codec.registry_payloads.RegistryPayloads.decode`, the writer schema by
    id; ``created_at_ms`` for its cache of unknown ids) when it is registry-framed Avro, else
    the raw bytes."""
    if not fields.avro:
        return b"" if value is None else value
    if framed is None:
        raise CodecError("header format: an Avro payload (content-type application/avro) "
                         "and no schema_registry configured to read it")
    return framed(value, fields.created_at_ms)[0]
