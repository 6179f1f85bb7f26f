"""The Arrow UDFs of bench_spark's floors, (f) and (g): plain Python on the executors.

A module of its own, importable by Spark's Python workers (``bench`` is on their path, as on
the driver's), so the UDFs are pickled by reference and :data:`_connections` lives as long as
the worker: one Redis connection per worker, opened by its first task. It imports neither
pyspark nor redis-py: every worker pays the garbage collection of what it loads after each
task.

(g) sends, per Arrow batch, the Redis writes per row that ``dedup="redis"`` makes, as plain
commands with nothing checked: one ``SET NX PXAT`` a row (the claim, like the claim script's
per-key write), with the batch record's ``SET PXAT``; then the done mark (one ``SET XX
KEEPTTL`` of the batch record: eoguard marks a micro-batch's records done, not its rows) and
the outbox acknowledgement (one ``DEL`` of the rows' outbox records and one ``ZREM`` of the
outbox index, as the ack script does per 1,000 ids). Two pipelined round trips a batch, on a
raw socket read by hiredis (redis-py's per-reply work would cost the floor more than eoguard's
own client). A floor of the work, not a design: no lease, no takeover, no replay, and the
done mark goes before the sink instead of after it.
"""

from __future__ import annotations

import socket
import uuid
from collections.abc import Iterator, Sequence
from typing import Any
from urllib.parse import unquote, urlsplit

import hiredis
import pyarrow as pa

__all__ = ["answer_new", "claim_ok_rows", "claim_plainly"]

Command = tuple[str | int, ...]
_connections: dict[str, tuple[socket.socket, hiredis.Reader]] = {}  # by URL, this worker's


def answer_new(batches: Iterator[tuple[pa.Array, ...]]) -> Iterator[pa.Array]:
    """(f): every row ``new``, with no Redis."""
    for ids, *_ in batches:
        yield pa.array(["new"] * len(ids), pa.string())


def claim_plainly(redis_url: str, prefix: str, batches: Iterator[tuple[pa.Array, ...]]
                  ) -> Iterator[pa.Array]:
    """(g): each row ``new`` if its ``SET NX`` claim landed, else ``duplicate`` (the module
    docstring); ``batches`` are (id, position, expires_at in epoch ms) columns."""
    record = f"{prefix}:b:{uuid.uuid4().hex}"  # this task's batch record
    for ids, _positions, expires in batches:
        yield pa.array(_claim(redis_url, prefix, record, ids.to_pylist(), expires.to_pylist()),
                       pa.string())


def claim_ok_rows(redis_url: str, prefix: str, batches: Iterator[tuple[pa.Array, ...]]
                  ) -> Iterator[pa.Array]:
    """(h): (g)'s claims of the rows whose ``status`` is ``ok``; the other rows keep their
    status, with no Redis command (Spark runs a Python UDF over every row of its input,
    whatever ``when`` wraps it). ``batches`` are (id, position, expires_at in epoch ms,
    status) columns."""
    record = f"{prefix}:b:{uuid.uuid4().hex}"  # this task's batch record
    for ids, _positions, expires, status_array in batches:
        status: list[str] = status_array.to_pylist()
        ok = [i for i, row_status in enumerate(status) if row_status == "ok"]
        id_list, pxat = ids.to_pylist(), expires.to_pylist()
        claimed = _claim(redis_url, prefix, record, [id_list[i] for i in ok],
                         [pxat[i] for i in ok])
        for i, outcome in zip(ok, claimed, strict=True):
            status[i] = "ok" if outcome == "new" else outcome
        yield pa.array(status, pa.string())


def _claim(redis_url: str, prefix: str, record: str, ids: list[str], pxat: list[int]
           ) -> list[str]:
    """``new`` or ``duplicate`` per id: one ``SET NX PXAT`` each and the batch record's
    ``SET PXAT``, then the done mark and the outbox acknowledgement (two round trips)."""
    if not ids:
        return []
    claims: list[Command] = [("SET", f"{prefix}:d:{message_id}", "1", "NX", "PXAT", at)
                             for message_id, at in zip(ids, pxat, strict=True)]
    claims.append(("SET", record, "o", "PXAT", max(pxat)))
    landed = _round_trip(redis_url, claims)[:-1]
    _round_trip(redis_url, [("SET", record, "d", "XX", "KEEPTTL"),
                            ("DEL", *(f"{prefix}:o:{message_id}" for message_id in ids)),
                            ("ZREM", f"{prefix}:index", *ids)])
    return ["duplicate" if reply is None else "new" for reply in landed]


def _round_trip(redis_url: str, commands: Sequence[Command]) -> list[object]:
    """Send ``commands`` in one write on this worker's connection; their replies, in order.
    An error reply raises (a floor that fails must not look fast)."""
    sock, reader = _connection(redis_url)
    pack: Any = hiredis.pack_command  # its stubs want a 1-tuple
    sock.sendall(b"".join(pack(command) for command in commands))
    replies: list[object] = []
    while len(replies) < len(commands):
        while (reply := reader.gets()) is not False:
            if isinstance(reply, hiredis.ReplyError):
                raise RuntimeError(f"Redis refused a floor command: {reply}")
            replies.append(reply)
        if len(replies) < len(commands):
            data = sock.recv(1 << 16)
            if not data:
                raise ConnectionError("Redis closed the floor's connection")
            reader.feed(data)
    return replies


def _connection(redis_url: str) -> tuple[socket.socket, hiredis.Reader]:
    """This worker's connection to ``redis_url`` (``redis://[:password@]host:port/db``)."""
    if redis_url not in _connections:
        url = urlsplit(redis_url)
        if url.scheme != "redis":
            raise ValueError(f"the floor speaks plain redis:// only, not {url.scheme}://")
        sock = socket.create_connection((url.hostname or "127.0.0.1", url.port or 6379),
                                        timeout=30)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        _connections[redis_url] = (sock, hiredis.Reader())
        hello: list[Command] = []
        if url.password:
            hello.append(("AUTH", *([unquote(url.username)] if url.username else []),
                          unquote(url.password)))
        if url.path.strip("/"):
            hello.append(("SELECT", url.path.strip("/")))
        if hello:
            _round_trip(redis_url, hello)
    return _connections[redis_url]
