"""``eoguard browse TOPIC``: a topic's records as kcat shows them, with eoguard's view beside
each: the message id, its expiry, its state in each ``--scope`` (the dedup keys, read through
:mod:`eoguard.store.dedup_admin`), and the payload decoded.

A record in the header format (eoguard's ``ce_eoguardattempt`` header) has its id and expiry
in headers and its payload framed for the registry or raw. Otherwise the value's first bytes
say: ``C3 01`` an eoguard envelope (its payload through the local schemas), ``00`` + a 4-byte
schema id a Schema-Registry-framed value (a plain producer's, no eoguard id). Framed payloads
are read through the registry (:class:`~eoguard.codec.registry_payloads.RegistryPayloads`,
the writer schema by id). Anything else, or a record that fails to decode, is shown as a bad
record with the reason; the browse goes on.
"""

from __future__ import annotations

import base64
import datetime
import decimal
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import click
from confluent_kafka import Message
from rich.markup import escape

from eoguard.cli import render
from eoguard.cli.context import BadInputError, CliContext, CliError, json_option, pass_cli
from eoguard.cli.dedup import id_states
from eoguard.cli.kafka_options import kafka_config, kafka_options, shown
from eoguard.codec import MAGIC, EnvelopeCodec, PayloadCodec
from eoguard.codec.headers import header_payload, read_headers
from eoguard.codec.registry_payloads import FRAME_SIZE, RegistryPayloads
from eoguard.config import SchemaRegistryConfig
from eoguard.errors import CodecError
from eoguard.kafka.reader import Offset, TopicReader

REGISTRY_MAGIC = 0
PREVIEW_CHARS = 120  # a payload's width in the table (--json shows it whole)


@dataclass
class Row:
    """One record as the browser shows it."""

    partition: int
    offset: int
    key: str | None
    format: str  # envelope, headers (eoguard's header format), registry (framed, plain), bad
    id: str | None = None
    expires_at_ms: int | None = None
    schema: str | None = None
    payload: Any = None
    error: str | None = None
    states: dict[str, str] = field(default_factory=dict)

    def as_data(self, now_ms: int | None) -> dict[str, Any]:
        return {
            "partition": self.partition, "offset": self.offset, "key": self.key,
            "format": self.format, "id": self.id,
            "expires_at": render.iso_ms(self.expires_at_ms),
            "expired": (None if self.expires_at_ms is None or now_ms is None
                        else self.expires_at_ms <= now_ms),
            "schema": self.schema, "payload": self.payload, "error": self.error,
            "dedup": self.states,
        }


class Decoder:
    """Turns one Kafka record into a :class:`Row`, never raising for a bad record."""

    def __init__(self, registry: Callable[[], RegistryPayloads]) -> None:
        self._envelopes = EnvelopeCodec()
        self._payloads = PayloadCodec(self._envelopes.registry)
        self._registry_factory = registry
        self._registry: RegistryPayloads | None = None

    def _framed_reader(self) -> RegistryPayloads:
        if self._registry is None:
            self._registry = self._registry_factory()
        return self._registry

    def row(self, message: Message) -> Row:
        value = message.value()
        row = Row(partition=message.partition() or 0, offset=message.offset() or 0,
                  key=_text(message.key()), format="bad")
        try:
            fields = read_headers(message.headers())
        except CodecError as exc:
            row.error = f"headers: {exc}"
            return row
        if fields is not None:
            row.format, row.id, row.expires_at_ms = "headers", fields.id, fields.expires_at_ms
            def framed(data: bytes | None, created_at_ms: int | None) -> tuple[Any, str]:
                obj, row.schema = self._framed_reader().decode(data, created_at_ms)
                return obj, row.schema

            try:
                row.payload = jsonable(header_payload(fields, value, framed))
            except CodecError as exc:
                row.error = f"payload: {exc}"
        elif value is None:
            row.error = "no value (a tombstone)"
        elif value[:2] == MAGIC:
            self._envelope(value, row)
        elif len(value) > FRAME_SIZE and value[0] == REGISTRY_MAGIC:
            self._framed(value, row)
        else:
            row.error = (f"neither an eoguard envelope (C3 01) nor Schema Registry framed "
                         f"(00 + schema id): starts with {value[:2].hex() or 'nothing'}")
        return row

    def _envelope(self, value: bytes, row: Row) -> None:
        try:
            env = self._envelopes.decode(value)
        except CodecError as exc:
            row.error = f"envelope: {exc}"
            return
        row.format, row.id, row.expires_at_ms = "envelope", env.id, env.expires_at_ms
        row.schema = env.payload_schema
        try:
            row.payload = jsonable(self._payloads.decode_envelope(env))
        except CodecError as exc:  # the envelope is fine; its payload is not readable here
            row.error = f"payload: {exc}"

    def _framed(self, value: bytes, row: Row) -> None:
        try:
            obj, row.schema = self._framed_reader().decode(value)
        except CodecError as exc:
            row.error = f"registry: {exc}"
            return
        row.format, row.payload = "registry", jsonable(obj)

    def close(self) -> None:
        if self._registry is not None:
            self._registry.close()


def jsonable(value: Any) -> Any:
    """A decoded payload as JSON shows it: bytes as UTF-8 text (else base64), times in
    ISO-8601, decimals and UUIDs as text."""
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if isinstance(value, (bytes, bytearray, memoryview)):
        return _text(bytes(value))
    if isinstance(value, (datetime.datetime, datetime.date, datetime.time)):
        return value.isoformat()
    if isinstance(value, (decimal.Decimal, uuid.UUID)):
        return str(value)
    return value


def _text(data: bytes | str | None) -> str | None:
    if data is None or isinstance(data, str):
        return data
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return "base64:" + base64.b64encode(data).decode("ascii")


@click.command()
@click.argument("topic")
@click.option("--partition", "-p", "partitions", multiple=True, type=click.IntRange(0),
              help="Only this partition (repeatable) [default: all].")
@click.option("--offset", "-o", "offset", default="beginning", show_default=True,
              metavar="beginning|end|N|-N",
              help="Where each partition starts: its beginning, its end, offset N, or N "
                   "records before the end.")
@click.option("--count", "-c", type=click.IntRange(1), default=None,
              help="Stop after this many records [default: read to the end].")
@click.option("--scope", "-s", "scopes", multiple=True,
              help="Show each record's dedup state in this consumer scope (repeatable).")
@click.option("--schema-registry-url", envvar="EOGUARD_SCHEMA_REGISTRY_URL", show_envvar=True,
              default=None, metavar="URL",
              help="Schema Registry for framed values [default: the local stack's].")
@click.option("--timeout", "timeout_s", default=30.0, show_default=True, type=click.FloatRange(1),
              help="Seconds to wait for Kafka without progress.")
@kafka_options
@json_option
@pass_cli
def browse(cli: CliContext, topic: str, *, partitions: tuple[int, ...], offset: str,
           count: int | None, scopes: tuple[str, ...], schema_registry_url: str | None,
           timeout_s: float, bootstrap_servers: str | None, config_file: Any,
           overrides: tuple[str, ...]) -> None:
    """Show TOPIC's records: partition, offset, id, expiry, dedup state per --scope, payload.

    Reads each partition (lowest first) from --offset to its end, without a consumer group
    and without committing. Kafka's client settings: -b, -F FILE and -X key=value, as kcat
    takes them (secrets are never shown).
    """
    conf = kafka_config(bootstrap_servers, config_file, overrides)
    start = Offset.parse(offset)
    decoder = Decoder(lambda: _registry(schema_registry_url))
    reader = TopicReader(conf, timeout_s=timeout_s)
    try:
        wanted = _partitions(reader.partitions(topic), partitions, topic)
        rows = [decoder.row(m) for m in reader.read(topic, wanted, start, count)]
    finally:
        reader.close()
        decoder.close()
    now = None
    if scopes:
        states, now = id_states(cli, (row.id for row in rows if row.id is not None), scopes)
        for row in rows:
            row.states = states.get(row.id, {}) if row.id is not None else {}
    data = {"topic": topic, "client": shown(conf), "records": [r.as_data(now) for r in rows]}
    render.show(cli, data, _table(topic, rows, scopes, now))


def _registry(url: str | None) -> RegistryPayloads:
    """The reader of framed payloads: ``url``'s registry, the local stack's by default."""
    if url is None:
        from eoguard.stack import LocalStack  # noqa: PLC0415 - only framed values need it

        url = LocalStack().endpoints().schema_registry_url
    if not url:
        raise BadInputError("framed values need a Schema Registry: --schema-registry-url")
    return RegistryPayloads(SchemaRegistryConfig(url=url).connect(), owns_client=True)


def _partitions(existing: list[int], asked: tuple[int, ...], topic: str) -> list[int]:
    missing = sorted(set(asked) - set(existing))
    if missing:
        raise CliError(f"topic {topic!r} has no partition {', '.join(map(str, missing))} "
                       f"(it has {len(existing)})")
    return sorted(set(asked)) if asked else existing


def _table(topic: str, rows: list[Row], scopes: tuple[str, ...], now: int | None) -> Any:
    columns = ["partition", "offset", "id", "expires at", *scopes, "payload"]
    lines = []
    for row in rows:
        data = row.as_data(now)
        expiry = data["expires_at"]
        if expiry is not None and data["expired"]:
            expiry += " (expired)"
        body = row.payload if row.error is None else f"[{row.format}] {row.error}"
        text = render.cell(body)
        if len(text) > PREVIEW_CHARS:
            text = text[:PREVIEW_CHARS - 1] + "…"
        text = escape(text)  # the record's own text, never rich markup
        lines.append([row.partition, row.offset, row.id, expiry,
                      *(row.states.get(s) for s in scopes), text])
    return render.table(f"{topic}: {len(rows)} record(s)", columns, lines)


__all__ = ["browse"]
