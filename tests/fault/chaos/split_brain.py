"""``redis-split-brain``: a Redis Cluster master cut from its replica and the other masters,
while the clients still reach it.

The cut is nftables rules in a table of the fault's own (netcut.py's name prefix, so a crashed
run's is removed at the next start):

- every packet to or from the master's cluster bus port (what the other nodes send it);
- the master's own new connections to the other nodes, and its replica's to the master's data
  port (replication), matched by cgroups the two processes are moved into for the cut;
- the connections of theirs already open (read from ``ss``), by their four ports.

The clients' connections to the master's data port go on. The majority stops hearing the
master, marks it failed after the 2 s node timeout and promotes its replica; the master, not
hearing the majority either, stops taking writes at about the same time (cluster state
``fail``), and on healing learns the newer epoch and returns as a replica of its replacement,
dropping what it took meanwhile. Under ``durability="replicated"`` none of that was
acknowledged (its WAIT found no replica); the checker asks for nothing lost.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import redis

from tests.fault.chaos.netcut import CGROUP_PREFIX, TABLE_PREFIX, cgroup2_root, evacuate, nft

BUS_OFFSET = 10_000


def _cgroup_of(pid: int) -> Path:
    """The cgroup v2 folder ``pid`` is in now (to move it back to)."""
    for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        if line.startswith("0::"):
            return cgroup2_root() / line[3:].lstrip("/")
    raise RuntimeError(f"process {pid} is in no cgroup v2")


def _listener_pid(port: int) -> int:
    """The pid of the process listening on loopback ``port``."""
    out = subprocess.run(["ss", "-ltnpH", f"sport = :{port}"], capture_output=True, text=True,
                         check=True).stdout
    found = re.search(r"pid=(\d+),", out)
    assert found, f"nothing listens on port {port}"
    return int(found.group(1))


def _replica_port(master_port: int) -> int:
    client = redis.Redis(port=master_port, socket_timeout=2.0)
    try:
        info = client.info("replication")
    finally:
        client.close()
    assert info.get("connected_slaves"), f"the master on {master_port} has no replica"
    return int(info["slave0"]["port"])


def _node_ports(port: int) -> list[int]:
    """The ports of every node of the cluster, as the node on ``port`` knows them."""
    client = redis.Redis(port=port, socket_timeout=2.0)
    try:
        nodes = client.execute_command("CLUSTER NODES")  # redis-py: {"host:port": {...}}
    finally:
        client.close()
    return sorted(int(address.rsplit(":", 1)[1]) for address in nodes)


def _open_connections(pid: int) -> list[tuple[int, int]]:
    """(local port, peer port) of the loopback TCP connections process ``pid`` holds."""
    out = subprocess.run(["ss", "-tnpH", "state", "established"], capture_output=True, text=True,
                         check=True).stdout
    found = []
    for line in out.splitlines():
        if f"pid={pid}," in line:
            local, peer = re.findall(r"127\.0\.0\.1:(\d+)", line)[:2]
            found.append((int(local), int(peer)))
    return found


class SplitBrain:
    """Cuts the master on ``master_port`` off (``cut``) and heals it (``heal``: also what a
    failed ``cut`` left); its replica and the other nodes are found from it."""

    def __init__(self, master_port: int) -> None:
        self.master = master_port
        self.replica = _replica_port(master_port)
        self.others = [p for p in _node_ports(master_port) if p not in (master_port, self.replica)]
        name = f"{os.getpid()}-sb{master_port}"
        self.table = TABLE_PREFIX + name.replace("-", "_")
        self.folder = cgroup2_root() / (CGROUP_PREFIX + name)
        self._home: dict[str, Path] = {}  # role -> the cgroup its process came from

    def _pids(self) -> dict[str, int]:
        return {"master": _listener_pid(self.master), "replica": _listener_pid(self.replica)}

    def cut(self) -> None:
        pids = self._pids()
        self.folder.mkdir()
        for role, pid in pids.items():
            self._home[role] = _cgroup_of(pid)
            (self.folder / role).mkdir()
            (self.folder / role / "cgroup.procs").write_text(str(pid))
        bus = self.master + BUS_OFFSET
        peers = [*self.others, *(p + BUS_OFFSET for p in self.others), self.replica + BUS_OFFSET]
        rules = [f"tcp dport {bus} drop", f"tcp sport {bus} drop",
                 f"{self._match('master')} tcp dport {_set(peers)} drop",
                 f"{self._match('replica')} tcp dport {self.master} drop"]
        ins = [f"{self._match('master')} tcp sport {_set(peers)} drop",
               f"{self._match('replica')} tcp sport {self.master} drop"]
        for local, peer in _open_connections(pids["master"]):
            if peer in peers:
                rules.append(f"tcp sport {local} tcp dport {peer} drop")
                ins.append(f"tcp sport {peer} tcp dport {local} drop")
        for local, peer in _open_connections(pids["replica"]):
            if peer == self.master:
                rules.append(f"tcp sport {local} tcp dport {peer} drop")
                ins.append(f"tcp sport {peer} tcp dport {local} drop")
        nft(f"add table inet {self.table}\n"
            f"add chain inet {self.table} out {{ type filter hook output priority 0; policy accept; }}\n"
            f"add chain inet {self.table} in {{ type filter hook input priority 0; policy accept; }}\n"
            + "".join(f"add rule inet {self.table} out {r}\n" for r in rules)
            + "".join(f"add rule inet {self.table} in {r}\n" for r in ins))

    def _match(self, role: str) -> str:
        path = self.folder / role
        return (f'socket cgroupv2 level {len(path.relative_to(cgroup2_root()).parts)} '
                f'"{path.relative_to(Path("/sys/fs/cgroup"))}"')

    def heal(self) -> None:
        """Delete the rules, move both processes (and what they forked) back to their cgroups,
        remove the folder."""
        listed = subprocess.run(["nft", "list", "tables", "inet"], capture_output=True, text=True,
                                check=True).stdout.split()
        if self.table in listed:
            nft(f"delete table inet {self.table}\n")
        for role in ("master", "replica"):  # with what they forked meanwhile (evacuate)
            if (self.folder / role).exists():
                evacuate(self.folder / role, self._home.get(role, cgroup2_root()))
        self._home.clear()
        if self.folder.exists():
            self.folder.rmdir()


def _set(ports: list[int]) -> str:
    return "{ " + ", ".join(map(str, sorted(set(ports)))) + " }"
