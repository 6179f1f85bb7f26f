"""The local Redis Cluster refuses, by name, a run directory joined on other ports."""

from __future__ import annotations

from pathlib import Path

import pytest

from eoguard.errors import StackError
from eoguard.stack.redis_cluster import RedisClusterNodes

NODES_CONF = """\
aa 127.0.0.1:{p0}@{b0} myself,master - 0 0 1 connected 0-5460
bb 127.0.0.1:{p1}@{b1} master - 0 0 2 connected 5461-10922
cc :0@0 handshake - 0 0 0 connected
vars currentEpoch 6 lastVoteEpoch 0
"""


def _write(workdir: Path, port: int) -> None:
    node = workdir / "node1"
    node.mkdir(parents=True)
    (node / "nodes.conf").write_text(NODES_CONF.format(p0=port, b0=port + 10000, p1=port + 1,
                                                       b1=port + 10001))


def test_a_cluster_joined_on_other_ports_is_refused_with_what_to_do(tmp_path: Path) -> None:
    _write(tmp_path, 37000)
    with pytest.raises(StackError, match=r"joined on ports 37000, 37001, not 22001\.\.22006"):
        RedisClusterNodes(tmp_path, port=22001)._check_ports()


def test_the_same_ports_pass(tmp_path: Path) -> None:
    _write(tmp_path, 22001)
    RedisClusterNodes(tmp_path, port=22001)._check_ports()  # raises on a mismatch
