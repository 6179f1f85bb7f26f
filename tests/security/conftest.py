"""A Redis that speaks TLS to ACL users only and a Kafka with a SASL_SSL (SCRAM-SHA-512)
listener, both started by these fixtures with certificates made at test time.

The passwords are fresh random strings, so a test can grep everything it captured for them.
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Iterator

import pytest

from eoguard.stack.kafka_broker import KafkaBroker
from eoguard.stack.redis_server import RedisServer
from eoguard.stack.tls import Security, write_private
from tests.conftest import free_port
from tests.security.certs import make_ca, make_server_files
from tests.security.secure_kit import USER, SecureStack


@pytest.fixture(scope="session")
def secure_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecureStack]:
    """The secured Redis and Kafka of this session (~15 s to start), stopped at the end."""
    started = time.monotonic()
    root = tmp_path_factory.mktemp("secure")
    tls = make_server_files(root / "certs")
    rogue, _, _ = make_ca(root / "certs", "rogue-ca")
    kafka_password, redis_password = f"kpw-{uuid.uuid4().hex}", f"rpw-{uuid.uuid4().hex}"
    redis = RedisServer(root / "redis", port=free_port(),
                        security=Security(tls=tls, users={USER: redis_password}))
    kafka = KafkaBroker(root / "kafka", port=free_port(), controller_port=free_port(),
                        secure_port=free_port(),
                        security=Security(tls=tls, users={USER: kafka_password}))
    password_file = root / "kafka-password"
    write_private(password_file, kafka_password + "\n")
    redis.start()
    try:
        kafka.start()
        print(f"certificates made, TLS Redis and SASL_SSL Kafka started in "
              f"{time.monotonic() - started:.1f} s")
        try:
            yield SecureStack(
                kafka_admin=kafka.address, kafka_bootstrap=kafka.secure_address,
                redis_url=f"{redis.address}?ssl_ca_certs={tls.ca}", ca=tls.ca, rogue_ca=rogue,
                kafka_password_file=password_file, kafka_password=kafka_password,
                redis_password=redis_password, logs=(redis.log_path, kafka.log_path))
        finally:
            kafka.stop()
    finally:
        redis.stop()


@pytest.fixture
def login_env(secure_stack: SecureStack, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """The logins in the environment: Redis's password in a variable, Kafka's in a file."""
    env = {"EOGUARD_REDIS_USERNAME": USER, "EOGUARD_REDIS_PASSWORD": secure_stack.redis_password,
           "EOGUARD_KAFKA_SASL_USERNAME": USER,
           "EOGUARD_KAFKA_SASL_PASSWORD_FILE": str(secure_stack.kafka_password_file)}
    for name in ("EOGUARD_REDIS_PASSWORD_FILE", "EOGUARD_KAFKA_SASL_PASSWORD"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    return {**os.environ}
