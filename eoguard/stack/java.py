"""Finding a Java runtime of at least a given major version for the stack's JVM services.

Kafka runs on 17 or newer, Apicurio Registry on 21 or newer; Debian 12 ships 17 alone, so a
newer JDK often sits beside it (a Temurin under ``/usr/lib/jvm``) without being on PATH.
Candidates, first match wins: ``EOGUARD_JAVA_HOME``, ``JAVA_HOME``, ``java`` on PATH, then
every JDK under ``/usr/lib/jvm`` (newest first). A JDK's version is read from its ``release``
file, so no JVM is started to ask it.
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Iterator
from pathlib import Path

from eoguard.errors import StackError

JVM_ROOT = Path("/usr/lib/jvm")
_VERSION = re.compile(r'^JAVA_VERSION="(?:1\.)?(\d+)', re.MULTILINE)


def find_java(minimum: int, *, purpose: str) -> str:
    """The ``java`` executable of the first candidate JDK whose major version is ``minimum``
    or more; StackError naming ``purpose`` and what was found when there is none."""
    seen: list[str] = []
    for home in _candidate_homes():
        major = java_major(home)
        java = home / "bin" / "java"
        if major is None or not java.is_file():
            continue
        if major >= minimum:
            return str(java)
        seen.append(f"{home} ({major})")
    found = f"; found only {', '.join(dict.fromkeys(seen))}" if seen else ""
    raise StackError(f"{purpose} needs Java {minimum} or newer{found}: install a JDK {minimum}+ "
                     f"(e.g. Temurin under {JVM_ROOT}) or point EOGUARD_JAVA_HOME at one")


def java_major(home: Path) -> int | None:
    """The major version a JDK's ``release`` file names (``1.8`` reads as 8), None without one."""
    try:
        found = _VERSION.search((home / "release").read_text())
    except OSError:
        return None
    return int(found.group(1)) if found else None


def _candidate_homes() -> Iterator[Path]:
    for var in ("EOGUARD_JAVA_HOME", "JAVA_HOME"):
        value = os.environ.get(var)
        if value:
            yield Path(value)
    on_path = shutil.which("java")
    if on_path:
        yield Path(on_path).resolve().parent.parent  # /usr/bin/java -> <home>/bin/java
    if JVM_ROOT.is_dir():
        homes = [p for p in JVM_ROOT.iterdir() if p.is_dir() and not p.is_symlink()]
        yield from sorted(homes, key=lambda p: java_major(p) or 0, reverse=True)
