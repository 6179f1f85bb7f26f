"""The shard count is recorded per prefix; a process configured otherwise is refused."""

from __future__ import annotations

import subprocess
import time

import pytest
import redis
from click.testing import CliRunner

from eoguard.cli import cli
from eoguard.config import ConsumerConfig, RedisConfig
from eoguard.consumer.guarded import GuardedConsumer
from eoguard.errors import ConfigError
from eoguard.stack.redis_server import ensure_redis_server
from eoguard.store.keys import KeySpace
from eoguard.store.layout import check_layout, recorded_shards
from tests.conftest import free_port

pytestmark = pytest.mark.integration


def test_first_use_records_and_a_mismatch_is_refused(redis_client, key_prefix: str) -> None:
    assert recorded_shards(redis_client, key_prefix) is None
    check_layout(redis_client, KeySpace(prefix=key_prefix, shards=8))
    check_layout(redis_client, KeySpace(prefix=key_prefix, shards=8))  # same layout: fine
    assert recorded_shards(redis_client, key_prefix) == 8
    with pytest.raises(ConfigError, match="laid out in 8 shards"):
        check_layout(redis_client, KeySpace(prefix=key_prefix, shards=16))


def test_the_cli_adopts_the_recorded_layout_and_refuses_another(redis_client, redis_url: str,
                                                                 key_prefix: str) -> None:
    check_layout(redis_client, KeySpace(prefix=key_prefix, shards=4))
    runner = CliRunner()
    ok = runner.invoke(cli, ["--redis-url", redis_url, "--prefix", key_prefix, "--json", "status"])
    assert ok.exit_code == 0, ok.output
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


def test_a_single_node_client_of_a_cluster_mode_server_is_refused(tmp_path) -> None:
    # One script call per batch spans many hash slots: a cluster would answer CROSSSLOT to
    # every batch (a rewind forever). Refused at start instead, with what to do.
    port = free_port()
    server = subprocess.Popen(
        [ensure_redis_server(), "--port", str(port), "--bind", "127.0.0.1", "--save", "",
         "--appendonly", "no", "--cluster-enabled", "yes", "--dir", str(tmp_path),
         "--cluster-config-file", str(tmp_path / "nodes.conf")],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    client = redis.Redis(host="127.0.0.1", port=port)
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                client.ping()
                break
            except redis.ConnectionError:
                assert time.monotonic() < deadline, "the cluster-mode redis-server did not start"
                time.sleep(0.05)
        with pytest.raises(ConfigError, match="cluster mode"):
            check_layout(client, KeySpace(prefix="p"))
    finally:
        client.close()
        server.kill()
        server.wait()
