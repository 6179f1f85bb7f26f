"""``python -m bench``: every benchmark in one run against the local stack (starts it if needed).

Each prints its own throughput and its ratio against the plain baseline measured in the same run.
``python -m bench producer consumer`` runs a subset with default options; each suite also runs
alone with its own options (``python -m bench.bench_consumer --help``).
"""

from __future__ import annotations

import importlib
import sys

SUITES = ("producer", "consumer", "spark")


def main(argv: list[str]) -> int:
    wanted = argv or list(SUITES)
    unknown = [w for w in wanted if w not in SUITES]
    if unknown:
        print(f"unknown benchmark(s) {unknown}; choose from {list(SUITES)}", file=sys.stderr)
        return 2
    for name in wanted:
        print(f"\n=== bench {name} ===", flush=True)
        sys.argv = [f"bench.bench_{name}"]  # each suite parses its own options: defaults here
        importlib.import_module(f"bench.bench_{name}").main()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
