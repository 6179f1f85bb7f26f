"""The chaos run's Spark job while the run goes on: ``python -m tests.fault.chaos.spark_driver ARGS``.

``ARGS`` are ``python -m eoguard_spark``'s (its parser builds the options); the job runs on the
Spark master ``EOG_MASTER`` with the extra settings of ``EOG_CONF`` (a JSON object) and a
processing-time trigger, until the file named by ``EOG_STOP`` exists; then it processes what is
available (``processAllAvailable``), stops, and waits for the last outbox acknowledgement. It
prints ``{"batch": ...}`` per micro-batch (as ``python -m eoguard_spark`` does) and ``FINISHED``
at a clean end; a failed query exits 1, for the run's supervisor to start it again from its
checkpoint (tests/fault/chaos/spark_scope.py).
"""

from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import asdict
from pathlib import Path

from eoguard_spark.__main__ import options_from, parser


def main(argv: list[str]) -> int:
    args = parser().parse_args(argv)
    options = options_from(args)
    # pyspark only now: the options above fail fast without a JVM
    from eoguard_spark import BatchStats, build_query, local_session, wait_for_acks  # noqa: PLC0415

    conf = {"spark.ui.showConsoleProgress": "false", "spark.driver.host": "127.0.0.1",
            "spark.driver.bindAddress": "127.0.0.1", **json.loads(os.environ.get("EOG_CONF", "{}"))}
    spark = local_session(master=os.environ.get("EOG_MASTER", args.master),
                          shuffle_partitions=args.shuffle_partitions, conf=conf)
    spark.sparkContext.setLogLevel("WARN")

    def report(stats: BatchStats) -> None:
        print(json.dumps({"batch": asdict(stats)}), flush=True)

    stop = Path(os.environ["EOG_STOP"])
    query = build_query(spark, options, on_batch=report)
    try:
        while not stop.exists() and query.isActive:
            time.sleep(0.5)
        if query.exception() is not None or not query.isActive:
            print(f"QUERY ENDED: {query.exception()}", flush=True)
            return 1
        query.processAllAvailable()
        query.stop()
    finally:
        wait_for_acks(query)
    print("FINISHED", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
