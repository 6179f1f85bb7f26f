"""The two distributions install apart: ``eoguard`` (no connector inside) and ``eoguard-spark``.

Builds the ``eoguard`` wheel and lists what it installs, then installs both projects from this
checkout into a fresh virtualenv (dependencies from the package index, cached by pip) and runs
the Spark job's ``--help`` there. Slow (about a minute, mostly pyspark), hence its own marker.
"""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.packaging

ROOT = Path(__file__).resolve().parents[2]


def run(*args: str | Path, cwd: Path | None = None) -> str:
    done = subprocess.run([str(a) for a in args], capture_output=True, text=True, cwd=cwd,
                          timeout=600, check=False)
    assert done.returncode == 0, f"{args} failed:\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}"
    return done.stdout


def test_the_eoguard_wheel_holds_only_the_eoguard_package(tmp_path: Path) -> None:
    run(sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", tmp_path, ROOT)
    (wheel,) = tmp_path.glob("eoguard-*.whl")
    tops = {name.split("/")[0] for name in zipfile.ZipFile(wheel).namelist()}
    assert {t for t in tops if not t.endswith(".dist-info")} == {"eoguard"}
    names = zipfile.ZipFile(wheel).namelist()
    assert "eoguard/py.typed" in names
    assert any(n.startswith("eoguard/_schemas/") for n in names)


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
    assert "eoguard-spark==0.1.0" in installed
    assert list(venv.glob("lib/python3*/site-packages/connectors")) == []
