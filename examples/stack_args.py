"""The command line the examples share: where Kafka, Redis and Schema Registry are.

Each flag defaults to the environment variable ``python -m eoguard.stack up`` prints, then
to the local stack's own address: with the stack up, every example runs without arguments.
"""

from __future__ import annotations

import argparse
import os
import uuid


def stack_parser(description: str) -> argparse.ArgumentParser:
    """A parser with ``--bootstrap``, ``--redis``, ``--registry``, ``--topic``, ``--prefix``."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--bootstrap", help="Kafka bootstrap servers",
                        default=os.environ.get("EOGUARD_KAFKA_BOOTSTRAP", "127.0.0.1:19092"))
    parser.add_argument("--redis", help="Redis URL of the outbox and the dedup keys",
                        default=os.environ.get("EOGUARD_REDIS_URL", "redis://127.0.0.1:16379/0"))
    parser.add_argument("--registry", help="Schema Registry URL (Confluent-compatible API)",
                        default=os.environ.get("EOGUARD_SCHEMA_REGISTRY_URL",
                                               "http://127.0.0.1:18081/apis/ccompat/v7"))
    parser.add_argument("--topic", default="orders")
    parser.add_argument("--prefix", default="eoguard", help="Redis key prefix")
    return parser


def unique(name: str) -> str:
    """``name`` with a random suffix: a consumer group of one run."""
    return f"{name}-{uuid.uuid4().hex[:8]}"
