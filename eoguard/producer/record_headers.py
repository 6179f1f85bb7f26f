"""The Kafka record headers of one producer's sends in the header wire format, their size and
their JSON in the outbox record.

:func:`eoguard.codec.headers.write_headers` is the definition; a producer writes the same
``ce_specversion``, ``ce_source``, ``ce_type``, ``ce_eoguardproducer`` and ``content-type``
for every send of a schema, so a send without headers of its own copies a template built once
per schema and sets the id and the two times (the same names in the same order, pinned to
``write_headers`` by tests/unit/test_record_headers.py). The size counts every header's name
and value in UTF-8, as :func:`eoguard.codec.rules.header_bytes` does: the template's once,
then the id and the times, ASCII by construction (a canonical UUID, RFC 3339 text). With the
headers comes the JSON the outbox stores them as (``OutboxEntry.headers_json``): the
template's JSON with the id and the times set in, which JSON writes as they are (no character
of theirs is escaped); the same bytes ``json.dumps`` writes, so the outbox record is unchanged.
"""

from __future__ import annotations

import json
from collections.abc import Mapping

from eoguard.codec.headers import (
    EXPIRY_TIME,
    ID,
    TIME,
    app_headers,
    format_time,
    write_headers,
)
from eoguard.codec.rules import InputLimits, header_bytes
from eoguard.errors import InvalidMessageError

__all__ = ["RecordHeaders"]

_Template = tuple[dict[str, str], int, tuple[str, str, str, str] | None]
_MARKS = ("<eoguard:id>", "<eoguard:time>", "<eoguard:expirytime>")
"""Where the id and the times go in a template's JSON (in the order write_headers writes
them), text JSON writes as it is."""


class RecordHeaders:
    """Writes the header format's headers for one producer (instance id and ``ce_source``)."""

    __slots__ = ("_limits", "_producer", "_source", "_templates")

    def __init__(self, *, producer: str, source: str, limits: InputLimits) -> None:
        self._producer = producer
        self._source = source
        self._limits = limits
        # schema (None: raw bytes) -> the headers with an empty id and times, their bytes,
        # and their JSON cut where the id and the times go (None: not cut, json.dumps them)
        self._templates: dict[str | None, _Template] = {}

    def write(self, message_id: str, created_ms: int, expires_ms: int, schema: str | None,
              app: Mapping[str, str] | None) -> tuple[dict[str, str], int, bytes | None]:
        """The headers of a send, their size in bytes and their JSON (None: not made here);
        :class:`InvalidMessageError` when those a consumer counts as the application's (all
        but the reserved ones, so ``ce_source`` and ``ce_type`` too) exceed ``input_limits``,
        as an envelope's would."""
        if app:
            headers = self._written(message_id, created_ms, expires_ms, schema, app)
            return headers, header_bytes(headers), None
        template = self._templates.get(schema)
        if template is None:
            template = self._template(schema)
        base, size, cut = template
        headers = base.copy()  # a dict keeps the template's order
        created, expires = format_time(created_ms), format_time(expires_ms)
        headers[ID] = message_id
        headers[TIME] = created
        headers[EXPIRY_TIME] = expires
        text = None if cut is None else \
            f"{cut[0]}{message_id}{cut[1]}{created}{cut[2]}{expires}{cut[3]}".encode()
        return headers, size + len(message_id) + len(created) + len(expires), text

    def _written(self, message_id: str, created_ms: int, expires_ms: int, schema: str | None,
                 app: Mapping[str, str] | None) -> dict[str, str]:
        headers = write_headers(message_id, created_ms, expires_ms, attempt=1,
                                producer=self._producer, source=self._source, schema=schema,
                                app=app)
        counted = app_headers(headers)
        size = header_bytes(counted)
        limits = self._limits
        if len(counted) > limits.header_count or size > limits.header_bytes:
            raise InvalidMessageError(
                f"{len(counted)} headers of {size} bytes (ce_source and ce_type included) "
                f"exceed input_limits ({limits.header_count} headers, "
                f"{limits.header_bytes} bytes)")
        return headers

    def _template(self, schema: str | None) -> _Template:
        """The headers of a send of ``schema`` without headers of its own, the id and times
        empty, with their size and cut JSON; checked against the limits (raises as
        :meth:`write` does, and is not kept then)."""
        headers = self._written("", 0, 0, schema, None)
        marked = {**headers, ID: _MARKS[0], TIME: _MARKS[1], EXPIRY_TIME: _MARKS[2]}
        text = json.dumps(marked)
        cut: tuple[str, str, str, str] | None = None
        if all(text.count(mark) == 1 for mark in _MARKS):  # else a value holds a mark
            head, rest = text.split(_MARKS[0])
            between, rest = rest.split(_MARKS[1])
            before, tail = rest.split(_MARKS[2])
            cut = (head, between, before, tail)
        headers[TIME] = headers[EXPIRY_TIME] = ""
        template = self._templates[schema] = (headers, header_bytes(headers), cut)
        return template


