"""The layout (shards, version, max_ttl_ms) is recorded per prefix; a process configured
otherwise, a prefix of layout version 1 with dedup keys left, and a server that may evict
keys are refused at start."""

from __future__ import annotations

import json
import logging
import subprocess
import threading
import time

import pytest
import redis
from click.testing import CliRunner

from eoguard.cli import cli
from eoguard.config import ConsumerConfig, RedisConfig
from eoguard.consumer.guarded import GuardedConsumer
from eoguard.errors import ConfigError
from eoguard.stack.redis_server import ensure_redis_server
from eoguard.store.client import connect
from eoguard.store.keys import DEFAULT_MAX_TTL_MS, LAYOUT_VERSION, KeySpace
from eoguard.store.layout import Layout, check_layout, recorded_layout
from tests.conftest import free_cluster_port
from tests.redis_kit import acl_user

pytestmark = pytest.mark.integration

READY_S = 10  # a redis-server answers within a second; the rest is slack for a loaded host


@pytest.mark.cluster
def test_first_use_records_and_a_mismatch_is_refused(redis_client, key_prefix: str) -> None:
    assert recorded_layout(redis_client, key_prefix) is None
    check_layout(redis_client, KeySpace(prefix=key_prefix, shards=8))
    check_layout(redis_client, KeySpace(prefix=key_prefix, shards=8))  # same layout: fine
    assert recorded_layout(redis_client, key_prefix) == Layout(
        shards=8, version=LAYOUT_VERSION, max_ttl_ms=DEFAULT_MAX_TTL_MS)
    with pytest.raises(ConfigError, match="laid out in 8 shards") as refused:
        check_layout(redis_client, KeySpace(prefix=key_prefix, shards=16))
    assert "\n" not in str(refused.value)


def test_another_max_ttl_is_refused(redis_client, key_prefix: str) -> None:
    check_layout(redis_client, KeySpace(prefix=key_prefix, shards=4, max_ttl_ms=3_600_000))
    with pytest.raises(ConfigError, match=r"max_ttl_ms=3600000.*KeySpace\(max_ttl_ms=3600000\)"):
        check_layout(redis_client, KeySpace(prefix=key_prefix, shards=4))
    assert recorded_layout(redis_client, key_prefix) == Layout(4, LAYOUT_VERSION, 3_600_000)


@pytest.mark.cluster
def test_concurrent_first_starts_record_one_layout(redis_client, redis_url: str,
                                                   key_prefix: str) -> None:
    # Each start records its whole layout or none of it: the record is one start's, and
    # exactly the starts configured like it pass.
    configs = [KeySpace(prefix=key_prefix, shards=2 + i % 3, max_ttl_ms=60_000 * (1 + i % 2))
               for i in range(12)]
    barrier = threading.Barrier(len(configs))
    passed: list[KeySpace] = []
    refused: list[str] = []

    def start(keys: KeySpace) -> None:
        client = connect(redis_url)  # a RedisCluster on the cluster topology
        try:
            barrier.wait()
            check_layout(client, keys)
            passed.append(keys)
        except ConfigError as exc:
            refused.append(str(exc))
        finally:
            client.close()

    threads = [threading.Thread(target=start, args=(keys,)) for keys in configs]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    layout = recorded_layout(redis_client, key_prefix)
    assert layout is not None
    winner = KeySpace(prefix=key_prefix, shards=layout.shards or 0, max_ttl_ms=layout.max_ttl_ms or 0)
    assert passed
    assert all(keys == winner for keys in passed)
    assert len(passed) == configs.count(winner)
    assert len(refused) == len(configs) - len(passed)
    print(f"{len(passed)} starts passed, {len(refused)} refused; recorded {layout}")


def test_a_version_1_prefix_is_refused_while_its_dedup_keys_remain(redis_client,
                                                                   key_prefix: str) -> None:
    keys = KeySpace(prefix=key_prefix, shards=8)
    redis_client.hset(keys.layout(), "shards", 8)  # what layout version 1 recorded
    legacy = [f"{key_prefix}:dd:{{billing/{i}}}:id-{i}" for i in range(3)]
    for name in legacy:
        redis_client.set(name, "d|1|x", px=60_000)
    assert recorded_layout(redis_client, key_prefix) == Layout(8, 1, None)

    with pytest.raises(ConfigError) as refused:
        check_layout(redis_client, keys)
    assert str(refused.value) == (
        f"key prefix {key_prefix!r} holds 3 dedup keys of layout version 1: let them expire "
        "(eoguard status shows how many remain) or use another prefix")
    assert recorded_layout(redis_client, key_prefix) == Layout(8, 1, None)  # left as it was

    redis_client.delete(*legacy)  # as if they had expired
    with pytest.raises(ConfigError, match="laid out in 8 shards"):
        check_layout(redis_client, KeySpace(prefix=key_prefix, shards=16))
    assert recorded_layout(redis_client, key_prefix) == Layout(8, 1, None)  # refused: not upgraded

    check_layout(redis_client, keys)
    assert recorded_layout(redis_client, key_prefix) == Layout(8, LAYOUT_VERSION, DEFAULT_MAX_TTL_MS)
    check_layout(redis_client, keys)  # a later start finds version 2
    with pytest.raises(ConfigError, match="max_ttl_ms"):
        check_layout(redis_client, KeySpace(prefix=key_prefix, shards=8, max_ttl_ms=1000))


def test_a_newer_layout_version_is_refused(redis_client, key_prefix: str) -> None:
    keys = KeySpace(prefix=key_prefix)
    redis_client.hset(keys.layout(), mapping={"shards": keys.shards, "version": LAYOUT_VERSION + 1,
                                              "max_ttl_ms": keys.max_ttl_ms})
    with pytest.raises(ConfigError, match=f"layout version {LAYOUT_VERSION + 1}.*upgrade eoguard"):
        check_layout(redis_client, keys)


def test_the_cli_adopts_the_recorded_layout_and_refuses_another(redis_client, redis_url: str,
                                                                 key_prefix: str) -> None:
    check_layout(redis_client, KeySpace(prefix=key_prefix, shards=4))
    runner = CliRunner()
    ok = runner.invoke(cli, ["--redis-url", redis_url, "--prefix", key_prefix, "--json", "status"])
    assert ok.exit_code == 0, ok.output
    assert json.loads(ok.stdout)["layout"] == {"version": LAYOUT_VERSION, "shards": 4,
                                               "max_ttl_ms": DEFAULT_MAX_TTL_MS}
    bad = runner.invoke(cli, ["--redis-url", redis_url, "--prefix", key_prefix, "--shards", "16",
                               "status"])
    assert bad.exit_code == 2
    assert "laid out in 4 shards" in bad.output
    assert "Traceback" not in bad.output


def test_a_consumer_with_another_shard_count_is_refused(redis_client, redis_url: str,
                                                         key_prefix: str) -> None:
    check_layout(redis_client, KeySpace(prefix=key_prefix, shards=8))
    config = ConsumerConfig(kafka={"bootstrap.servers": "127.0.0.1:1", "group.id": "g"},
                            redis=RedisConfig(url=redis_url), scope="s", topics=("t",),
                            keyspace=KeySpace(prefix=key_prefix, shards=16))
    with pytest.raises(ConfigError, match="laid out in 8 shards"):
        GuardedConsumer(config, handler=lambda ctx: None)


def test_a_server_that_may_evict_is_refused(private_redis, key_prefix: str,
                                            caplog: pytest.LogCaptureFixture) -> None:
    # A Redis of this test alone: tests running next to it must not see the policy change.
    redis_client = redis.Redis.from_url(private_redis.address)
    keys = KeySpace(prefix=key_prefix)
    with acl_user(redis_client, key_prefix, "-config") as no_config, \
            acl_user(redis_client, key_prefix, "-config", "-info") as blind:
        no_config.ping()
        blind.ping()
        caplog.set_level(logging.WARNING, logger="eoguard.store.layout")
        try:
            redis_client.config_set("maxmemory-policy", "allkeys-lru")
            with pytest.raises(ConfigError) as by_config:
                check_layout(redis_client, keys)
            with pytest.raises(ConfigError) as by_info:  # CONFIG refused: INFO memory tells
                check_layout(no_config, keys)
            check_layout(blind, keys)  # neither readable: a warning, and it goes on
        finally:
            redis_client.config_set("maxmemory-policy", "noeviction")
    for refused in (by_config, by_info):
        text = str(refused.value)
        assert "maxmemory-policy allkeys-lru" in text
        assert "CONFIG SET maxmemory-policy noeviction" in text
        assert "\n" not in text
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert "cannot read maxmemory-policy" in warnings[0]
    assert recorded_layout(redis_client, key_prefix) is not None  # only the blind start recorded
    check_layout(redis_client, keys)  # noeviction again: fine


def test_a_single_node_client_of_a_cluster_mode_server_is_refused(tmp_path) -> None:
    # One script call per batch spans many hash slots: a cluster would answer CROSSSLOT to
    # every batch (a rewind forever). Refused at start instead, with what to do.
    port = free_cluster_port()  # its bus (port + 10000) free and outside the ephemeral range
    output = tmp_path / "redis-server.out"  # its log (stdout) and stderr: why it did not start
    with output.open("wb") as out:
        server = subprocess.Popen(
            [ensure_redis_server(), "--port", str(port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--cluster-enabled", "yes", "--dir", str(tmp_path),
             "--cluster-config-file", str(tmp_path / "nodes.conf")],
            stdout=out, stderr=subprocess.STDOUT)
    client = redis.Redis(host="127.0.0.1", port=port)
    try:
        deadline = time.monotonic() + READY_S
        while True:
            try:
                client.ping()
                break
            except redis.ConnectionError:
                exited = server.poll()  # a server that exited fails at once, not at the deadline
                if exited is not None or time.monotonic() >= deadline:
                    state = (f"not answering after {READY_S} s" if exited is None
                             else f"exited with status {exited}")
                    pytest.fail(f"the cluster-mode redis-server on port {port} (bus "
                                f"{port + 10000}) did not start, {state}; its output:\n"
                                f"{output.read_text(errors='replace')}", pytrace=False)
                time.sleep(0.05)
        with pytest.raises(ConfigError, match="cluster mode"):
            check_layout(client, KeySpace(prefix="p"))
    finally:
        client.close()
        server.kill()
        server.wait()
