"""A fourth shard of the local Redis Cluster: a master and its replica that join, take their
share of the slots, and leave again (resharding under load: tests/fault/chaos).

``join`` starts both nodes on the two ports after the cluster's six (``port + 6``,
``port + 7``; their data in ``node7`` and ``node8`` of the cluster's folder, wiped first: a
node that left is forgotten by the others and cannot come back under its old identity) and
adds them with ``redis-cli --cluster add-node`` (the replica with ``--cluster-slave``); it
returns once every node knows both and the replica is in sync, so the master can take slots
without leaving a master of a ``durability="replicated"`` client unreplicated.
``rebalance_in`` runs ``redis-cli --cluster rebalance --cluster-use-empty-masters``; ``leave``
rebalances the master's slots away (weight 0), then stops the replica and the master and has
every other node CLUSTER FORGET them.
"""

from __future__ import annotations

import shutil
import subprocess
import time
from collections.abc import Callable
from typing import Any

import redis

from eoguard.errors import StackError
from eoguard.stack.redis_cluster import RedisClusterNodes
from eoguard.stack.redis_server import RedisServer


class AddedShard:
    """A master and its replica added to a running :class:`RedisClusterNodes`."""

    def __init__(self, cluster: RedisClusterNodes, *, timeout_s: float = 120.0) -> None:
        self.cluster = cluster
        self.master, self.replica = cluster.added_nodes()
        self.timeout_s = timeout_s
        self.log_path = cluster.workdir / "reshard.log"

    @property
    def seed(self) -> str:
        """``host:port`` of a node of the original six, for ``redis-cli --cluster``."""
        return f"127.0.0.1:{self.cluster.port}"

    # Joining -----------------------------------------------------------------------------------
    def join(self) -> str:
        """Start the two nodes, add them to the cluster (no slots yet); the master's node id."""
        self.remove_leftovers()
        for node in (self.master, self.replica):
            shutil.rmtree(node.workdir, ignore_errors=True)
            node.start()
            node.detach()  # the cluster's stop() stops them too (added_nodes)
        master_id = _my_id(self.master)
        self._add_node(master_id, f"127.0.0.1:{self.master.port}", self.seed)
        self._wait(lambda: self._everyone_knows(master_id, [self.master]),
                   "every node to know the new master")
        replica_id = _my_id(self.replica)
        self._add_node(replica_id, f"127.0.0.1:{self.replica.port}", self.seed,
                       "--cluster-slave", "--cluster-master-id", master_id)
        self._wait(lambda: self._everyone_knows(replica_id, [self.master, self.replica],
                                                replica_of=master_id)
                   and self._everyone_knows(master_id, [self.replica]) and self._replica_in_sync(),
                   "the new replica to be known everywhere as the new master's, and in sync")
        return master_id

    def rebalance_in(self, weight: float = 1.0) -> None:
        """Give the new master its share of the slots (``--cluster-use-empty-masters``):
        ``weight`` against 1 for each other master (1: an equal share)."""
        master_id = self.node_id()
        assert master_id is not None, "join() first"
        self.wait_agreed()
        try:
            self._cli("rebalance", self.seed, "--cluster-use-empty-masters", "--cluster-weight",
                      f"{master_id}={weight:g}", "--cluster-yes")
        except StackError:  # cut short (a MIGRATE timed out): the slot it left open closed
            self.fix()
        self.wait_agreed()

    def fix(self) -> None:
        """``redis-cli --cluster fix``: a slot a cut-short move left open is closed."""
        self._cli("fix", self.seed, "--cluster-yes")

    # Leaving -----------------------------------------------------------------------------------
    def leave(self) -> None:
        """Move every slot of the new master to the others, then remove both nodes."""
        master_id = self.node_id()
        if master_id is None:
            return
        for attempt in range(3):  # a rebalance cut short (a MIGRATE timed out) goes on anew
            if not self.slots_of(master_id):
                break
            self.wait_agreed()
            try:
                self._cli("rebalance", self.seed, "--cluster-weight", f"{master_id}=0",
                          "--cluster-yes")
            except StackError:
                if attempt == 2:
                    raise
                self.fix()
            self.wait_agreed()
        if self.slots_of(master_id):
            raise StackError(f"the added master {master_id} kept slots after the rebalance; "
                             f"see {self.log_path}")
        replica_id = _id_or_none(self.replica)
        for node_id, node in ((replica_id, self.replica), (master_id, self.master)):
            if node_id is not None:
                self._del_node(node_id, node)
        self._wait(lambda: not (self._known_anywhere(master_id)
                                or (replica_id is not None and self._known_anywhere(replica_id))),
                   "every node to forget the added shard")

    def _add_node(self, node_id: str, *args: str) -> None:
        """``redis-cli --cluster add-node``, again unless the cluster knows the node by then
        (on two busy cores redis-cli at times cannot load a node's info in time)."""
        for attempt in range(3):
            try:
                self._cli("add-node", *args)
                return
            except StackError:
                if self._known_anywhere(node_id):
                    return
                if attempt == 2:
                    raise
                time.sleep(2.0)

    def _del_node(self, node_id: str, node: RedisServer) -> None:
        """Remove ``node`` from the cluster: stop it, then CLUSTER FORGET it on every node
        left, within the 60 s a FORGET bans it from gossip (what ``redis-cli --cluster
        del-node`` does, without its need to read every node first: on two busy cores it
        skipped a node it could not read in time and said "No such node ID" for good)."""
        node.kill()
        for other in [*self.cluster.servers, *(n for n in (self.master, self.replica)
                                               if n is not node and n.pid() is not None)]:
            client = other.client(timeout_s=5.0)
            try:
                client.execute_command("CLUSTER FORGET", node_id)
            except redis.ResponseError as exc:
                if "Unknown node" not in str(exc):  # forgotten already
                    raise StackError(f"CLUSTER FORGET {node_id} on {other.address}: {exc}") \
                        from exc
            except redis.RedisError:
                pass  # down (a fault of the run): it forgets a node that no longer answers
            finally:
                client.close()

    def remove_leftovers(self) -> None:
        """An added shard an earlier run left behind (it crashed before ``leave``): leave now."""
        if self.master.pid() is not None and _id_or_none(self.master) is not None \
                and self._known_anywhere(_my_id(self.master)):
            self.leave()
        for node in (self.master, self.replica):
            node.kill()

    def stop(self) -> None:
        for node in (self.master, self.replica):
            node.stop()

    # Reading the cluster -----------------------------------------------------------------------
    def node_id(self) -> str | None:
        """The added master's node id, None when it does not run."""
        return _id_or_none(self.master) if self.master.pid() is not None else None

    def slots_of(self, node_id: str) -> int:
        """How many slots the original nodes' view gives ``node_id``."""
        nodes = self._nodes(self.cluster.servers[0])
        entry = next((n for n in nodes.values() if n["node_id"] == node_id), None)
        if entry is None:
            return 0
        return sum(int(r[-1]) - int(r[0]) + 1 for r in entry["slots"])

    def wait_agreed(self) -> None:
        """Until ``redis-cli --cluster check`` passes: every node agrees on the slot map and
        no slot is open (a rebalance refuses to start otherwise)."""
        def agreed() -> bool:
            done = subprocess.run([_redis_cli(), "--cluster", "check", self.seed],
                                  capture_output=True, text=True, check=False, timeout=60,
                                  stdin=subprocess.DEVNULL)
            return done.returncode == 0 and "[ERR]" not in done.stdout \
                and "[WARNING]" not in done.stdout
        self._wait(agreed, "every node to agree on the slot map")

    def _everyone_knows(self, node_id: str, added: list[RedisServer], *,
                        replica_of: str | None = None) -> bool:
        """Whether the six and the ``added`` nodes know ``node_id`` (past the handshake; with
        ``replica_of``, as a replica of that master: a view that still has it a master without
        slots would make it a target of CLUSTER SETSLOT, which a replica refuses)."""
        nodes = [*self.cluster.servers, *added]

        def knows(entry: dict[str, Any]) -> bool:
            if entry["node_id"] != node_id or "handshake" in entry["flags"]:
                return False
            return replica_of is None or ("slave" in entry["flags"]
                                          and entry["master_id"] == replica_of)
        try:
            return all(any(knows(n) for n in self._nodes(node).values()) for node in nodes)
        except redis.RedisError:
            return False

    def _known_anywhere(self, node_id: str) -> bool:
        try:
            return any(n["node_id"] == node_id for node in self.cluster.servers
                       for n in self._nodes(node).values())
        except redis.RedisError:
            return True

    def _replica_in_sync(self) -> bool:
        client = self.replica.client(timeout_s=1.0)
        try:
            info = client.info("replication")
        except redis.RedisError:
            return False
        finally:
            client.close()
        return info.get("role") == "slave" and info.get("master_link_status") == "up" \
            and int(info.get("master_port", 0)) == self.master.port

    @staticmethod
    def _nodes(node: RedisServer) -> dict[str, dict[str, Any]]:
        client = node.client(timeout_s=2.0)
        try:
            return dict(client.execute_command("CLUSTER NODES"))  # redis-py parses it
        finally:
            client.close()

    def _wait(self, pred: Callable[[], bool], what: str) -> None:
        deadline = time.monotonic() + self.timeout_s
        while not pred():
            if time.monotonic() > deadline:
                raise StackError(f"timed out after {self.timeout_s:.0f} s waiting for {what}; "
                                 f"see {self.log_path}")
            time.sleep(0.2)

    def _cli(self, *args: str) -> None:
        cmd = [_redis_cli(), "--cluster", *args]
        with self.log_path.open("ab") as log:
            log.write(f"$ {' '.join(cmd)}\n".encode())
            log.flush()
            done = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, check=False,
                                  timeout=self.timeout_s * 5, stdin=subprocess.DEVNULL)
        if done.returncode != 0:
            raise StackError(f"redis-cli --cluster {args[0]} failed (exit {done.returncode}); "
                             f"its log is {self.log_path}")


def _redis_cli() -> str:
    cli = shutil.which("redis-cli")
    if cli is None:
        raise StackError("redis-cli is missing (Debian's redis-server package provides it)")
    return cli


def _my_id(node: RedisServer) -> str:
    client = node.client(timeout_s=2.0)
    try:
        reply = client.execute_command("CLUSTER MYID")
    finally:
        client.close()
    return reply.decode() if isinstance(reply, bytes) else str(reply)


def _id_or_none(node: RedisServer) -> str | None:
    try:
        return _my_id(node)
    except redis.RedisError:
        return None

