"""eoguard's Lua scripts: loaded once from ``eoguard/store/lua``, run by SHA, batched.

Each ``.lua`` file is one atomic operation with its contract in its header; its binding
(:mod:`eoguard.store.bindings`) builds its calls and reads its replies. Calls go out as
EVALSHA in one pipeline per batch: one round trip. A server that lost its script cache
(restart, failover, SCRIPT FLUSH) answers NOSCRIPT; only those calls are loaded and resent.
On a cluster, a call answered ASK, MOVED or TRYAGAIN is answered by :mod:`.redirects`. On a
single node a round trip may also carry plain commands (:class:`Command`).
redis-py's own ``register_script`` in a pipeline asks SCRIPT EXISTS before every execute,
a second round trip per batch, which is why the SHA bookkeeping lives here.
"""

from __future__ import annotations

import functools
import hashlib
import re
import time
from collections.abc import Callable, Sequence
from importlib import resources
from typing import Any, Generic, NamedTuple, TypeVar

import redis
from redis.cluster import RedisCluster
from redis.exceptions import NoScriptError

from eoguard.backoff import jittered
from eoguard.errors import StoreError, StoreUnavailableError
from eoguard.store import redirects
from eoguard.store.client import RedisClient, wrap_redis_error
from eoguard.store.redirects import ClusterStack, Redirects, Step
from eoguard.store.replicas import ReplicaWait, add_waits, check_acks

_hiredis_pack: Callable[[tuple[Any, ...]], bytes] | None
try:
    from hiredis import pack_command as _hiredis_pack
except ImportError:  # redis-py without hiredis: its own packer
    _hiredis_pack = None

ScriptArg = str | bytes | int | float
T = TypeVar("T")


class LuaScript(NamedTuple):
    """A script's name (its file stem), source text and SHA1."""

    name: str
    source: str
    sha: str


_INCLUDE = re.compile(r"^--!include (\w+)$", re.MULTILINE)


def _lua_file(path: str) -> str:
    return resources.files("eoguard.store").joinpath(f"lua/{path}.lua").read_text("utf-8")


@functools.cache
def all_scripts() -> tuple[str, ...]:
    """The name of every script (``lua/*.lua``; the parts in ``lua/lib`` are not scripts)."""
    folder = resources.files("eoguard.store").joinpath("lua")
    return tuple(sorted(entry.name.removesuffix(".lua") for entry in folder.iterdir()
                        if entry.name.endswith(".lua")))


@functools.cache
def lua_script(name: str) -> LuaScript:
    """The script ``eoguard/store/lua/<name>.lua``, read once per process.

    A line ``--!include <part>`` is replaced by ``lua/lib/<part>.lua``: the parts several
    scripts share (the server clock, the dedup value formats, the effect checker) are written
    once, and each script is still one self-contained call (one SHA, one EVALSHA).
    """
    source = _INCLUDE.sub(lambda m: _lua_file(f"lib/{m.group(1)}").rstrip("\n"), _lua_file(name))
    sha = hashlib.sha1(source.encode(), usedforsecurity=False).hexdigest()
    return LuaScript(name, source, sha)


class ScriptCall(NamedTuple):
    """One script invocation: every key it touches is in ``keys`` (one hash slot)."""

    script: str
    keys: Sequence[str]
    args: Sequence[ScriptArg]


class Command(NamedTuple):
    """A plain Redis command sent among script calls, on a single node only (a cluster routes
    script calls by their keys): a fresh claim pass's ``SET ... NX GET PXAT`` per new claim and
    the ``EVAL`` that opens its batch records first (:meth:`DedupStore.prepare_claim`).
    It is never sent again: an error in its reply is raised, whatever it is."""

    name: str
    args: tuple[ScriptArg, ...]


Call = ScriptCall | Command
"""What a round trip carries."""


def _label(call: Call) -> str:
    return call.script if isinstance(call, ScriptCall) else call.name


def _command(call: Call) -> tuple[ScriptArg, ...]:
    """``call`` as the command sent: EVALSHA of its script, or the plain command."""
    if isinstance(call, ScriptCall):
        return ("EVALSHA", lua_script(call.script).sha, len(call.keys), *call.keys, *call.args)
    return (call.name, *call.args)


class Prepared(NamedTuple, Generic[T]):
    """Script calls built but not sent, and how to read their replies.

    Several go out in one pipeline (:meth:`Scripts.run_prepared`): e.g. the consumer sends a
    batch's done marks, the next batch's claims and its liveness heartbeat in one round trip.
    """

    calls: Sequence[Call]
    parse: Callable[[list[Any]], T]


class Scripts:
    """Runs :class:`ScriptCall` batches on one client, one round trip per batch."""

    _MAX_RELOADS = 3
    _MAX_ASKS = 4
    _MAX_PASSES = 16  # as redis-py's RedisClusterRequestTTL: ~1.2 s of TRYAGAIN pauses

    def __init__(self, client: RedisClient, *, wait: ReplicaWait | None = None) -> None:
        self._client = client
        self._loaded = False  # every script loaded by this instance since its last NOSCRIPT
        self.wait = wait  # replicated durability: each round trip ends with WAIT (replicas.py)
        self._cluster = client if isinstance(client, RedisCluster) else None
        self._redirects = None if self._cluster is None else Redirects(client, _sources)

    @property
    def client(self) -> RedisClient:
        return self._client

    def load_all(self) -> None:
        """Load every script of eoguard (one pipelined round trip).

        Done before the first send, and again on any NOSCRIPT: a round trip whose calls are
        answered partly NOSCRIPT (some scripts loaded, others not) has run its later calls
        before the ones resent, and a done mark resent after the next batch's claims of the
        same records would find them MINE instead of DONE_HERE. With every script loaded
        before a send, only a server that lost them all (a restart, a failover, SCRIPT
        FLUSH) answers NOSCRIPT, and then to every call alike.
        """
        if self._cluster is not None:  # SCRIPT LOAD goes to every primary
            for name in all_scripts():
                self._load(name)
        else:
            pipe = self._client.pipeline(transaction=False)
            for name in all_scripts():
                pipe.script_load(lua_script(name).source)
            self.execute(pipe, doing="loading eoguard's Lua scripts")
        self._loaded = True

    def run_one(self, call: ScriptCall) -> Any:
        """Run one call and return its reply."""
        return self.run([call])[0]

    def run(self, calls: Sequence[Call], *, doing: str = "running a script") -> list[Any]:
        """Run ``calls`` pipelined and return their replies in call order.

        A call that asks for keys it did not declare (:func:`declaring`) is run again with
        them declared. Raises :class:`StoreUnavailableError` when Redis cannot be reached and
        :class:`StoreError` when a script fails. A batch that fails midway may have applied
        some calls: every script is written to be safe to run again.
        """
        replies = self._run_once(calls, doing)
        return self.answer_asks(calls, replies, doing)

    def answer_asks(self, calls: Sequence[Call], replies: list[Any], doing: str
                    ) -> list[Any]:
        """``replies`` with each call that asked for undeclared keys run again declaring them
        (a few times at most: each run may find other holders)."""
        calls = list(calls)
        for _ in range(self._MAX_ASKS):
            asked = [i for i, (call, reply) in enumerate(zip(calls, replies, strict=True))
                     if isinstance(call, ScriptCall) and _asks(reply)]
            if not asked:
                return replies
            again: list[Call] = []
            for i in asked:
                call = calls[i]
                assert isinstance(call, ScriptCall)  # only a script asks
                again.append(declaring(call, replies[i]))
            for i, call, reply in zip(asked, again, self._run_once(again, doing), strict=True):
                calls[i], replies[i] = call, reply
        raise StoreError(f"a script kept asking for keys it did not declare while {doing}")

    def _run_once(self, calls: Sequence[Call], doing: str) -> list[Any]:
        """Every call run once, in passes: a call answered NOSCRIPT, MOVED or TRYAGAIN (or ASK
        twice) goes out again in the next pass (redirects.py says what each asks for)."""
        if not calls:
            return []
        if not self._loaded:
            self.load_all()
        replies: list[Any] = [None] * len(calls)
        todo, reloads = list(range(len(calls))), 0
        for passes in range(self._MAX_PASSES):
            # Step 1. One pipeline, one round trip; on a cluster, ASK answered in it.
            results = self._send([calls[i] for i in todo], doing)
            # Step 2. Each reply kept; each call a redirect or NOSCRIPT answered goes again.
            again: list[int] = []
            steps: set[Step] = set()
            for i, result in zip(todo, results, strict=True):
                if not isinstance(result, Exception):
                    replies[i] = result
                    continue
                step = redirects.step_of(result)
                if step not in redirects.SENT_AGAIN or not isinstance(calls[i], ScriptCall):
                    raise redirects.store_error(result, f"{doing} ({_label(calls[i])})") from result
                again.append(i)
                steps.add(step)
            if not again:
                return replies
            # Step 3. Before the next pass: the scripts after NOSCRIPT, a pause after TRYAGAIN.
            if Step.NOSCRIPT in steps:
                reloads += 1
                if reloads >= self._MAX_RELOADS:
                    raise StoreError(f"Redis kept answering NOSCRIPT while {doing}")
                self.load_all()
            if Step.TRYAGAIN in steps:
                time.sleep(jittered(redirects.tryagain_pause_s(passes)))
            todo = again
        raise StoreUnavailableError(f"a hash slot kept moving while {doing}: retry")

    def _send(self, calls: Sequence[Call], doing: str) -> list[Any]:
        """``calls`` as EVALSHA in one pipeline, with replicated durability a WAIT per master
        after them (checked); each call's reply or error. On a cluster, :class:`Redirects`
        sends it and answers its redirects: a call sent on by ASK runs there, with its WAIT."""
        pipe = ClusterStack() if self._redirects is not None \
            else self._client.pipeline(transaction=False)
        for call in calls:
            pipe.execute_command(*_command(call), **self._route(call))
        if self._redirects is not None:
            first = [call.keys[0] if call.keys else None
                     for call in calls if isinstance(call, ScriptCall)]
            return self._redirects.round_trip(pipe, first, doing, self.wait)
        planned = [] if self.wait is None else add_waits(self._client, pipe, [], self.wait)
        results = self.execute(pipe, doing=doing, raise_on_error=False)
        if self.wait is not None and planned:
            results, acks = results[:-len(planned)], results[-len(planned):]
            check_acks(self._client, acks, self.wait, doing)
        return results

    def run_prepared(self, prepared: Sequence[Prepared[Any]], *,
                     doing: str = "running scripts") -> list[Any]:
        """Send every prepared call in one pipeline; each one's parsed replies, in order."""
        replies = self.run([call for p in prepared for call in p.calls], doing=doing)
        out, start = [], 0
        for p in prepared:
            end = start + len(p.calls)
            out.append(p.parse(replies[start:end]))
            start = end
        return out

    def send_prepared(self, prepared: Sequence[Prepared[Any]], *,
                      doing: str = "running scripts") -> InFlight:
        """Send every prepared call now and read the replies later (:meth:`InFlight.wait`):
        the caller works meanwhile while Redis runs them. One round trip, as
        :meth:`run_prepared`; a cluster client runs them at once instead."""
        calls = [call for p in prepared for call in p.calls]
        if calls and not self._loaded:
            self.load_all()
        flight = InFlight(self, prepared, calls, doing)
        if not calls or not sends_ahead(self._client):
            flight.replies = self.run(calls, doing=doing)
            return flight
        pool: Any = self._client.connection_pool  # type: ignore[attr-defined]
        try:
            conn = pool.get_connection()
        except redis.RedisError as exc:
            raise wrap_redis_error(exc, doing) from exc
        try:
            packed = _pack_evalsha(conn, calls)
            if self.wait is not None:  # on the same connection: WAIT counts its own writes
                packed += conn.pack_commands([("WAIT", self.wait.replicas, self.wait.timeout_ms)])
            # One buffer, one write: redis-py writes each item of a list with its own
            # sendall, and Redis may then run the calls over several event-loop passes, each
            # one with its own AOF fsync (``appendfsync always``).
            conn.send_packed_command([b"".join(packed)])
        except BaseException as exc:
            conn.disconnect()
            pool.release(conn)
            if isinstance(exc, redis.RedisError):
                raise wrap_redis_error(exc, doing) from exc
            raise
        flight.conn, flight.pool = conn, pool
        return flight

    def _route(self, call: Call) -> dict[str, Any]:
        if self._redirects is None:
            return {}
        if not isinstance(call, ScriptCall):
            raise TypeError(f"{call.name} is sent on a single node only, not on a cluster")
        return self._redirects.route(call.keys)

    def execute(self, pipe: Any, *, doing: str, raise_on_error: bool = True) -> list[Any]:
        """Execute a pipeline of plain commands (reads, deletes), wrapping redis-py errors at
        the boundary.

        redis-py follows the redirections of these itself; an ASK to a master its slot map
        does not name (one that just joined, taking its first slots) fails there with
        AttributeError (redis-py #2432): that is StoreUnavailableError, a retry once the slot
        is handed over (script calls go through :mod:`.redirects`, which runs them there).
        """
        try:
            return list(pipe.execute(raise_on_error=raise_on_error))
        except redis.RedisError as exc:
            raise wrap_redis_error(exc, doing) from exc
        except AttributeError as exc:
            if self._redirects is None:
                raise
            raise StoreUnavailableError(
                f"a hash slot is moving to a Redis master this client does not know yet while "
                f"{doing}: retry") from exc

    def _load(self, name: str) -> None:
        try:
            self._client.script_load(lua_script(name).source)
        except redis.RedisError as exc:
            raise wrap_redis_error(exc, f"loading {name}.lua") from exc


def _sources() -> list[str]:
    """The source of every script, for a master that holds none (:class:`Redirects`)."""
    return [lua_script(name).source for name in all_scripts()]


def _asks(reply: Any) -> bool:
    """Whether a script's reply asks for undeclared keys: ``{'?', key, ...}``, having written
    nothing (``lua/lib/undeclared.lua``)."""
    return type(reply) is list and len(reply) > 1 and reply[0] == b"?"


def declaring(call: ScriptCall, reply: list[Any]) -> ScriptCall:
    """``call`` again, with the keys its reply asked for appended to its keys.

    A script reads a key it did not declare only before its first write, and trusts it missing
    only when declared: during a slot migration it may live on the other node, and a declared
    key makes Redis route the call there (ASK) or answer TRYAGAIN until the keys are together.
    """
    extra = [key.decode() if isinstance(key, bytes) else str(key) for key in reply[1:]]
    return call._replace(keys=[*call.keys, *(key for key in extra if key not in call.keys)])


def sends_ahead(client: RedisClient) -> bool:
    """Whether :meth:`Scripts.send_prepared` on ``client`` writes now and reads later: a client
    with a pool of connections of its own. A ``RedisCluster`` routes per node and hands out
    no raw connection, so there the calls run at once."""
    return getattr(client, "connection_pool", None) is not None


def _pack_evalsha(conn: Any, calls: Sequence[Call]) -> list[bytes]:
    """EVALSHA (and plain) commands in the Redis protocol: hiredis's C packer when the client
    encodes text as UTF-8, as hiredis does (redis-py's own packing first copies every argument
    in a Python loop: ~1 us per message of a consumer batch)."""
    commands = [_command(c) for c in calls]
    if _hiredis_pack is not None and conn.encoder.encoding.lower() in ("utf-8", "utf8"):
        try:
            return [_hiredis_pack(cmd) for cmd in commands]
        except TypeError:  # a type hiredis refuses (bool, bytearray): redis-py's own rules
            pass
    packed: list[bytes] = conn.pack_commands(commands)
    return packed


class InFlight:
    """Script calls sent on a connection of their own, their replies not read yet."""

    def __init__(self, scripts: Scripts, prepared: Sequence[Prepared[Any]],
                 calls: list[Call], doing: str) -> None:
        self._scripts, self._prepared, self._calls, self._doing = scripts, prepared, calls, doing
        self.replies: list[Any] | None = None
        self.conn: Any = None
        self.pool: Any = None

    def discard(self) -> None:
        """Give the connection back without reading the replies (closed, so none is left to
        answer its next user): for a caller that failed and will not wait."""
        if self.conn is not None:
            self.conn.disconnect()
            self.pool.release(self.conn)
            self.conn = None

    def wait(self) -> list[Any]:
        """Each prepared's parsed replies, in order; raises as :meth:`Scripts.run` does.

        Calls answered NOSCRIPT (a restarted server) are loaded and run again, as in
        :meth:`Scripts.run`; every script is safe to run again."""
        if self.replies is None:
            self.replies = self._read()
        out, start = [], 0
        for p in self._prepared:
            end = start + len(p.calls)
            out.append(p.parse(self.replies[start:end]))
            start = end
        return out

    def _read(self) -> list[Any]:
        conn, calls, wait = self.conn, self._calls, self._scripts.wait
        replies: list[Any] = []
        try:
            for _ in range(len(calls) + (wait is not None)):
                try:
                    replies.append(conn.read_response())
                except redis.ResponseError as exc:  # one call's error: the others still answer
                    replies.append(exc)
        except BaseException as exc:  # replies left unread would answer the next user
            conn.disconnect()
            if isinstance(exc, redis.RedisError):
                raise wrap_redis_error(exc, self._doing) from exc
            raise
        finally:
            self.pool.release(conn)
            self.conn = None
        if wait is not None:
            replies, acks = replies[:-1], replies[-1:]
            check_acks(self._scripts.client, acks, wait, self._doing)
        missing = [i for i, reply in enumerate(replies)
                   if isinstance(reply, NoScriptError) and isinstance(calls[i], ScriptCall)]
        for i, reply in enumerate(replies):
            if isinstance(reply, Exception) and i not in missing:
                raise wrap_redis_error(reply, f"{self._doing} ({_label(calls[i])})") from reply
        if missing:
            self._scripts.load_all()
            again = self._scripts.run([calls[i] for i in missing], doing=self._doing)
            for i, reply in zip(missing, again, strict=True):
                replies[i] = reply
        return self._scripts.answer_asks(calls, replies, self._doing)
