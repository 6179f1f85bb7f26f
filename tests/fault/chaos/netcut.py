"""Network partitions of one worker process: its packets to and from a service dropped.

Every worker of a chaos run starts in a cgroup (v2) of its own,
``eoguard-chaos-<pid>-<run>/<worker>``, so each socket it opens carries that cgroup. A cut is
a pair of nftables rules in the run's table (``inet eoguard_chaos_<pid>_<run>``) that drop
what the worker sends to a set of ports (Redis's, or Kafka's) and what comes back from them:
all of it (a partition), or a share chosen at random packet by packet (a slow, lossy link:
TCP retransmits, with backoff). The services and the other workers talk on over loopback as
before; nothing leaves the machine. A cut heals when its rules are deleted; the table and the
cgroups go when the run closes, and :func:`clean_leftovers` removes those of a process that
died without closing (the ``<pid>`` in their names is dead).

The services need nothing special: they keep listening on loopback, and the cut is between
one process and one port set, the way a real partition cuts one host from another.
"""

from __future__ import annotations

import contextlib
import errno
import os
import subprocess
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from eoguard.stack.debian import ensure_package

CGROUP_PREFIX = "eoguard-chaos-"
TABLE_PREFIX = "eoguard_chaos_"
_NFT_BASE = Path("/sys/fs/cgroup")  # nft resolves a cgroupv2 path below this folder


def cgroup2_root() -> Path:
    """Where the cgroup v2 hierarchy is mounted (``/sys/fs/cgroup`` or its ``unified``)."""
    with open("/proc/self/mounts") as mounts:
        for line in mounts:
            fields = line.split()
            if fields[2] == "cgroup2" and Path(fields[1]).is_relative_to(_NFT_BASE):
                return Path(fields[1])
    raise RuntimeError("no cgroup2 hierarchy mounted under /sys/fs/cgroup: the network faults "
                       "match a worker's sockets by their cgroup")


def nft(script: str) -> None:
    """Run an nftables script; RuntimeError with nft's message when it fails."""
    done = subprocess.run([ensure_package("nftables", "nft"), "-f", "-"], input=script,
                          capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"nft failed: {done.stderr.strip()}\n{script}")


@dataclass(frozen=True)
class Cut:
    """One cut in force: its worker, ports, the share of packets dropped, its chains."""

    worker: str
    ports: tuple[int, ...]
    share: float
    chain: str

    def __str__(self) -> str:
        what = "cut" if self.share >= 1.0 else f"{self.share:.0%} of packets dropped"
        return f"{self.worker} {what} on ports {','.join(map(str, self.ports))}"


class NetCuts:
    """The cgroups of one run's workers and the cuts between them and the services."""

    def __init__(self, run_id: str) -> None:
        self.name = f"{os.getpid()}-{run_id}"
        self.table = TABLE_PREFIX + self.name.replace("-", "_")
        self.folder = cgroup2_root() / (CGROUP_PREFIX + self.name)
        self.folder.mkdir()
        nft(f"add table inet {self.table}\n")
        self._serial = 0

    def argv(self, worker: str, module: str) -> list[str]:
        """The arguments of ``python`` that run ``module`` in ``worker``'s cgroup (in_cgroup.py)."""
        self._cgroup(worker).mkdir(exist_ok=True)
        return ["-m", "tests.fault.chaos.in_cgroup", str(self._cgroup(worker) / "cgroup.procs"),
                module]

    def cut(self, worker: str, ports: Iterable[int], share: float = 1.0) -> Cut:
        """Drop ``share`` (1.0: all) of the packets between ``worker`` and ``ports``."""
        self._serial += 1
        cut = Cut(worker, tuple(sorted(set(ports))), share, f"cut{self._serial}")
        path = self._cgroup(worker).relative_to(_NFT_BASE)
        level = len(self._cgroup(worker).relative_to(cgroup2_root()).parts)
        ports_set = "{ " + ", ".join(map(str, cut.ports)) + " }"
        sample = "" if share >= 1.0 else f"numgen random mod 1000 < {round(share * 1000)} "
        match = f'socket cgroupv2 level {level} "{path}"'
        nft(f"add chain inet {self.table} {cut.chain}_out "
             "{ type filter hook output priority 0; policy accept; }\n"
             f"add rule inet {self.table} {cut.chain}_out {match} tcp dport {ports_set} "
             f"{sample}drop\n"
             f"add chain inet {self.table} {cut.chain}_in "
             "{ type filter hook input priority 0; policy accept; }\n"
             f"add rule inet {self.table} {cut.chain}_in {match} tcp sport {ports_set} "
             f"{sample}drop\n")
        return cut

    def heal(self, cut: Cut) -> None:
        """Delete the cut's rules: the worker's packets flow again."""
        nft("".join(f"flush chain inet {self.table} {cut.chain}_{way}\n"
                     f"delete chain inet {self.table} {cut.chain}_{way}\n" for way in ("out", "in")))

    def close(self) -> None:
        """Delete the run's table and cgroups (a worker still alive moves to the root)."""
        nft(f"delete table inet {self.table}\n")
        _remove_cgroups(self.folder)

    def _cgroup(self, worker: str) -> Path:
        return self.folder / worker


def evacuate(cgroup: Path, home: Path) -> None:
    """Move every process in ``cgroup`` to ``home`` and remove ``cgroup``.

    Every process, not only the one moved in: a child forked meanwhile is born in its parent's
    cgroup (Redis forks for a resync or an AOF rewrite), and a cgroup with a process left in
    it cannot be removed (EBUSY). A child may also be forked, or be exiting, while this runs,
    so it moves what is listed and tries again, a bounded number of times.
    """
    for _ in range(100):
        for pid in (cgroup / "cgroup.procs").read_text().split():
            with contextlib.suppress(ProcessLookupError, OSError):
                (home / "cgroup.procs").write_text(pid)
        try:
            cgroup.rmdir()
            return
        except OSError as exc:
            if exc.errno != errno.EBUSY:
                raise
        time.sleep(0.05)
    cgroup.rmdir()  # still busy: raises, naming the cgroup


def _remove_cgroups(folder: Path) -> None:
    root = cgroup2_root()
    for child in sorted(folder.iterdir(), reverse=True) if folder.exists() else []:
        if child.is_dir():
            evacuate(child, root)
    if folder.exists():
        folder.rmdir()


def clean_leftovers() -> list[str]:
    """Remove the tables and cgroups of runs whose test process is gone (it crashed before
    closing them); the names of what went."""
    gone: list[str] = []
    listed = subprocess.run([ensure_package("nftables", "nft"), "list", "tables", "inet"],
                            capture_output=True, text=True, check=True).stdout.split()
    for table in (t for t in listed if t.startswith(TABLE_PREFIX)):
        if not _alive(table[len(TABLE_PREFIX):].split("_")[0]):
            nft(f"delete table inet {table}\n")
            gone.append(table)
    for folder in cgroup2_root().glob(CGROUP_PREFIX + "*"):
        if not _alive(folder.name[len(CGROUP_PREFIX):].split("-")[0]):
            _remove_cgroups(folder)
            gone.append(folder.name)
    return gone


def _alive(pid: str) -> bool:
    try:
        os.kill(int(pid), 0)
    except (ValueError, ProcessLookupError):
        return False
    except PermissionError:
        return True
    return True
