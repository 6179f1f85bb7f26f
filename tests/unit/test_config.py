"""ProducerConfig and RedisConfig: secrets out of repr, forced acks, invalid values refused."""

from __future__ import annotations

import logging

import pytest
import redis

from eoguard.config import (
    Durability,
    KeepUntil,
    PersistenceMode,
    ProducerConfig,
    RedisConfig,
    SchemaRegistryConfig,
    redact,
)
from eoguard.config.services import REGISTRY_TIMEOUT_S
from eoguard.errors import ConfigError
from eoguard.store.keys import KeySpace

REDIS = RedisConfig(url="redis://127.0.0.1:6379/0")
SECRETS = {
    "sasl.password": "s3cr3t-sasl",
    "sasl.username": "alice-user",
    "ssl.key.password": "s3cr3t-keypass",
    "ssl.key.pem": "-----BEGIN PRIVATE KEY-----s3cr3t",
    "sasl.oauthbearer.client.secret": "s3cr3t-oauth",
}


def config(**kw) -> ProducerConfig:
    return ProducerConfig(**{"kafka": {"bootstrap.servers": "b:9092"}, "redis": REDIS, **kw})


def test_defaults_are_the_documented_ones() -> None:
    cfg = config()
    assert cfg.mode is PersistenceMode.PERSIST_FIRST
    assert cfg.keep_until is KeepUntil.CONSUMED
    assert cfg.message_timeout_ms == 300_000
    assert cfg.resend_after_ms == 315_000
    assert cfg.keyspace == KeySpace()


def test_modes_and_keep_until_accept_their_strings() -> None:
    cfg = config(mode="delayed", keep_until="published")
    assert cfg.mode is PersistenceMode.DELAYED
    assert cfg.keep_until is KeepUntil.PUBLISHED


def test_secrets_never_appear_in_repr() -> None:
    cfg = config(kafka={"bootstrap.servers": "b:9092", "security.protocol": "SASL_SSL",
                        **SECRETS},
                 redis=RedisConfig(url="rediss://bob:r3dis-pw@host:6380/0", username="bob",
                                   password="r3dis-acl-pw",
                                   options={"ssl_keyfile": "/k.pem", "ssl_password": "kp"}))
    text = repr(cfg) + str(cfg) + repr(cfg.redis)
    for secret in [*SECRETS.values(), "r3dis-pw", "r3dis-acl-pw", "kp"]:
        assert secret not in text
    assert "'security.protocol': 'SASL_SSL'" in text  # non-secrets stay readable
    assert "b:9092" in text
    assert "rediss://bob:***@host:6380/0" in text
    assert "'sasl.password': '***'" in text
    assert redact({"ssl.key.location": "/etc/k", "linger.ms": 5}) == {
        "ssl.key.location": "***", "linger.ms": 5}


def test_kafka_config_forces_acks_all_and_idempotence(caplog) -> None:
    cfg = config(kafka={"bootstrap.servers": "b:9092", "acks": "1",
                        "enable.idempotence": "false", "linger.ms": 20, **SECRETS})
    with caplog.at_level(logging.WARNING, logger="eoguard.config.producer"):
        conf = cfg.kafka_config()
    assert conf["acks"] == "all"
    assert conf["enable.idempotence"] is True
    assert conf["linger.ms"] == 20
    assert conf["sasl.password"] == "s3cr3t-sasl"  # passed through to librdkafka
    messages = " ".join(r.getMessage() for r in caplog.records)
    assert "acks=all" in messages
    assert "'1'" in messages
    assert "enable.idempotence=true" in messages
    for secret in SECRETS.values():
        assert secret not in messages


def test_kafka_config_is_quiet_when_already_safe(caplog) -> None:
    cfg = config(kafka={"bootstrap.servers": "b:9092", "acks": -1, "enable.idempotence": True})
    with caplog.at_level(logging.WARNING, logger="eoguard.config.producer"):
        conf = cfg.kafka_config()
    assert caplog.records == []
    assert (conf["acks"], conf["enable.idempotence"]) == ("all", True)


def test_resend_after_follows_the_message_timeout() -> None:
    cfg = config(kafka={"bootstrap.servers": "b", "message.timeout.ms": 10_000})
    assert cfg.resend_after_ms == 25_000
    assert config(kafka={"bootstrap.servers": "b", "delivery.timeout.ms": "5000"},
                  resend_after_s=6).resend_after_ms == 6_000


@pytest.mark.parametrize("kw", [
    {"kafka": {}},
    {"kafka": {"linger.ms": 5}},
    {"mode": "sometimes"},
    {"keep_until": "forever"},
    {"default_ttl_s": 0},
    {"max_message_bytes": -1},
    {"max_queue_messages": 0},
    {"send_timeout_s": True},
    {"delay_min_ms": 0},
    {"delay_min_ms": 500, "delay_max_ms": 100},
    {"lease_s": 0.1},
    {"max_message_bytes": 2_000, "max_queue_bytes": 1_000},
    {"resend_after_s": 10},  # not beyond librdkafka's 300 s message timeout
    {"kafka": {"bootstrap.servers": "b", "message.timeout.ms": "soon"}},
    {"instance_id": ""},
    {"instance_id": "p" * 257},  # a consumer would refuse its envelopes (input_limits)
    {"redis": "redis://localhost"},
    {"default_ttl_s": 7_200, "keyspace": KeySpace(max_ttl_ms=3_600_000)},
    {"keyspace": "eoguard"},
    {"input_limits": {"payload_bytes": 10}},
])
def test_invalid_producer_config_is_refused_at_construction(kw) -> None:
    with pytest.raises(ConfigError):
        config(**kw)


@pytest.mark.parametrize("kw", [
    {},
    {"url": "http://localhost:6379"},
    {"url": "redis://x", "client": object()},
    {"url": "redis://x", "socket_timeout_s": 0},
])
def test_invalid_redis_config_is_refused_at_construction(kw) -> None:
    with pytest.raises(ConfigError):
        RedisConfig(**kw)


def test_injected_redis_client_is_used_as_is() -> None:
    client = redis.Redis(port=1)
    cfg = RedisConfig(client=client)
    assert cfg.connect() is client
    assert "client=<injected>" in repr(cfg)
    with pytest.raises(ConfigError):
        RedisConfig(client=redis.Redis(port=1, decode_responses=True))


def test_config_is_frozen() -> None:
    cfg = config()
    with pytest.raises(AttributeError):
        cfg.mode = PersistenceMode.DELAYED  # type: ignore[misc]


@pytest.mark.parametrize("given", ["local", "replicated", Durability.LOCAL, Durability.REPLICATED])
def test_durability_accepts_its_strings_and_its_enum(given) -> None:
    cfg = RedisConfig(url="redis://x:1/0", durability=given)
    assert cfg.durability is Durability(given)
    assert cfg.durability == Durability(given).value  # a str enum: equal to its string
    assert (cfg.replica_wait() is None) == (cfg.durability is Durability.LOCAL)
    assert f"durability='{cfg.durability.value}'" in repr(cfg)


def test_durability_defaults_to_local() -> None:
    assert RedisConfig(url="redis://x:1/0").durability is Durability.LOCAL


@pytest.mark.parametrize("bad", ["Replicated", "sync", "", None, 1])
def test_an_unknown_durability_is_refused_with_the_choices(bad) -> None:
    with pytest.raises(ConfigError, match=r"durability must be 'local' or 'replicated'.*got "):
        RedisConfig(url="redis://x:1/0", durability=bad)


def test_a_registry_client_built_from_a_url_bounds_each_request() -> None:
    """confluent-kafka's client waits for a response for good unless told otherwise."""
    with SchemaRegistryConfig(url="http://127.0.0.1:1/apis/ccompat/v7").connect() as client:
        assert client._rest_client.timeout == REGISTRY_TIMEOUT_S
    own = SchemaRegistryConfig(url="http://127.0.0.1:1", options={"timeout": 30})
    with own.connect() as client:
        assert client._rest_client.timeout == 30


def test_registry_options_given_as_text_become_numbers() -> None:
    """A command line (the Spark job's --schema-registry-option) gives every value as text."""
    given = {"timeout": "10", "max.retries": "1", "retries.wait.ms": "50"}
    with SchemaRegistryConfig(url="http://127.0.0.1:1", options=given).connect() as client:
        assert client._rest_client.timeout == 10.0
        assert client._rest_client.max_retries == 1
        assert client._rest_client.retries_wait_ms == 50


@pytest.mark.parametrize("options", [
    {"timeout": "soon"}, {"timeout": 0}, {"timeout": True}, {"max.retries": "-1"},
    {"retries.max.wait.ms": "1.5"}, {"max.retries": None},
])
def test_a_registry_option_that_is_not_a_number_is_a_config_error(options) -> None:
    with pytest.raises(ConfigError, match="Schema Registry option"):
        SchemaRegistryConfig(url="http://127.0.0.1:1", options=options)
