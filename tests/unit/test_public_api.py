"""The public API is exactly ``eoguard.__all__``: a change to it is a deliberate change here."""

from __future__ import annotations

import ast
from pathlib import Path

import eoguard
import eoguard.errors

PACKAGE = Path(eoguard.__file__).parent


def test_all_is_sorted_unique_and_importable() -> None:
    names = list(eoguard.__all__)
    assert names == sorted(set(names))
    for name in names:
        assert hasattr(eoguard, name), name


def test_every_error_is_public_and_named_error() -> None:
    errors = [v for v in vars(eoguard.errors).values()
              if isinstance(v, type) and issubclass(v, eoguard.errors.EoguardError)]
    assert len(errors) > 10
    for cls in errors:
        assert cls.__name__.endswith("Error")
        assert cls.__name__ in eoguard.__all__, f"{cls.__name__} is not exported"
        assert cls.__name__ in (eoguard.errors.__doc__ or ""), f"{cls.__name__} missing from the tree"


def test_the_package_never_imports_pyspark() -> None:
    offenders = []
    for path in PACKAGE.rglob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            mods = ([a.name for a in node.names] if isinstance(node, ast.Import)
                    else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            offenders += [f"{path}: {m}" for m in mods if m.split(".")[0] == "pyspark"]
    assert offenders == []


def test_the_package_is_typed() -> None:
    assert (PACKAGE / "py.typed").is_file()


def test_every_library_error_says_what_the_caller_does_next() -> None:
    """Below the root, an error of the library is bad input, retry-later or a state conflict."""
    errors = eoguard.errors
    groups = (errors.InvalidInputError, errors.UnavailableError, errors.StateError)
    tools = (errors.StackError, errors.DemoError)  # the local stack and the demo, not the library
    for cls in vars(errors).values():
        if not isinstance(cls, type) or not issubclass(cls, errors.EoguardError):
            continue
        if cls is errors.EoguardError or cls in tools:
            continue
        assert sum(issubclass(cls, group) for group in groups) == 1, cls.__name__


def test_what_a_configuration_is_built_from_is_public() -> None:
    """The key space (the only way to set a prefix, shard count or max_ttl) and the enums of
    the configurations' fields are importable from ``eoguard`` itself."""
    for name in ("KeySpace", "Durability", "PersistenceMode", "KeepUntil", "InputLimits",
                 "WireFormat", "SchemaRegistryConfig"):
        assert name in eoguard.__all__, name
    assert eoguard.RedisConfig(url="redis://x:1/0").durability is eoguard.Durability.LOCAL
    config = eoguard.ProducerConfig(kafka={"bootstrap.servers": "k:9092"},
                                    redis=eoguard.RedisConfig(url="redis://x:1/0"),
                                    keyspace=eoguard.KeySpace(prefix="app", shards=4))
    assert config.keyspace.shards == 4
