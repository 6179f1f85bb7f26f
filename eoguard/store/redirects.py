"""Redis Cluster redirections of script calls: the one place eoguard answers ASK, MOVED and
TRYAGAIN.

:class:`Scripts` sends a round trip's calls in one cluster pipeline with redis-py's own
redirections off (redis-py 8.1 follows an ASK only to a node its slot map names, else fails
with AttributeError, redis-py #2432, and runs the redirected call on another connection than
the round trip's WAIT). What each call's result asks for (:func:`step_of`):

- ASK (its slot half-moved, its keys on the importing master): run now on that master, on one
  connection: ``ASKING``, ``EVALSHA``, and with replicated durability ``WAIT`` after them,
  checked like every WAIT. The master may be one the slot map does not name yet (it joined
  and serves no slot): a connection of its own, closed after. NOSCRIPT there: every script is
  loaded on it and those calls run again. A second redirect from it: sent again next pass.
- MOVED (its slot moved for good): the slot map updated; sent again next pass, with the WAIT
  of its new master.
- TRYAGAIN (its keys split by a migration; nothing ran): sent again next pass, after a pause.
- a connection error, a timeout, CLUSTERDOWN: the slot map refreshed (a failover may have
  promoted a replica), StoreUnavailableError: a retry.

Every script is safe to run again, and a call sent again runs after the rest of its round
trip. The passes are bounded by the caller (:meth:`Scripts.run`).
"""

from __future__ import annotations

import contextlib
import enum
from collections.abc import Callable, Iterator, Sequence
from typing import Any, cast

import redis
from redis.cluster import PipelineCommand, RedisCluster
from redis.exceptions import (
    AskError,
    ClusterDownError,
    MovedError,
    NoScriptError,
    RedisClusterException,
    SlotNotCoveredError,
    TryAgainError,
)

from eoguard.errors import StoreError, StoreUnavailableError
from eoguard.store.client import RedisClient, wrap_redis_error
from eoguard.store.replicas import ReplicaWait, add_waits, check_ack, check_acks


class Step(enum.Enum):
    """What a round trip does next with one call's result."""

    ANSWERED = "kept: the call's reply"
    FAILED = "raised: the script's own error"
    NOSCRIPT = "the scripts loaded, the call sent again"
    ASK = "run now on the ASK's master, asking"
    MOVED = "the slot map updated, the call sent again next pass"
    TRYAGAIN = "a pause, the call sent again next pass"
    UNAVAILABLE = "the slot map refreshed, StoreUnavailableError raised"


_UNAVAILABLE = (redis.ConnectionError, redis.TimeoutError, ClusterDownError, SlotNotCoveredError)
_STEPS: tuple[tuple[type[Exception] | tuple[type[Exception], ...], Step], ...] = (
    (MovedError, Step.MOVED),  # before AskError: redis-py derives MOVED from ASK
    (AskError, Step.ASK),
    (TryAgainError, Step.TRYAGAIN),
    (NoScriptError, Step.NOSCRIPT),
    (_UNAVAILABLE, Step.UNAVAILABLE),
)


def step_of(result: object) -> Step:
    """What ``result`` (a reply, or the error a pipeline holds in its place) asks for."""
    if not isinstance(result, Exception):
        return Step.ANSWERED
    return next((step for kind, step in _STEPS if isinstance(result, kind)), Step.FAILED)


SENT_AGAIN = frozenset({Step.NOSCRIPT, Step.ASK, Step.MOVED, Step.TRYAGAIN})
"""The steps after which a call goes out again next pass (an ASK still there after
:meth:`Redirects.round_trip`: its master sent it on again)."""


def tryagain_pause_s(passes: int) -> float:
    """The pause before the next pass after a TRYAGAIN, growing a little: 50 ms, then 5 ms more
    a pass, at most 100 ms (the keys of a migrating slot move one MIGRATE at a time); the caller
    sleeps it jittered (:mod:`eoguard.backoff`)."""
    return min(0.05 + 0.005 * passes, 0.1)


def store_error(exc: Exception, doing: str) -> StoreError:
    """The eoguard error for a call's error: CLUSTERDOWN (a failover under way) is
    StoreUnavailableError, the rest as :func:`wrap_redis_error` maps them."""
    if isinstance(exc, (ClusterDownError, RedisClusterException)):
        return StoreUnavailableError(f"the Redis Cluster cannot serve {doing}: {exc}")
    return wrap_redis_error(exc, doing)


class ClusterStack:
    """The commands of one cluster pipeline, queued as ``pipeline.execute_command`` queues
    them, and sent by :meth:`Redirects.round_trip`."""

    def __init__(self) -> None:
        self.commands: list[PipelineCommand] = []

    def execute_command(self, *args: Any, **options: Any) -> None:
        self.commands.append(PipelineCommand(args, options, len(self.commands)))


class Redirects:
    """Sends a cluster round trip and answers its redirect replies (see the module's text)."""

    def __init__(self, client: RedisClient, sources: Callable[[], Sequence[str]]) -> None:
        if not isinstance(client, RedisCluster):
            raise TypeError("redirects are a Redis Cluster's")
        self._client = client
        self._cluster: RedisCluster = client
        self._sources = sources  # every eoguard script, for a master that holds none

    def route(self, keys: Sequence[str]) -> dict[str, Any]:
        """The master of the slot of ``keys[0]``, named (``target_nodes``), for a call's
        options.

        redis-py 8.1's cluster pipeline blocks ``pipe.evalsha`` (hence ``execute_command``)
        and, for a command without a routing policy such as EVALSHA, asks the default node
        ``COMMAND GETKEYS`` first: one more round trip per call, and none answers once that
        node died, so the pipeline never refreshes its slot map. A named node skips both.
        """
        node = self._cluster.get_node_from_key(keys[0]) if keys else None
        return {} if node is None else {"target_nodes": node}

    def round_trip(self, stack: ClusterStack, first_keys: Sequence[str | None], doing: str,
                   wait: ReplicaWait | None) -> list[Any]:
        """One pass: ``stack``'s calls (one per first key) in one pipeline, with ``wait`` a WAIT
        per master after them; each call's reply or error, in order.

        Step 1. Send, redirections off. Step 2. Each MOVED updates the slot map (also when a
        WAIT then fails: the next round trip must not go to the old master again). Step 3.
        The WAIT of each master where a call ran is checked; a master where every call was
        sent on ran none (it may be a replica by now, refusing WAIT). Step 4. Each call
        answered ASK runs on the ASK's master (:meth:`run_asked`).
        """
        nodes = [c.options.get("target_nodes") for c in stack.commands]  # popped when sent
        keys = [k for k in first_keys if k is not None]
        planned = [] if wait is None else add_waits(self._client, stack, keys, wait)
        # Step 1.
        results = self._send(stack, doing)
        results, acks = results[:len(first_keys)], results[len(first_keys):]
        # Step 2.
        asked: dict[tuple[str, int], list[int]] = {}
        passed: set[int] = set()  # calls that did not run: sent on, or to go again
        for j, result in enumerate(results):
            if not isinstance(result, Exception):
                continue
            step = step_of(result)
            if step in SENT_AGAIN:
                passed.add(j)
            if step is Step.MOVED:
                self.moved(cast("MovedError", result))
            elif step is Step.ASK:
                ask = cast("AskError", result)
                asked.setdefault((ask.host, ask.port), []).append(j)
        # Step 3.
        if wait is not None and planned:
            if passed:  # rare: only the masters where a call ran
                ran = {getattr(nodes[j], "name", None) for j in range(len(results))
                       if j not in passed}
                acks = [ack for name, ack in zip(planned, acks, strict=True) if name in ran]
                planned = [name for name in planned if name in ran]
                keys = [k for j, k in enumerate(first_keys) if k is not None and j not in passed]
            check_acks(self._client, acks, wait, doing, first_keys=keys, planned=planned)
        # Step 4.
        for (host, port), js in asked.items():
            ran_there = self.run_asked(host, port, [stack.commands[j].args for j in js], doing,
                                       wait)
            for j, result in zip(js, ran_there, strict=True):
                if isinstance(result, MovedError):
                    self.moved(result)
                results[j] = result
        return results

    def _send(self, stack: ClusterStack, doing: str) -> list[Any]:
        """Send ``stack`` in one pipeline (one round trip per master), redirections off: each
        command's reply, or its error in its place. A connection error, a timeout or
        CLUSTERDOWN refreshes the slot map and raises StoreUnavailableError."""
        pipe: Any = self._cluster.pipeline(transaction=False)
        try:
            results = list(pipe.send_cluster_commands(stack.commands, raise_on_error=False,
                                                      allow_redirections=False))
        except (redis.RedisError, RedisClusterException) as exc:  # no node could be reached
            raise store_error(exc, doing) from exc
        for result in results:  # a call's or a WAIT's: the round trip is not acknowledged
            if isinstance(result, Exception) and isinstance(result, _UNAVAILABLE):
                self._refresh()
                raise store_error(result, doing) from result
        return results

    def moved(self, exc: MovedError) -> None:
        """The slot map after a MOVED: the slot on the master it names (redis-py's own update)."""
        nodes: Any = self._cluster.nodes_manager
        nodes.move_slot(exc)

    def run_asked(self, host: str, port: int, commands: Sequence[Sequence[Any]], doing: str,
                  wait: ReplicaWait | None) -> list[Any]:
        """Run ``commands`` (EVALSHA) on the master an ASK named, on one connection; with
        ``wait``, WAIT after them (fewer replicas: ReplicationTimeoutError). A master that
        answers NOSCRIPT gets every script loaded and those calls again. Each command's reply
        or error, in order."""
        with self._master(host, port) as node:
            results = self._asking(node, commands, doing, wait)
            missing = [j for j, result in enumerate(results) if isinstance(result, NoScriptError)]
            if missing:
                self._load_all(node, doing)
                again = self._asking(node, [commands[j] for j in missing], doing, wait)
                for j, result in zip(missing, again, strict=True):
                    results[j] = result
        return results

    def _asking(self, node: redis.Redis, commands: Sequence[Sequence[Any]], doing: str,
                wait: ReplicaWait | None) -> list[Any]:
        pipe: Any = node.pipeline(transaction=False)
        for command in commands:
            pipe.execute_command("ASKING")  # lets the importing master run the next command
            pipe.execute_command(*command)
        if wait is not None:  # on the same connection: WAIT counts its own writes
            pipe.execute_command("WAIT", wait.replicas, wait.timeout_ms)
        try:
            replies = list(pipe.execute(raise_on_error=False))
        except redis.RedisError as exc:
            raise wrap_redis_error(exc, f"{doing} (sent on by ASK)") from exc
        if wait is not None:
            check_ack(replies[-1], wait, f"{doing} (sent on by ASK)")
            replies = replies[:-1]
        return replies[1::2]

    def _load_all(self, node: redis.Redis, doing: str) -> None:
        pipe: Any = node.pipeline(transaction=False)
        for source in self._sources():
            pipe.script_load(source)
        try:
            pipe.execute()
        except redis.RedisError as exc:
            raise wrap_redis_error(exc, f"loading eoguard's Lua scripts while {doing}") from exc

    @contextlib.contextmanager
    def _master(self, host: str, port: int) -> Iterator[redis.Redis]:
        """A client of the master at ``host:port``: redis-py's when its slot map names it, else
        one of its own (same options), closed after."""
        nodes: Any = self._cluster.nodes_manager
        host, port = nodes.remap_host_port(host, port)
        known = nodes.get_node(host=host, port=port)
        if known is not None:
            yield self._cluster.get_redis_connection(known)
            return
        own: redis.Redis = nodes.create_redis_node(
            host, port, maint_notifications_config=nodes.maint_notifications_config,
            **nodes.connection_kwargs)
        try:
            yield own
        finally:
            own.connection_pool.disconnect()
            own.close()

    def _refresh(self) -> None:
        """The slot map read anew, as redis-py does after a connection error: a replica a
        failover promoted takes its master's slots. Unreachable: left as it is."""
        with contextlib.suppress(redis.RedisError, RedisClusterException):
            self._cluster.nodes_manager.initialize()
