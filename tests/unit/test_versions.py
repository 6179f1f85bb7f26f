"""One version, written once in ``eoguard/__init__.py``: the ``eoguard`` build reads it, and
``eoguard-spark`` is released under it and requires the ``eoguard`` releases compatible with it.
These checks keep the connector's pyproject from drifting apart from that one place."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.version import Version

import eoguard

tomllib = pytest.importorskip("tomllib", reason="reading pyproject.toml needs Python 3.11's tomllib")

ROOT = Path(__file__).resolve().parents[2]


def project(path: Path) -> dict[str, Any]:
    return tomllib.loads(path.read_text())


def compatible_range(version: str) -> SpecifierSet:
    """From ``version`` up to the next release that may break it: the next minor version while
    the major one is 0, the next major version after that."""
    v = Version(version)
    upper = f"0.{v.minor + 1}" if v.major == 0 else f"{v.major + 1}"
    return SpecifierSet(f">={version},<{upper}")


def test_the_eoguard_build_reads_the_version_from_the_package() -> None:
    toml = project(ROOT / "pyproject.toml")
    assert "version" not in toml["project"]
    assert "version" in toml["project"]["dynamic"]
    assert toml["tool"]["hatch"]["version"]["path"] == "eoguard/__init__.py"
    assert Version(eoguard.__version__)  # a valid PEP 440 version


def test_the_spark_connector_is_released_under_eoguards_version() -> None:
    spark = project(ROOT / "connectors" / "spark" / "pyproject.toml")["project"]
    assert spark["version"] == eoguard.__version__


def test_the_spark_connector_requires_the_eoguard_releases_compatible_with_it() -> None:
    spark = project(ROOT / "connectors" / "spark" / "pyproject.toml")["project"]
    (needs,) = [r for r in map(Requirement, spark["dependencies"]) if r.name == "eoguard"]
    assert needs.specifier == compatible_range(eoguard.__version__)
    assert needs.specifier.contains(eoguard.__version__, prereleases=True)


def test_the_compatible_range_stops_before_the_next_breaking_release() -> None:
    assert compatible_range("0.2.0") == SpecifierSet(">=0.2.0,<0.3")
    assert not compatible_range("0.2.0").contains("0.3.0")
    assert compatible_range("1.4.2") == SpecifierSet(">=1.4.2,<2")
    assert compatible_range("1.4.2").contains("1.9.0")


def test_the_spark_connector_ships_the_repositorys_license() -> None:
    spark = ROOT / "connectors" / "spark"
    assert project(spark / "pyproject.toml")["project"]["license-files"] == ["LICENSE"]
    assert (spark / "LICENSE").read_text() == (ROOT / "LICENSE").read_text()
