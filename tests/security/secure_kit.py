"""What the security tests share: where the secured services listen, and how to log in."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from eoguard.stack.kafka_broker import SCRAM_MECHANISM

USER = "eoguard-app"


@dataclass(frozen=True)
class SecureStack:
    """Where the secured services listen and what a client needs to reach them."""

    kafka_admin: str  # the PLAINTEXT loopback listener: topic creation only
    kafka_bootstrap: str  # SASL_SSL
    redis_url: str  # rediss://, CA in the query, no credentials
    ca: Path
    rogue_ca: Path  # a CA that signed neither server
    kafka_password_file: Path
    kafka_password: str = field(repr=False)
    redis_password: str = field(repr=False)
    logs: tuple[Path, ...] = ()

    def kafka(self, **overrides: Any) -> dict[str, Any]:
        """librdkafka settings for the SASL_SSL listener, the login left to the environment."""
        return {"bootstrap.servers": self.kafka_bootstrap, "security.protocol": "SASL_SSL",
                "sasl.mechanism": SCRAM_MECHANISM, "ssl.ca.location": str(self.ca), **overrides}

    def redis_url_with_ca(self, ca: Path) -> str:
        return self.redis_url.replace(str(self.ca), str(ca))

    @property
    def secrets(self) -> tuple[str, str]:
        return self.kafka_password, self.redis_password
