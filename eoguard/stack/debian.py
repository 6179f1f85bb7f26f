"""Debian packages the stack and its tests need, installed when missing (as root only)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sysconfig
from pathlib import Path

from eoguard.errors import StackError


def ensure_package(package: str, provides: str) -> str:
    """The path of ``provides`` (a command on PATH, or an absolute file path), installing
    Debian's ``package`` first when it is missing and this process may (root, apt-get)."""
    found = _find(provides)
    if found:
        return found
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        raise StackError(f"{provides} is missing; run: sudo apt-get install -y {package}")
    for cmd in (["apt-get", "update", "-qq"], ["apt-get", "install", "-y", "-qq", package]):
        done = subprocess.run(cmd, capture_output=True, text=True, check=False,
                              env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"})
        if done.returncode != 0:
            raise StackError(f"{' '.join(cmd)} failed: {done.stderr.strip()[-500:]}")
    found = _find(provides)
    if not found:
        raise StackError(f"apt-get installed {package} but {provides} is still missing")
    return found


def libfaketime_path() -> str:
    """Where Debian's libfaketime puts the library a skewed process preloads."""
    arch = sysconfig.get_config_var("MULTIARCH") or "x86_64-linux-gnu"
    return f"/usr/lib/{arch}/faketime/libfaketime.so.1"


FAULT_TOOLS = (("nftables", "nft"), ("libfaketime", libfaketime_path()), ("gcc", "gcc"))
"""What the fault tests cut links and skew clocks with (tests/fault/chaos): package, path."""


def _find(provides: str) -> str | None:
    if os.path.isabs(provides):
        return provides if Path(provides).exists() else None
    return shutil.which(provides)
