"""The chaos suite's network cuts (tests/fault/chaos/netcut.py): a process in a worker's
cgroup loses its packets to a port while cut, gets them through once healed, and nothing of
a run (nftables table, cgroups) outlives it, nor what a crashed run left."""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.fault.chaos.netcut import (
    CGROUP_PREFIX,
    TABLE_PREFIX,
    NetCuts,
    cgroup2_root,
    clean_leftovers,
    evacuate,
)

pytestmark = [pytest.mark.fault]


@pytest.fixture
def echo_port() -> Iterator[int]:
    """A loopback server echoing every byte, on a port of its own."""
    server = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            threading.Thread(target=lambda c=conn: [c.sendall(b) for b in iter(lambda: c.recv(64), b"")],
                             daemon=True).start()
    threading.Thread(target=serve, daemon=True).start()
    yield server.getsockname()[1]
    server.close()


def _tables() -> str:
    return subprocess.run(["nft", "list", "tables"], capture_output=True, text=True, check=True).stdout


def _wait_for(proc: subprocess.Popen[str], line: str, lines: list[str]) -> None:
    deadline = time.monotonic() + 30.0
    while time.monotonic() < deadline:
        got = proc.stdout.readline().strip() if proc.stdout else ""
        lines.append(got)
        if got == line:
            return
    raise AssertionError(f"no {line!r} within 30 s: {lines[-10:]}")


def test_a_cut_drops_the_workers_packets_until_it_heals(echo_port: int) -> None:
    cuts = NetCuts(uuid.uuid4().hex[:8])
    proc = subprocess.Popen([sys.executable, *cuts.argv("w0", "tests.fault.workers.echo_client"),
                             str(echo_port)], stdout=subprocess.PIPE, text=True)
    lines: list[str] = []
    try:
        _wait_for(proc, "echo", lines)
        cut = cuts.cut("w0", [echo_port])
        _wait_for(proc, "timeout", lines)
        cuts.heal(cut)
        _wait_for(proc, "echo", lines)
        print(f"cut and healed: {lines}")
    finally:
        proc.kill()
        proc.wait()
        if proc.stdout:
            proc.stdout.close()
        cuts.close()
    assert cuts.table not in _tables()
    assert not cuts.folder.exists()


def test_what_a_crashed_run_left_is_removed_at_the_next_start() -> None:
    dead = subprocess.Popen(["true"])
    dead.wait()
    name = f"{dead.pid}-{uuid.uuid4().hex[:8]}"
    table = TABLE_PREFIX + name.replace("-", "_")
    folder: Path = cgroup2_root() / (CGROUP_PREFIX + name)
    (folder / "p1").mkdir(parents=True)
    subprocess.run(["nft", "add", "table", "inet", table], check=True)
    mine = NetCuts(uuid.uuid4().hex[:8])  # a live run's: kept
    try:
        gone = clean_leftovers()
        assert table in gone
        assert folder.name in gone
        assert table not in _tables()
        assert not folder.exists()
        assert mine.table in _tables()
        assert mine.folder.exists()
    finally:
        mine.close()


def test_a_cgroup_is_emptied_of_what_its_process_forked_and_removed() -> None:
    """A process moved into a cgroup that forks there (as Redis forks for a resync while cut
    off) leaves its children in it: evacuating moves them too, so the cgroup can go (the
    split-brain heal once failed with EBUSY on a Redis replica's fork)."""
    folder = cgroup2_root() / f"{CGROUP_PREFIX}{uuid.uuid4().hex[:8]}-evacuate"
    folder.mkdir()
    shell = subprocess.Popen(["sh", "-c", "read go; sleep 60 & sleep 60 & wait"],
                             stdin=subprocess.PIPE, text=True)
    try:
        (folder / "cgroup.procs").write_text(str(shell.pid))
        assert shell.stdin is not None
        shell.stdin.write("go\n")
        shell.stdin.flush()
        while len((folder / "cgroup.procs").read_text().split()) < 3:  # sh and its two sleeps
            time.sleep(0.01)
        children = set((folder / "cgroup.procs").read_text().split()) - {str(shell.pid)}
        evacuate(folder, cgroup2_root())
        assert not folder.exists()
        assert children <= set((cgroup2_root() / "cgroup.procs").read_text().split())
    finally:
        subprocess.run(["pkill", "-P", str(shell.pid)], check=False)
        shell.kill()
        shell.wait()
        if shell.stdin is not None:
            shell.stdin.close()
        if folder.exists():
            evacuate(folder, cgroup2_root())
