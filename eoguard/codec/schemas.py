"""Avro schemas loaded from ``schemas/``, looked up by full name or by fingerprint.

The fingerprint is CRC-64-AVRO (the Avro specification's Rabin fingerprint) of the
schema's Parsing Canonical Form; single-object encoding carries it as 8 little-endian
bytes. The canonical form drops ``doc``, ``default`` and ``logicalType``, so a copy of a
schema with its logical types stripped has the same fingerprint and the same wire format:
:attr:`RegisteredSchema.plain` is that copy, for hot paths that want plain ints and
strings instead of datetimes and UUIDs.

Where the schemas come from (first match wins): the ``EOGUARD_SCHEMA_DIR`` environment
variable; the repository's top-level ``schemas/`` when running from a checkout; the copy
installed in the wheel as ``eoguard/_schemas``. Top-level ``*.avsc`` files of the
directory are the current schemas (one per full name); older versions of a schema, kept
so that records written with them stay readable, go under ``<dir>/history/*.avsc`` and
are looked up by fingerprint only.
"""

from __future__ import annotations

import functools
import json
import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import fastavro
from fastavro.schema import fingerprint as _fastavro_fingerprint
from fastavro.schema import to_parsing_canonical_form

from eoguard.errors import ConfigError, SchemaNotFoundError, UnknownFingerprintError

__all__ = [
    "RegisteredSchema",
    "SchemaRegistry",
    "crc64_avro",
    "default_schema_dir",
    "fingerprint_of",
]

SCHEMA_DIR_ENV = "EOGUARD_SCHEMA_DIR"

def crc64_avro(canonical_form: str) -> bytes:
    """The 8-byte little-endian CRC-64-AVRO (Rabin) fingerprint of a Parsing Canonical Form,
    as single-object encoding writes it (fastavro computes it)."""
    return bytes.fromhex(_fastavro_fingerprint(canonical_form, "CRC-64-AVRO"))


def fingerprint_of(schema: dict[str, Any] | str | list[Any]) -> bytes:
    """The 8-byte little-endian CRC-64-AVRO fingerprint of a schema, as single-object encoding writes it."""
    return crc64_avro(to_parsing_canonical_form(fastavro.parse_schema(schema)))


def _strip_logical_types(node: Any) -> Any:
    """A deep copy of a schema without ``logicalType`` (same canonical form, plain values)."""
    if isinstance(node, dict):
        return {k: _strip_logical_types(v) for k, v in node.items() if k != "logicalType"}
    if isinstance(node, list):
        return [_strip_logical_types(v) for v in node]
    return node


@dataclass(frozen=True, slots=True)
class RegisteredSchema:
    """One loaded schema: its JSON, its fingerprint and fastavro's parsed forms."""

    name: str
    """Full name (``namespace.name``), e.g. ``eoguard.Envelope``."""
    schema: dict[str, Any] = field(repr=False)
    """The schema JSON as written in its ``.avsc`` file."""
    canonical_form: str = field(repr=False)
    fingerprint: bytes
    """8-byte little-endian CRC-64-AVRO of the canonical form (the single-object header)."""
    parsed: Any = field(repr=False)
    """fastavro-parsed schema with logical types (datetimes, decimals, UUIDs)."""
    plain: Any = field(repr=False)
    """fastavro-parsed schema with logical types stripped (same wire format and fingerprint)."""
    source: Path | None = None

    def without_logical_types(self) -> dict[str, Any]:
        """The schema JSON with ``logicalType`` dropped: same fingerprint and wire format,
        plain values (Spark's ``from_avro`` then reads a timestamp-millis as a long)."""
        plain: dict[str, Any] = _strip_logical_types(self.schema)
        return plain

    @classmethod
    def from_json(cls, schema: dict[str, Any], source: Path | None = None) -> RegisteredSchema:
        """Parse ``schema``; raises :class:`ConfigError` if it is not a valid named Avro schema."""
        try:
            parsed = fastavro.parse_schema(schema)
            plain = fastavro.parse_schema(_strip_logical_types(schema))
            canonical = to_parsing_canonical_form(parsed)
        except Exception as exc:
            raise ConfigError(f"invalid Avro schema {source or ''}: {exc}") from exc
        name = parsed.get("name") if isinstance(parsed, dict) else None
        if not isinstance(name, str):
            raise ConfigError(f"schema {source or ''} is not a named type (record, enum, fixed)")
        fingerprint = crc64_avro(canonical)
        return cls(name=name, schema=schema, canonical_form=canonical,
                   fingerprint=fingerprint, parsed=parsed, plain=plain, source=source)


def _load_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ConfigError(f"cannot read schema file {path}: {exc}") from exc
    if not isinstance(data, dict):
        raise ConfigError(f"schema file {path} does not hold a JSON object")
    return data


class SchemaRegistry:
    """Named Avro schemas by full name (current version) and by fingerprint (all versions)."""

    def __init__(self, schemas: Iterable[RegisteredSchema] = ()) -> None:
        self._by_name: dict[str, RegisteredSchema] = {}
        self._by_fingerprint: dict[bytes, RegisteredSchema] = {}
        for entry in schemas:
            self.register(entry)

    @classmethod
    def from_dir(cls, directory: str | os.PathLike[str]) -> SchemaRegistry:
        """Load ``<directory>/*.avsc`` as current schemas and ``<directory>/history/*.avsc``
        as older versions; raises :class:`ConfigError` for a missing directory or bad file."""
        root = Path(directory)
        if not root.is_dir():
            raise ConfigError(f"schema directory {root} does not exist")
        registry = cls()
        for path in sorted(root.glob("*.avsc")):
            registry.register(RegisteredSchema.from_json(_load_json(path), path))
        for path in sorted((root / "history").glob("*.avsc")):
            registry.register(RegisteredSchema.from_json(_load_json(path), path), current=False)
        return registry

    @classmethod
    def default(cls) -> SchemaRegistry:
        """The registry of :func:`default_schema_dir`, loaded once per process."""
        return _default_registry()

    def register(self, schema: RegisteredSchema | dict[str, Any], *, current: bool = True
                 ) -> RegisteredSchema:
        """Add a schema. ``current=False`` adds an older version, found by fingerprint only.

        Two different current schemas with one full name raise :class:`ConfigError`.
        """
        entry = schema if isinstance(schema, RegisteredSchema) else RegisteredSchema.from_json(schema)
        self._by_fingerprint.setdefault(entry.fingerprint, entry)
        if current:
            existing = self._by_name.get(entry.name)
            if existing is not None and existing.fingerprint != entry.fingerprint:
                raise ConfigError(
                    f"two current schemas named {entry.name}: {existing.source} and {entry.source};"
                    " move the older one to history/"
                )
            self._by_name[entry.name] = entry
        return entry

    def get(self, name: str) -> RegisteredSchema:
        """The current schema called ``name``; raises :class:`SchemaNotFoundError`."""
        try:
            return self._by_name[name]
        except KeyError:
            raise SchemaNotFoundError(f"no Avro schema named {name!r} is loaded",
                                      schema=name) from None

    def by_fingerprint(self, fingerprint: bytes) -> RegisteredSchema:
        """The schema (any version) with this 8-byte fingerprint; raises
        :class:`UnknownFingerprintError`."""
        try:
            return self._by_fingerprint[fingerprint]
        except KeyError:
            raise UnknownFingerprintError(
                f"no loaded schema has fingerprint {fingerprint.hex()}", fingerprint=fingerprint
            ) from None

    def versions(self, name: str) -> list[RegisteredSchema]:
        """Every loaded version of ``name`` (the current one included)."""
        return [s for s in self._by_fingerprint.values() if s.name == name]

    def names(self) -> list[str]:
        """Full names of the current schemas, sorted."""
        return sorted(self._by_name)

    def __contains__(self, name: object) -> bool:
        return name in self._by_name

    def __repr__(self) -> str:
        return f"SchemaRegistry({', '.join(self.names())})"


def default_schema_dir() -> Path:
    """``$EOGUARD_SCHEMA_DIR``, else the checkout's ``schemas/``, else ``eoguard/_schemas``."""
    override = os.environ.get(SCHEMA_DIR_ENV)
    if override:
        return Path(override)
    package = Path(__file__).resolve().parent.parent
    checkout = package.parent / "schemas"
    if (checkout / "envelope.avsc").is_file():
        return checkout
    return package / "_schemas"


@functools.lru_cache(maxsize=1)
def _default_registry() -> SchemaRegistry:
    return SchemaRegistry.from_dir(default_schema_dir())
