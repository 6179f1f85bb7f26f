"""The port a test gives a cluster-mode redis-server: it and its bus outside the ephemeral range."""

from __future__ import annotations

import socket

import pytest

from tests import conftest
from tests.conftest import CLUSTER_BUS_OFFSET, ephemeral_range, free_cluster_port


def test_a_cluster_port_and_its_bus_are_free_and_below_the_ephemeral_range() -> None:
    first, last = ephemeral_range()
    assert 1024 <= first <= last <= 65535
    for _ in range(20):
        port = free_cluster_port()
        bus = port + CLUSTER_BUS_OFFSET
        assert 1024 <= port < bus < first
        for taken in (port, bus):
            with socket.socket() as sock:
                sock.bind(("127.0.0.1", taken))  # free: binds


def test_the_range_is_read_from_the_kernel(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = tmp_path / "ip_local_port_range"
    fake.write_text("25000\t60999\n")
    monkeypatch.setattr(conftest, "EPHEMERAL_RANGE_FILE", fake)
    assert ephemeral_range() == (25_000, 60_999)
    for _ in range(20):
        assert free_cluster_port() + CLUSTER_BUS_OFFSET < 25_000
    fake.write_text("10500\t60999\n")  # no room below it for a port and its bus
    with pytest.raises(RuntimeError, match="starts at 10500"):
        free_cluster_port()
