"""Keeping secrets out of logs, reprs, tables and error messages.

Every place that shows a configuration, a URL or an error quoting a configuration goes
through these functions.
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


def scrub(text: str, conf: Mapping[str, Any]) -> str:
    """``text`` (a client library's error message) with every value of ``conf``'s secret keys
    replaced by ``'***'``: librdkafka quotes the value it refuses ("Invalid value ...")."""
    for key, value in conf.items():
        if _SECRET_KEY.search(key) and isinstance(value, str) and value:
            text = text.replace(value, REDACTED)
    return text
