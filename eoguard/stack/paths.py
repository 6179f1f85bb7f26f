"""Where the local stack keeps its jars, data, pid files and logs."""

from __future__ import annotations

import os
from pathlib import Path

_PACKAGE_DIR = Path(__file__).resolve().parent.parent


def repo_root() -> Path | None:
    """The source checkout eoguard runs from, if any (it holds ``compose/maven``)."""
    candidate = _PACKAGE_DIR.parent
    return candidate if (candidate / "compose" / "maven").is_dir() else None


def maven_dir() -> Path:
    """The folder holding the ``kafka/`` and ``spark/`` resolution POMs."""
    root = repo_root()
    if root is not None:
        return root / "compose" / "maven"
    return _PACKAGE_DIR / "_maven"  # wheels carry the POMs here (pyproject force-include)


def cache_dir() -> Path:
    """Root of everything the stack downloads or writes; ``EOGUARD_CACHE_DIR`` overrides it."""
    override = os.environ.get("EOGUARD_CACHE_DIR")
    if override:
        return Path(override)
    root = repo_root()
    if root is not None:
        return root / ".cache" / "eoguard"
    return Path.home() / ".cache" / "eoguard"
