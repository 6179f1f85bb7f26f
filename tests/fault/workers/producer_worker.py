"""A GuardedProducer process for the fault tests: sends until it is killed.

Every id whose ``on_guaranteed`` fired is appended to ``--report`` (one line each, O_APPEND
and unbuffered, so a SIGKILL loses nothing the kernel was given). The parent kills this
process with SIGKILL at a random point and checks that every reported id reaches Kafka.

    python tests/fault/workers/producer_worker.py --bootstrap B --redis URL --prefix P \\
        --topic T --mode persist-first --report FILE [--rate N] [--lease-s S]

With ``--orders N`` it sends orders 0..N-1 (``--first F``: F..F+N-1) once each, under ids
derived from the order number (``message_id_for("orders", ...)``), as an application that
may send the same order again after its own crash; then it waits until all are guaranteed
and exits. With
``--until-file F`` it sends until F exists, then closes (flushing what is in flight) and exits.
"""

from __future__ import annotations

import argparse
import os
import time

from eoguard.config import ProducerConfig, RedisConfig
from eoguard.envelope import message_id_for
from eoguard.producer.guarded import GuardedProducer
from eoguard.store.keys import KeySpace


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--redis", required=True)
    parser.add_argument("--prefix", required=True)
    parser.add_argument("--topic", required=True)
    parser.add_argument("--mode", default="persist-first")
    parser.add_argument("--report", required=True)
    parser.add_argument("--rate", type=float, default=0.0, help="messages/s; 0 = as fast as possible")
    parser.add_argument("--lease-s", type=float, default=1.5)
    parser.add_argument("--shards", type=int, default=8)
    parser.add_argument("--orders", type=int, default=0,
                        help="send this many orders keyed by order number, then exit")
    parser.add_argument("--first", type=int, default=0, help="with --orders: the first number")
    parser.add_argument("--recover", action="store_true", help="recover on start")
    parser.add_argument("--until-file", default="",
                        help="stop sending once this file exists, close the producer, exit")
    parser.add_argument("--delay-ms", type=int, default=0,
                        help="delayed mode: fixed delay (min = max); 0 = the adaptive default")
    args = parser.parse_args()

    fd = os.open(args.report, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    def guaranteed(handle) -> None:
        os.write(fd, f"{handle.id}\n".encode())

    config = ProducerConfig(
        kafka={"bootstrap.servers": args.bootstrap, "linger.ms": 5,
               "queue.buffering.max.messages": 1_000_000, "message.timeout.ms": 60_000},
        redis=RedisConfig(url=args.redis), mode=args.mode, lease_s=args.lease_s,
        keyspace=KeySpace(prefix=args.prefix, shards=args.shards), default_ttl_s=900,
        send_timeout_s=30, recover_on_start=args.recover,
        **({"delay_min_ms": args.delay_ms, "delay_max_ms": args.delay_ms} if args.delay_ms else {}))
    producer = GuardedProducer(config, on_guaranteed=guaranteed)
    i = 0
    started = time.monotonic()
    if args.orders:
        handles = []
        for i in range(args.first, args.first + args.orders):
            number = f"order-{i:06d}"
            handles.append(producer.send(args.topic, number.encode(), key=number,
                                         message_id=message_id_for("orders", number)))
            if args.rate and i % 10 == 0:
                ahead = (i - args.first) / args.rate - (time.monotonic() - started)
                if ahead > 0:
                    time.sleep(ahead)
        producer.close()
        raise SystemExit(0 if all(h.guaranteed for h in handles) else 1)
    while not (args.until_file and i % 100 == 0 and os.path.exists(args.until_file)):
        producer.send(args.topic, b"payload-%08d" % i + b"." * 180, key=b"k%d" % (i % 32))
        i += 1
        if args.rate and i % 100 == 0:
            ahead = i / args.rate - (time.monotonic() - started)
            if ahead > 0:
                time.sleep(ahead)
    producer.close()


if __name__ == "__main__":
    main()
