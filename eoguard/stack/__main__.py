"""``python -m eoguard.stack up|down|status|install``: drive the local stack without click."""

from __future__ import annotations

import argparse
import json
import os
import sys

from eoguard.errors import StackError
from eoguard.stack import LocalStack, resolve
from eoguard.stack.debian import FAULT_TOOLS, ensure_package
from eoguard.stack.local import TOPOLOGIES
from eoguard.stack.redis_server import ensure_redis_server
from eoguard.stack.schema_registry import distribution, registry_java


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m eoguard.stack")
    parser.add_argument("action", choices=["up", "down", "status", "install"])
    parser.add_argument("--clean", action="store_true", help="with down: delete the data too")
    parser.add_argument("--topology", choices=TOPOLOGIES, default=None,
                        help="single (default, or EOGUARD_TOPOLOGY) or cluster: 3 Kafka nodes, "
                             "a Redis Cluster of 3 masters and 3 replicas")
    args = parser.parse_args(argv)
    try:
        stack = LocalStack(topology=args.topology)
        if args.action == "up":
            ends, started = stack.up()
            print(json.dumps({**ends.shown_env(), "started": started}))
        elif args.action == "down":
            stack.down(clean=args.clean)
        elif args.action == "status":
            print(json.dumps(stack.status(), indent=2))
        else:  # install: everything the stack needs, without starting it
            print(f"redis-server: {ensure_redis_server()}")
            for kind in ("kafka", "spark"):
                print(f"{kind}: {len(resolve(kind))} jars")
            print(f"schema registry: {distribution()} on {registry_java()}")
            if os.geteuid() == 0:  # the fault tests' tools; without root those tests skip
                for package, provides in FAULT_TOOLS:
                    print(f"{package}: {ensure_package(package, provides)}")
    except StackError as exc:
        print(f"eoguard stack: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
