"""TLS and credential settings a local service may be started with (the security tests' stack).

Paths only: the stack never makes certificates; the caller (a test, an operator) does, and
passwords go into the service's own files (mode 0600), never onto a command line it keeps.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from eoguard.errors import StackError


@dataclass(frozen=True, kw_only=True, slots=True)
class TlsFiles:
    """PEM files of a TLS server: the CA that signed it, its certificate chain and its
    unencrypted PKCS#8 private key."""

    ca: Path
    cert: Path
    key: Path


@dataclass(frozen=True, kw_only=True, slots=True)
class Security:
    """A service reached over TLS by named users: ``users`` maps user name to password
    (Redis ACL users; Kafka SCRAM-SHA-512 credentials written at storage format)."""

    tls: TlsFiles
    users: Mapping[str, str] = field(repr=False)

    def __post_init__(self) -> None:
        if not self.users:
            raise StackError("a secured service needs at least one user")
        for name, password in self.users.items():
            # Kafka's --add-scram syntax and Redis's ACL rules split on these.
            if not name or not password or any(c in name + password for c in " ,=[]\"'\n"):
                raise StackError(f"user {name!r}: names and passwords of the local stack are "
                                 "non-empty, without spaces, quotes, ',', '=', '[' or ']'")

    def __repr__(self) -> str:
        return f"Security(tls={self.tls!r}, users={sorted(self.users)!r})"


def write_private(path: Path, text: str) -> None:
    """Write ``text`` to a file only its owner may read (a config that holds passwords)."""
    path.unlink(missing_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(text)
