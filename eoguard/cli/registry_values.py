"""Schema-Registry-framed record values (``00``, a 4-byte big-endian schema id, the Avro body)
read for the browser: the writer schema fetched by id once, the body read as written.

A value that is not framed, names an id the registry does not hold, or whose body does not
match its schema is a :class:`CodecError` (a bad record, shown as such); a registry that
cannot be reached ends the command (:class:`CliError`).
"""

from __future__ import annotations

import json
from io import BytesIO
from typing import Any

from fastavro import parse_schema, schemaless_reader

from eoguard.cli.context import BadInputError, CliError
from eoguard.errors import CodecError, CorruptRecordError
from eoguard.redaction import redact_url

FRAME_SIZE = 5  # the magic byte and the schema id


class RegistryValues:
    """Decodes framed values through a confluent-kafka ``SchemaRegistryClient``."""

    def __init__(self, client: Any, url: str) -> None:
        self._client = client
        self._url = url
        self._writers: dict[int, tuple[Any, str]] = {}  # schema id -> (parsed, full name)

    @classmethod
    def connect(cls, url: str | None) -> RegistryValues:
        """A client of ``url`` (the local stack's registry when None)."""
        if url is None:
            from eoguard.stack import LocalStack  # noqa: PLC0415 - only framed values need it

            url = LocalStack().endpoints().schema_registry_url
        if not url:
            raise BadInputError("framed values need a Schema Registry: --schema-registry-url")
        try:
            from confluent_kafka.schema_registry import (  # noqa: PLC0415 - the registry extra
                SchemaRegistryClient,
            )
        except ImportError as exc:
            raise CliError("reading Schema-Registry-framed values needs confluent-kafka's "
                           f"registry client: pip install 'eoguard[registry]' ({exc})") from None
        try:
            return cls(SchemaRegistryClient({"url": url}), url)
        except (ValueError, TypeError) as exc:
            raise BadInputError(f"bad Schema Registry URL {redact_url(url)!r}: {exc}") from None

    def decode(self, value: bytes) -> tuple[Any, str]:
        """The object in a framed value and its writer schema's full name."""
        if len(value) <= FRAME_SIZE or value[0] != 0:
            raise CorruptRecordError("not a Schema Registry framed value")
        schema_id = int.from_bytes(value[1:FRAME_SIZE], "big")
        parsed, name = self._writers.get(schema_id) or self._fetch(schema_id)
        body = BytesIO(value[FRAME_SIZE:])
        try:
            obj = schemaless_reader(body, parsed, None)
        except Exception as exc:
            raise CorruptRecordError(f"not a valid {name} record (schema id {schema_id}): "
                                     f"{type(exc).__name__}: {exc}") from exc
        left = len(value) - FRAME_SIZE - body.tell()
        if left:
            raise CorruptRecordError(f"{left} trailing bytes after the {name} record "
                                     f"(schema id {schema_id})")
        return obj, name

    def _fetch(self, schema_id: int) -> tuple[Any, str]:
        try:
            fetched = self._client.get_schema(schema_id)
        except Exception as exc:
            if getattr(exc, "http_status_code", None) == 404:
                raise CodecError(f"schema id {schema_id} is not in the registry") from exc
            raise CliError(f"Schema Registry at {redact_url(self._url)} failed fetching schema "
                           f"id {schema_id}: {type(exc).__name__}: {exc}") from exc
        kind = getattr(fetched, "schema_type", None) or "AVRO"
        if kind != "AVRO":
            raise CodecError(f"schema id {schema_id} is a {kind} schema; only Avro is decoded")
        try:
            schema = json.loads(fetched.schema_str)
            parsed = parse_schema(schema)
        except Exception as exc:
            raise CodecError(f"schema id {schema_id} is not an Avro schema fastavro reads: {exc}"
                             ) from exc
        name = parsed.get("name", kind.lower()) if isinstance(parsed, dict) else kind.lower()
        self._writers[schema_id] = (parsed, str(name))
        return parsed, str(name)

    def close(self) -> None:
        close = getattr(self._client, "close", None)
        if close is not None:
            close()
