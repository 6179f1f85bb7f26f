"""What Spark must redact in the configuration and the plans it logs, beyond its defaults.

Spark's default ``spark.redaction.regex``, ``(?i)secret|password|token|access[.]?key``,
matches a key *or* a value; the Kafka source's ``kafka.sasl.jaas.config`` and a Redis URL
with its password carry a secret under a key that does not say so. Spark SQL applies
``spark.redaction.regex`` and ``spark.sql.redaction.options.regex`` to data source options
(the Kafka source's included) wherever a plan shows them.
"""

from __future__ import annotations

REDACTION_REGEX = (r"(?i)secret|password|token|access[.]?key|credential|jaas|sasl\.|"
                   r"ssl[._]key|keystore|truststore\.password|://[^/\s]*@")
"""``spark.redaction.regex``: Spark's default plus JAAS/SASL settings, TLS keys, keystores
and URLs with user info."""

OPTIONS_REDACTION_REGEX = r"(?i)url|jaas|sasl\.|password|secret|token|keystore"
"""``spark.sql.redaction.options.regex``: Spark's default (``url``) plus the secrets above."""

STRING_REDACTION_REGEX = r"""(?i)password=("[^"]*"|\S+)|://[^/\s@]*@"""
"""``spark.sql.redaction.string.regex``: a JAAS password or URL user info inside a plan's
text (the part matched is replaced)."""


def redaction_conf() -> dict[str, str]:
    """The Spark settings a session running the job needs (static and SQL)."""
    return {"spark.redaction.regex": REDACTION_REGEX,
            "spark.sql.redaction.options.regex": OPTIONS_REDACTION_REGEX,
            "spark.sql.redaction.string.regex": STRING_REDACTION_REGEX}
