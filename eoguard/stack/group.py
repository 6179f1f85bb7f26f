"""Several service processes that form one cluster: launched together, waited on, stopped."""

from __future__ import annotations

import abc
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from eoguard.stack.process import ManagedProcess


class ServiceGroup(abc.ABC):
    """A cluster of :class:`ManagedProcess` members with the single service's interface.

    Members are all launched before any is waited on: a KRaft node is not ready before a
    quorum of voters runs. ``start`` is idempotent and ``stop`` stops only the members'
    own processes, found through their pid files.
    """

    name: str = "cluster"

    def __init__(self, workdir: Path, nodes: Sequence[ManagedProcess]) -> None:
        self.workdir = workdir
        self.nodes = list(nodes)

    @abc.abstractmethod
    def is_ready(self) -> bool:
        """True once the cluster as a whole serves requests."""

    @property
    @abc.abstractmethod
    def address(self) -> str:
        """Where clients reach the cluster, as they spell it."""

    @property
    def log_path(self) -> Path:
        """Where to look first when it fails; each member logs to ``node<N>/service.log``."""
        return self.nodes[0].log_path

    def joined(self) -> None:  # noqa: B027 - a hook: most groups need nothing more
        """Called once every member runs: join them into a cluster and wait (if needed)."""

    def start(self) -> bool:
        """Launch every member not running, wait for each; False if the cluster already ran."""
        if self.is_ready():
            return False
        launched: list[ManagedProcess] = []
        try:
            for node in self.nodes:
                if node.launch():
                    launched.append(node)
            for node in launched:
                node.wait_ready()
            self.joined()
        except BaseException:
            for node in launched:  # a half-started cluster is stopped, not left behind
                node.stop()
            raise
        return True

    def pid(self) -> int | None:
        """The first live member's pid (``nodes`` has each)."""
        return next((pid for pid in (node.pid() for node in self.nodes) if pid), None)

    def detach(self) -> None:
        """Leave every member's process to run past this object (see ManagedProcess.detach)."""
        for node in self.nodes:
            node.detach()

    def stop(self) -> None:
        """Stop every member at once: a KRaft node stopped last, alone, waits for a quorum
        that is gone (20 s, then SIGKILL)."""
        with ThreadPoolExecutor(len(self.nodes)) as pool:
            list(pool.map(lambda node: node.stop(), self.nodes))
