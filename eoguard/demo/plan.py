"""What a demo run does: its options, its names (topic, scopes, key prefix) and its files.

The demo's own records (the ledgers the producer workers write, the consumers' stats, the
Spark job's checkpoint and output) live in one run directory under the stack's cache.
"""

from __future__ import annotations

import datetime
import decimal
import importlib.util
import shutil
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from eoguard.stack.paths import cache_dir

ORDER_SCHEMA = "eoguard.example.Order"
HANDLED = "handled"  # the demo handler's effect keys (KeySpace.effect: in the dedup hash slot)
LATE = "late"
_CURRENCIES = ("EUR", "USD", "GBP", "CHF", "JPY")
_KEEP_RUNS = 5


@dataclass(frozen=True, kw_only=True)
class DemoOptions:
    """Knobs of ``eoguard-dev demo``; the defaults show every failure mode in well under 2 minutes."""

    messages: int = 10_000
    ttl_s: float = 600.0
    rate: float | None = None  # sends per second; None: spread the sends over ~3 s
    kill_producer_at: float = 0.5  # SIGKILL the first producer once it has sent this share
    kill_consumer_at: float = 0.3  # SIGKILL the first consumer at this share handled
    duplicate_every: int = 100  # every n-th guaranteed message is produced twice on purpose
    expired: int = 0  # envelopes whose TTL already passed; 0 = messages / 200, at least 5
    spark: bool = False
    partitions: int = 4
    timeout_s: float = 100.0  # for the whole run; the report says what was still missing
    topology: str | None = None  # the local stack's: single or cluster (None: EOGUARD_TOPOLOGY)
    run_id: str = field(default_factory=lambda: uuid.uuid4().hex[:8])

    @property
    def send_rate(self) -> float:
        """Paced so the crashes land mid-way, whatever the number of messages."""
        return self.rate or max(100.0, self.messages / 3.0)

    @property
    def expired_count(self) -> int:
        return self.expired or max(5, self.messages // 200)


@dataclass(frozen=True, kw_only=True)
class RunNames:
    """Kafka and Redis names of one run, so runs never see each other's data."""

    topic: str
    dead_letter_topic: str
    prefix: str
    scope: str
    spark_scope: str
    group: str

    @classmethod
    def of(cls, run_id: str) -> RunNames:
        topic = f"eoguard-demo-{run_id}"
        return cls(topic=topic, dead_letter_topic=f"{topic}.dead-letter", prefix=f"demo-{run_id}",
                   scope="orders", spark_scope="orders-spark", group=f"{topic}-orders")


class RunDir:
    """The files of one run."""

    def __init__(self, run_id: str, root: Path | None = None) -> None:
        self.root = root or cache_dir() / "demo"
        self.path = self.root / run_id

    def create(self) -> RunDir:
        self.path.mkdir(parents=True, exist_ok=True)
        runs = sorted((p for p in self.root.iterdir() if p.is_dir() and p != self.path),
                      key=lambda p: p.stat().st_mtime)
        for old in runs[:-_KEEP_RUNS]:
            shutil.rmtree(old, ignore_errors=True)
        return self

    def ledger(self, worker: str) -> Path:
        return self.path / f"{worker}.ledger"

    def stats(self, worker: str) -> Path:
        return self.path / f"{worker}.stats.json"

    def log(self, worker: str) -> Path:
        return self.path / f"{worker}.log"

    @property
    def spark(self) -> Path:
        return self.path / "spark"


def make_order(seq: int, *, now: datetime.datetime | None = None) -> dict[str, Any]:
    """Order number ``seq``: deterministic content, in the Avro form of eoguard.example.Order."""
    when = now or datetime.datetime.now(datetime.timezone.utc)
    qty = 1 + seq % 4
    price = decimal.Decimal(5 + seq % 50) + decimal.Decimal("0.99")
    return {
        "order_id": f"order-{seq:07d}",
        "customer": f"customer-{seq % 997:04d}",
        "amount": (price * qty).quantize(decimal.Decimal("0.01")),
        "currency": _CURRENCIES[seq % len(_CURRENCIES)],
        "items": [{"sku": f"sku-{seq % 31:03d}", "qty": qty, "unit_price": float(price)}],
        "created_at": when,
        "express": seq % 7 == 0,
        "attributes": {"channel": "web" if seq % 3 else "app"},
        "note": None if seq % 5 else f"note for order {seq}",
    }


def spark_available() -> tuple[bool, str]:
    """Whether the Spark job can run here, and why not."""
    if importlib.util.find_spec("eoguard_spark") is None:
        return False, "the Spark job is not installed (pip install ./connectors/spark: eoguard-spark)"
    if importlib.util.find_spec("pyspark") is None:
        return False, "pyspark is not installed (pip install ./connectors/spark)"
    if importlib.util.find_spec("pyarrow") is None:
        return False, "pyarrow is not installed"
    return True, "available"
