"""Imports only look down the layers, and the producer and consumer never import each other.

The layers, bottom first (a module may import its own package and any lower layer)::

    errors, redaction, modes, backoff
    envelope, credentials, callbacks, offloop
    codec
    store
    config, kafka, stack, metrics
    producer, consumer
    demo
    cli, the package's __init__

bench/ and connectors/ sit above the package; nothing in the package, bench/ or connectors/
imports tests/.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import eoguard

PACKAGE = Path(eoguard.__file__).parent
ROOT = PACKAGE.parent
LAYERS: tuple[frozenset[str], ...] = (
    frozenset({"errors", "redaction", "modes", "backoff"}),
    frozenset({"envelope", "credentials", "callbacks", "offloop"}),
    frozenset({"codec"}),
    frozenset({"store"}),
    frozenset({"config", "kafka", "stack", "metrics"}),
    frozenset({"producer", "consumer"}),
    frozenset({"demo"}),
    frozenset({"cli", "__init__"}),
)
RANK = {name: rank for rank, names in enumerate(LAYERS) for name in names}


def imports(path: Path) -> Iterator[tuple[int, str]]:
    """(line, module) of every absolute import in a file, wherever it appears."""
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            yield from ((node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            yield node.lineno, node.module


def part_of(path: Path) -> str:
    """The top-level part of the package a file belongs to: its subpackage or module stem."""
    parts = path.relative_to(PACKAGE).parts
    return parts[0] if len(parts) > 1 else Path(parts[0]).stem


def test_every_part_of_the_package_has_a_layer() -> None:
    parts = {part_of(p) for p in PACKAGE.rglob("*.py")}
    assert parts - RANK.keys() == set(), "give the new module a layer in LAYERS"


def test_imports_in_the_package_only_look_down() -> None:
    upward = []
    for path in PACKAGE.rglob("*.py"):
        here = part_of(path)
        for line, module in imports(path):
            names = module.split(".")
            if names[0] != "eoguard" or len(names) == 1:
                continue  # `from eoguard import X` is only the top layer's business: checked below
            there = names[1]
            if there != here and RANK[there] >= RANK[here]:
                upward.append(f"{path.relative_to(ROOT)}:{line} ({here}) imports {module}")
    assert upward == []


def test_only_the_top_layer_imports_the_public_api_module() -> None:
    offenders = [f"{p.relative_to(ROOT)}:{line}" for p in PACKAGE.rglob("*.py")
                 for line, module in imports(p)
                 if module == "eoguard" and RANK[part_of(p)] < RANK["demo"]]
    assert offenders == []


def test_nothing_outside_tests_imports_tests() -> None:
    roots = [PACKAGE, ROOT / "bench", ROOT / "connectors"]
    offenders = [f"{p.relative_to(ROOT)}:{line} imports {module}"
                 for root in roots for p in root.rglob("*.py")
                 for line, module in imports(p) if module.split(".")[0] == "tests"]
    assert offenders == []


def test_the_package_never_imports_the_spark_connector() -> None:
    offenders = [f"{p.relative_to(ROOT)}:{line}" for p in PACKAGE.rglob("*.py")
                 for line, module in imports(p) if module.split(".")[0] == "eoguard_spark"]
    assert offenders == []
