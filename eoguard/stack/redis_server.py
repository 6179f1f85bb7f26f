"""A Redis server from Debian's ``redis-server`` package, with AOF on."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from eoguard.stack.debian import ensure_package
from eoguard.stack.process import ManagedProcess
from eoguard.stack.tls import Security, write_private


def ensure_redis_server() -> str:
    """Path of ``redis-server``, installing Debian's package when missing and allowed (root)."""
    return ensure_package("redis-server", "redis-server")


class RedisServer(ManagedProcess):
    """One Redis on loopback with AOF on and ``appendfsync always``.

    ``everysec`` is not enough for the guarantee: while a slow background fsync runs, Redis
    postpones its AOF write() for up to 2 s yet still replies, so a SIGKILL then loses writes it
    acknowledged. ``always`` writes and fsyncs once per event-loop turn before replying, which
    costs less than it sounds because eoguard batches its writes.

    With ``security`` the port speaks TLS only and the default user is off: clients log in
    as one of ``security.users`` (all commands, all keys). ``redis.conf`` then holds the
    passwords and is written with mode 0600.
    """

    name = "redis"

    def __init__(self, workdir: Path, *, port: int = 16379, ready_timeout_s: float = 30.0,
                 cluster_node_timeout_ms: int | None = None,
                 security: Security | None = None) -> None:
        super().__init__(workdir, ready_timeout_s=ready_timeout_s)
        self.port = port
        self.security = security
        # Set: a Redis Cluster node (its bus on port + 10000); RedisClusterNodes joins them.
        self.cluster_node_timeout_ms = cluster_node_timeout_ms

    @property
    def address(self) -> str:
        """The URL clients use (without credentials: those come from elsewhere)."""
        if self.security is not None:
            return f"rediss://127.0.0.1:{self.port}/0"
        return f"redis://127.0.0.1:{self.port}/0"

    def prepare(self) -> None:
        conf = "\n".join([
            "bind 127.0.0.1",
            *self._listener_lines(),
            f"dir {self.workdir}",
            "daemonize no",
            "save ''",
            "appendonly yes",
            "appendfsync always",
            "protected-mode yes",
            *self._cluster_lines(),
            "",
        ])
        write_private(self.workdir / "redis.conf", conf)

    def _listener_lines(self) -> list[str]:
        sec = self.security
        if sec is None:
            return [f"port {self.port}"]
        return ["port 0", f"tls-port {self.port}", f"tls-cert-file {sec.tls.cert}",
                f"tls-key-file {sec.tls.key}", f"tls-ca-cert-file {sec.tls.ca}",
                "tls-auth-clients no", "user default off",
                *(f"user {name} on >{password} ~* &* +@all"
                  for name, password in sec.users.items())]

    def _cluster_lines(self) -> list[str]:
        if self.cluster_node_timeout_ms is None:
            return []
        # No 5 s wait before a full resync: a replica restarted after a failover is in sync
        # (and may take over again) within a second, not six.
        return ["cluster-enabled yes", "cluster-config-file nodes.conf",
                f"cluster-node-timeout {self.cluster_node_timeout_ms}",
                "repl-diskless-sync-delay 0"]

    def command(self) -> list[str]:
        return [ensure_redis_server(), str(self.workdir / "redis.conf")]

    def client(self, timeout_s: float = 0.5) -> redis.Redis:
        """A client of this node alone that fails at once (no retries) when it is down."""
        # No retries: redis-py's default retry policy spends ~3.7 s on one refused connection.
        return redis.Redis(host="127.0.0.1", port=self.port, socket_connect_timeout=timeout_s,
                           socket_timeout=timeout_s, retry=Retry(NoBackoff(), 0),
                           **self._login())

    def _login(self) -> dict[str, Any]:
        """TLS and the first user's credentials, when the server is secured."""
        sec = self.security
        if sec is None:
            return {}
        name, password = next(iter(sec.users.items()))
        return {"ssl": True, "ssl_ca_certs": str(sec.tls.ca), "username": name,
                "password": password}

    def is_ready(self) -> bool:
        client = self.client()
        try:
            return bool(client.ping())
        except redis.RedisError:
            return False
        finally:
            client.close()
