"""``python -m bench``: every benchmark in one run against the local stack (starts it if needed).

Each suite prints its own detail, then the machine and the versions, and one table of rates
(every path beside its baseline) and one of latencies, within 100 columns (table.py).
``python -m bench producer latency`` runs a subset with default options; ``--json FILE``
writes the rows to a file too, so two runs can be compared. Each suite also runs alone with
its own options (``python -m bench.bench_consumer --help``).
"""

from __future__ import annotations

import argparse
import importlib
import sys
import time

from bench import table

SUITES = ("producer", "async", "consumer", "latency", "spark", "wire")
MODULES = {"async": ("async", "async_consumer")}  # a suite of more than one module (bench_*)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("suites", nargs="*", metavar="SUITE",
                        help=f"which to run (default: all of {', '.join(SUITES)})")
    parser.add_argument("--json", metavar="FILE", help="write the table to FILE as JSON")
    args = parser.parse_args(argv)
    unknown = [s for s in args.suites if s not in SUITES]
    if unknown:
        parser.error(f"unknown suite(s) {unknown}; choose from {list(SUITES)}")
    suites = args.suites or SUITES
    started = time.monotonic()
    took: list[str] = []
    for name in suites:
        print(f"\n=== bench {name} ===", flush=True)
        suite_started = time.monotonic()
        # Each suite parses its own options: defaults here, but the consumer suite's trickle
        # latency run is left out when the latency suite (which has that point) runs too.
        extra = ["--latency-s", "0"] if name == "consumer" and "latency" in suites else []
        for module in MODULES.get(name, (name,)):
            sys.argv = [f"bench.bench_{module}", *extra]
            importlib.import_module(f"bench.bench_{module}").main()
        took.append(f"{name} {time.monotonic() - suite_started:.0f} s")
    print(f"\nran in {time.monotonic() - started:.0f} s ({', '.join(took)})")
    info = table.machine()
    print()
    table.render(table.ROWS, info)
    if args.json:
        table.write_json(args.json, table.ROWS, info)
        print(f"written to {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
