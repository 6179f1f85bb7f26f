"""The two distributions install apart: ``eoguard`` (no connector inside) and ``eoguard-spark``.

Builds both wheels and reads what they install and declare (the one version, the license, the
typed marker), then installs both projects from this checkout into a fresh virtualenv
(dependencies from the package index, cached by pip) and runs the Spark job's ``--help`` there.
Slow (about a minute, mostly pyspark), hence its own marker.
"""

from __future__ import annotations

import email
import os
import subprocess
import sys
import zipfile
from email.message import Message
from pathlib import Path

import pytest
from packaging.requirements import Requirement

import eoguard

pytestmark = pytest.mark.packaging

ROOT = Path(__file__).resolve().parents[2]


def run(*args: str | Path, cwd: Path | None = None) -> str:
    # Without PYTHONPATH: a checkout on it (as in development) would shadow what was installed.
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run([str(a) for a in args], capture_output=True, text=True, cwd=cwd,
                          env=env, timeout=600, check=False)
    assert done.returncode == 0, f"{args} failed:\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}"
    return done.stdout


def build_wheel(project: Path, into: Path) -> zipfile.ZipFile:
    run(sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", into, project)
    (wheel,) = into.glob("*.whl")
    return zipfile.ZipFile(wheel)


def metadata(wheel: zipfile.ZipFile) -> Message:
    (name,) = [n for n in wheel.namelist() if n.endswith(".dist-info/METADATA")]
    return email.message_from_bytes(wheel.read(name))


def check_declared(wheel: zipfile.ZipFile) -> Message:
    """The one version, the Apache-2.0 license with its text, the typed marker's classifier."""
    meta = metadata(wheel)
    assert meta["Version"] == eoguard.__version__
    assert meta["License-Expression"] == "Apache-2.0"
    assert meta.get_all("License-File") == ["LICENSE"]
    (license_text,) = [n for n in wheel.namelist() if n.endswith(".dist-info/licenses/LICENSE")]
    assert wheel.read(license_text) == (ROOT / "LICENSE").read_bytes()
    assert "Typing :: Typed" in meta.get_all("Classifier", [])
    assert meta.get_all("Project-URL") is None  # the repository stands alone
    return meta


def test_the_eoguard_wheel_holds_only_the_eoguard_package(tmp_path: Path) -> None:
    wheel = build_wheel(ROOT, tmp_path)
    tops = {name.split("/")[0] for name in wheel.namelist()}
    assert {t for t in tops if not t.endswith(".dist-info")} == {"eoguard"}
    names = wheel.namelist()
    assert "eoguard/py.typed" in names
    assert any(n.startswith("eoguard/_schemas/") for n in names)
    check_declared(wheel)


def test_the_spark_wheel_is_typed_and_requires_a_compatible_eoguard(tmp_path: Path) -> None:
    wheel = build_wheel(ROOT / "connectors" / "spark", tmp_path)
    assert "eoguard_spark/py.typed" in wheel.namelist()
    meta = check_declared(wheel)
    (needs,) = [r for r in map(Requirement, meta.get_all("Requires-Dist", []))
                if r.name == "eoguard"]
    assert needs.specifier.contains(eoguard.__version__, prereleases=True)
    assert not needs.specifier.contains("99.0")  # a range, bounded above


def test_the_spark_job_installs_as_its_own_distribution(tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    run(sys.executable, "-m", "venv", venv)
    python = venv / "bin" / "python"
    run(python, "-m", "pip", "install", "-q", ROOT, ROOT / "connectors" / "spark")
    # Run from elsewhere than the checkout, so nothing is imported from the source tree.
    usage = run(python, "-m", "eoguard_spark", "--help", cwd=tmp_path)
    assert usage.startswith("usage: python -m eoguard_spark")
    assert "--scope" in usage
    where = run(python, "-c", "import eoguard_spark, eoguard; print(eoguard_spark.__file__); "
                "print(eoguard.__file__)", cwd=tmp_path).split()
    assert all(str(venv) in path for path in where), where
    installed = run(python, "-m", "pip", "list", "--format=freeze")
    assert f"eoguard-spark=={eoguard.__version__}" in installed
    assert f"eoguard=={eoguard.__version__}" in installed
    assert list(venv.glob("lib/python3*/site-packages/connectors")) == []
