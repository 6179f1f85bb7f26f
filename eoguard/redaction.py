"""Keeping secrets out of logs, reprs, tables and error messages.

Every place that shows a configuration or a URL goes through these two functions.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

REDACTED = "***"

_SECRET_KEY = re.compile(r"password|secret|sasl\.(username|oauthbearer|kerberos\.keytab|jaas)"
                         r"|ssl\.key|ssl_key|token|credential", re.IGNORECASE)
_SECRET_QUERY = re.compile(r"(?i)([?&][^=&]*(?:password|pass|secret|token)[^=&]*=)[^&#]*")


def redact(conf: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of ``conf`` with every secret-looking value replaced by ``'***'``."""
    return {k: REDACTED if _SECRET_KEY.search(k) else v for k, v in conf.items()}


def redact_url(url: str) -> str:
    """``url`` with its password (user info and secret query parameters) replaced by ``***``.

    Works on malformed URLs too (a password holding ``/`` or ``@``): everything between the
    scheme and the *last* ``@`` is user info, and only a plain user name before ``:`` stays.
    """
    scheme, sep, rest = url.partition("://")
    if not sep:
        scheme, rest = "", url
    at = rest.rfind("@")
    if at >= 0:
        user, colon, _ = rest[:at].partition(":")
        shown = f"{user}:{REDACTED}" if colon and "/" not in user else REDACTED
        rest = f"{shown}{rest[at:]}"
    rest = _SECRET_QUERY.sub(rf"\1{REDACTED}", rest)
    return f"{scheme}{sep}{rest}"
