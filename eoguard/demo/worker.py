"""The demo's worker processes: ``python -m eoguard.demo.worker producer|consumer ...``.

The demo runs them as subprocesses so it can SIGKILL them mid-way, as a crash would.

producer: a GuardedProducer (``--mode``, keep_until=consumed) sends orders at a steady rate
and writes its ledger, one line per event, flushed line by line so a SIGKILL loses none that
were written: ``S <seq> <id>`` sent, ``X <id> <expires_at_ms>`` its expiry, ``G <id>``
guaranteed, ``F <id> <reason>`` failed, ``R <seq> <error>`` refused by ``send`` (a typed error
while Redis or Kafka is down: the application keeps it), ``D <id>`` produced a second time on
purpose (the very same envelope bytes, read back from the outbox, as an application retry
would; in delayed mode only for the rare record that was written). ``--mode delayed`` runs the
delayed mode; ``--short-every N`` gives every N-th message ``--short-ttl-s``. At the end it
writes its ``stats()``, with ``series``: every 250 ms the seconds since start, messages sent,
written to Redis, Redis writes avoided, and the adaptive delay (ms).

consumer: a GuardedConsumer in one scope with a Redis-transactional handler: it counts each
handling in a hash (``HINCRBY handled <id> 1``) inside the done mark's script, so the count is
exactly the number of committed handlings; a handling after ``expires_at`` counts in ``late``.
It writes its ``stats()`` every few hundred ms and on SIGTERM. With ``--pause-after N`` it stops
polling once it has handled N messages (its done marks landed), so the demo's SIGKILL finds it
there: a consumer that reads ahead can otherwise handle the whole topic between two looks.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from eoguard.store.keys import KeySpace

EFFECT_TTL_MS = 3_600_000


def _write_json(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, default=str))
    os.replace(tmp, path)


class Ledger:
    """Append-only, line-buffered: each line is one write(2), so it survives a SIGKILL."""

    def __init__(self, path: Path) -> None:
        self._file = path.open("a", buffering=1, encoding="utf-8")
        self._lock = threading.Lock()

    def write(self, line: str) -> None:
        with self._lock:
            self._file.write(line + "\n")

    def close(self) -> None:
        self._file.close()


def _started(build: Callable[[], Any]) -> Any:
    """``build()`` retried while Redis or Kafka is unreachable (or Redis out of memory) at
    start, as a supervisor restarting the process would; gives up after two minutes."""
    from eoguard.backoff import jittered  # noqa: PLC0415
    from eoguard.errors import UnavailableError  # noqa: PLC0415

    deadline = time.monotonic() + 120.0
    while True:
        try:
            return build()
        except UnavailableError as exc:
            if time.monotonic() > deadline:
                raise
            logging.getLogger("eoguard.demo.worker").warning("start failed, retrying: %s", exc)
            time.sleep(jittered(1.0))


def _last_recovery(producer: Any) -> None:
    """One more recovery pass before exiting; a Redis outage right now is logged, not fatal
    (the periodic recovery of the live producers takes over what is left)."""
    from eoguard.errors import EoguardError  # noqa: PLC0415

    try:
        producer.recover()
    except EoguardError as exc:
        logging.getLogger("eoguard.demo.worker").warning("final recovery pass failed: %s", exc)


def _ledger_delivery(ledger: Ledger, message_id: str) -> Callable[[Any, Any], None]:
    def delivered(err: Any, _msg: Any) -> None:
        if err is None:
            ledger.write(f"D {message_id}")
    return delivered


class Series:
    """Samples a producer's ``stats()`` every 250 ms in a thread, for the demo's chart."""

    def __init__(self, producer: Any, started: float) -> None:
        self.rows: list[list[float]] = []
        self._producer, self._started = producer, started
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="stats-series", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.25):
            s = self._producer.stats()
            self.rows.append([round(time.monotonic() - self._started, 2), s.sent, s.persisted,
                              s.redis_writes_avoided, round(s.current_delay_ms, 1)])

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


def _producer_config(args: argparse.Namespace, keys: Any) -> Any:
    from eoguard.config import KeepUntil, PersistenceMode, ProducerConfig, RedisConfig  # noqa: PLC0415

    return ProducerConfig(
        kafka={"bootstrap.servers": args.bootstrap, "linger.ms": 5,
               "message.timeout.ms": args.message_timeout_ms},
        redis=RedisConfig(url=args.redis_url, durability=args.durability),
        mode=PersistenceMode(args.mode), keep_until=KeepUntil.CONSUMED,
        resend_after_s=args.resend_after_s, lease_s=args.lease_s, recover_interval_s=0.5,
        default_ttl_s=args.ttl_s, keyspace=keys, instance_id=f"{args.name}-{os.getpid()}")


def run_producer(args: argparse.Namespace) -> int:
    import confluent_kafka  # noqa: PLC0415 - the worker's imports stay out of `eoguard --help`

    from eoguard.demo.plan import ORDER_SCHEMA, make_order  # noqa: PLC0415
    from eoguard.errors import EoguardError  # noqa: PLC0415
    from eoguard.producer.guarded import GuardedProducer  # noqa: PLC0415
    from eoguard.producer.messages import SendHandle  # noqa: PLC0415
    from eoguard.store.outbox import Outbox  # noqa: PLC0415

    ledger = Ledger(Path(args.ledger))
    keys = _keyspace(args)
    config = _producer_config(args, keys)
    producer = _started(lambda: GuardedProducer(
        config, on_guaranteed=lambda h: ledger.write(f"G {h.id}"),
        on_failed=lambda h, e: ledger.write(f"F {h.id} {type(e).__name__}")))
    raw = confluent_kafka.Producer({"bootstrap.servers": args.bootstrap, "acks": "all",
                                    "enable.idempotence": True, "linger.ms": 5})
    outbox = Outbox(_started(config.redis.connect), keys)
    def duplicate(handle: SendHandle) -> None:
        # The same envelope bytes again, as an application that retries a send would. Read
        # from the outbox right when the message is guaranteed (persist-first: written to
        # Redis first), before a consumer can have acknowledged it and deleted the record.
        if not handle.wait(10.0):
            return
        try:
            rec = outbox.get(handle.id)
        except EoguardError:  # Redis down: this retry is skipped, as an application would
            return
        if rec is None:  # consumed (and acked) already
            return
        raw.produce(rec.topic, rec.value, rec.key, on_delivery=_ledger_delivery(ledger, handle.id))
        raw.poll(0)

    started = time.monotonic()
    series = Series(producer, started)
    for i, seq in enumerate(range(args.start, args.start + args.count)):
        ahead_s = started + i / args.rate - time.monotonic()
        if ahead_s > 0:
            time.sleep(ahead_s)
        short = bool(args.short_every) and seq % args.short_every == 1
        try:
            handle = producer.send(args.topic, make_order(seq), key=f"customer-{seq % 997:04d}",
                                   ttl_s=args.short_ttl_s if short else args.ttl_s,
                                   schema=ORDER_SCHEMA)
        except EoguardError as exc:  # Redis or Kafka down too long: the application keeps it
            ledger.write(f"R {seq} {type(exc).__name__}")
            time.sleep(0.2)
            continue
        ledger.write(f"S {seq} {handle.id}")
        ledger.write(f"X {handle.id} {handle.expires_at_ms}")
        if args.duplicate_every and seq % args.duplicate_every == args.duplicate_every // 2:
            duplicate(handle)
    producer.flush(30.0)
    series.stop()
    # A recovering producer: take over what a crashed one left once its lease has lapsed.
    wait_s = args.recover_after_s - (time.monotonic() - started)
    if wait_s > 0:
        time.sleep(wait_s)
    _last_recovery(producer)
    producer.flush(30.0)
    raw.flush(30.0)
    stats = {**asdict(producer.stats()), "series": series.rows}
    producer.close()
    _write_json(Path(args.stats), stats)
    ledger.close()
    return 0


def run_consumer(args: argparse.Namespace) -> int:
    from eoguard.config import ConsumerConfig, RedisConfig  # noqa: PLC0415
    from eoguard.consumer.guarded import GuardedConsumer  # noqa: PLC0415
    from eoguard.consumer.handler import HandlerContext  # noqa: PLC0415
    from eoguard.demo.plan import HANDLED, LATE  # noqa: PLC0415
    from eoguard.errors import ConsumerFencedError, EoguardError  # noqa: PLC0415

    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())

    def handle(ctx: HandlerContext) -> None:
        handled = ctx.key_for(HANDLED)
        ctx.tx.hincrby(handled, ctx.message_id, 1)
        ctx.tx.pexpire(handled, EFFECT_TTL_MS)
        if ctx.envelope.is_expired():  # must never happen: expired messages never get here
            late = ctx.key_for(LATE)
            ctx.tx.hincrby(late, ctx.message_id, 1)
            ctx.tx.pexpire(late, EFFECT_TTL_MS)

    config = ConsumerConfig(
        kafka={"bootstrap.servers": args.bootstrap, "group.id": args.group,
               # Static membership: a restarted consumer takes its predecessor's partitions
               # at once instead of waiting for the session of the killed one to time out.
               "group.instance.id": args.instance, "session.timeout.ms": 10_000},
        redis=RedisConfig(url=args.redis_url, durability=args.durability), scope=args.scope,
        topics=(args.topic,), dead_letter_topic=args.dead_letter_topic,
        keyspace=_keyspace(args), lease_s=args.lease_s, busy_wait_s=10.0,
        max_retries=2, grace_s=args.grace_s)
    consumer = _started(lambda: GuardedConsumer(config, handler=handle))
    stats_path = Path(args.stats)
    last = 0.0
    while not stop.is_set():
        if args.pause_after and consumer.stats().handled >= args.pause_after:
            _write_json(stats_path, asdict(consumer.stats()))  # then wait for the SIGKILL
            stop.wait(0.1)
            continue
        try:
            consumer.poll_once()
        except ConsumerFencedError as exc:  # fenced: this client is dead; a new one takes over
            logging.getLogger("eoguard.demo.worker").warning("consumer rebuilt: %s", exc)
            with contextlib.suppress(EoguardError):
                consumer.close()
            consumer = _started(lambda: GuardedConsumer(config, handler=handle))
        if time.monotonic() - last > 0.25:
            _write_json(stats_path, asdict(consumer.stats()))
            last = time.monotonic()
    consumer.close()
    _write_json(stats_path, {**asdict(consumer.stats()), "closed": True})
    return 0


def _keyspace(args: argparse.Namespace) -> KeySpace:
    """The key prefix of the run, with the max_ttl every process of it must agree on."""
    from eoguard.store.keys import KeySpace  # noqa: PLC0415

    if args.max_ttl_s is None:
        return KeySpace(prefix=args.prefix)
    return KeySpace(prefix=args.prefix, max_ttl_ms=round(args.max_ttl_s * 1000))


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m eoguard.demo.worker")
    sub = p.add_subparsers(dest="role", required=True)
    for role in ("producer", "consumer"):
        s = sub.add_parser(role)
        s.add_argument("--bootstrap", required=True)
        s.add_argument("--redis-url", required=True)
        s.add_argument("--prefix", required=True)
        s.add_argument("--max-ttl-s", type=float, default=None,
                       help="the key prefix's max_ttl (every process of a prefix agrees on it); "
                            "default: KeySpace's")
        s.add_argument("--topic", required=True)
        s.add_argument("--stats", required=True)
        s.add_argument("--durability", choices=("local", "replicated"), default="local")
    prod = sub.choices["producer"]
    prod.add_argument("--name", required=True)
    prod.add_argument("--ledger", required=True)
    prod.add_argument("--start", type=int, default=0)
    prod.add_argument("--count", type=int, required=True)
    prod.add_argument("--rate", type=float, default=4000.0)
    prod.add_argument("--ttl-s", type=float, default=600.0)
    prod.add_argument("--duplicate-every", type=int, default=100)
    prod.add_argument("--lease-s", type=float, default=1.0)
    prod.add_argument("--mode", choices=("persist-first", "delayed"), default="persist-first")
    prod.add_argument("--short-every", type=int, default=0,
                      help="every n-th message gets --short-ttl-s instead of --ttl-s; 0 = none")
    prod.add_argument("--short-ttl-s", type=float, default=5.0)
    prod.add_argument("--message-timeout-ms", type=int, default=15_000)
    prod.add_argument("--resend-after-s", type=float, default=None,
                      help="resend a record not published this long; default: the timeout + 15 s")
    prod.add_argument("--recover-after-s", type=float, default=0.0,
                      help="run a last recovery pass no earlier than this after start")
    cons = sub.choices["consumer"]
    cons.add_argument("--scope", required=True)
    cons.add_argument("--group", required=True)
    cons.add_argument("--instance", required=True)
    cons.add_argument("--dead-letter-topic", required=True)
    cons.add_argument("--lease-s", type=float, default=5.0)
    cons.add_argument("--pause-after", type=int, default=0,
                      help="stop polling once this many messages are handled (0: never)")
    cons.add_argument("--grace-s", type=float, default=300.0,
                      help="dedup keys live until expires_at plus this")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    return run_producer(args) if args.role == "producer" else run_consumer(args)


if __name__ == "__main__":
    sys.exit(main())
