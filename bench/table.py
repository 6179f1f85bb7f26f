"""The one table ``python -m bench`` prints: every path beside its baseline, and the machine.

Each suite adds a :class:`Row` per path it measured (and keeps printing its own detail);
``python -m bench`` prints the rows of every suite it ran in one table and, with ``--json``,
writes them with the machine and the versions to a file, so two runs can be compared.
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import statistics
import subprocess
from dataclasses import asdict, dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

__all__ = ["ROWS", "Row", "add", "machine", "render", "write_json"]


@dataclass
class Row:
    """One measured path. ``rates`` are msg/s (or rows/s) per interleaved round."""

    suite: str
    path: str
    rates: list[float]
    baseline: str | None = None  # the path of the same suite this one is compared with
    cpu_us: float | None = None  # this process's CPU per message, every thread
    redis_cpu_us: float | None = None  # the Redis server's CPU per message
    redis_writes: float | None = None  # Redis writes per message
    guaranteed_ms: tuple[float, float] | None = None  # send -> on_guaranteed p50, p99
    e2e_ms: tuple[float, float] | None = None  # produce -> handler p50, p99
    note: str = ""

    @property
    def median(self) -> float:
        return statistics.median(self.rates) if self.rates else float("nan")


ROWS: list[Row] = []


def add(row: Row) -> Row:
    """Record ``row`` for the table."""
    ROWS.append(row)
    return row


def ratio(row: Row, rows: list[Row]) -> float | None:
    """``row``'s median over its baseline's median (same suite), when both were measured."""
    base = next((r for r in rows if r.suite == row.suite and r.path == row.baseline), None)
    if base is None or not base.rates or not row.rates:
        return None
    return row.median / base.median


def _version(package: str) -> str:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "-"


def machine() -> dict[str, Any]:
    """Cores, CPU model and the versions that shape the figures."""
    model = "-"
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    redis_server = "-"
    with contextlib.suppress(OSError):  # on PATH once the stack installed it
        redis_server = subprocess.run(["redis-server", "--version"], capture_output=True,
                                      text=True, check=False, timeout=5).stdout.split(" sha=")[0]
    import confluent_kafka  # noqa: PLC0415 - only for its librdkafka version

    return {
        "cores": os.cpu_count(), "cpu": model, "python": platform.python_version(),
        "eoguard": _version("eoguard"), "confluent-kafka": _version("confluent-kafka"),
        "librdkafka": confluent_kafka.libversion()[0], "fastavro": _version("fastavro"),
        "redis-py": _version("redis"), "uuid-utils": _version("uuid-utils"),
        "pyspark": _version("pyspark"), "redis-server": redis_server,
    }


def _ms(pair: tuple[float, float] | None) -> str:
    return "" if pair is None else f"{pair[0]:.1f} / {pair[1]:.1f}"


def _num(value: float | None, fmt: str) -> str:
    return "" if value is None else format(value, fmt)


def render(rows: list[Row], info: dict[str, Any], *, console: Console | None = None) -> None:
    """Print ``rows`` as one table under a line describing the machine."""
    out = console or Console(width=200)
    out.print(", ".join(f"{k} {v}" for k, v in info.items()))
    table = Table(show_lines=False)
    for name, justify in (("suite", "left"), ("path", "left"), ("min/s", "right"),
                          ("median/s", "right"), ("ratio", "right"), ("vs", "left"),
                          ("cpu us/msg", "right"),
                          ("redis cpu us/msg", "right"), ("redis writes/msg", "right"),
                          ("guaranteed p50/p99 ms", "right"), ("e2e p50/p99 ms", "right"),
                          ("note", "left")):
        table.add_column(name, justify=justify)  # type: ignore[arg-type]
    for r in rows:
        table.add_row(
            r.suite, r.path, _num(min(r.rates), ",.0f") if r.rates else "",
            _num(r.median, ",.0f") if r.rates else "",
            f"{x:.2f}x" if (x := ratio(r, rows)) is not None else "",
            (r.baseline or "")[:24] if x is not None else "",
            _num(r.cpu_us, ".1f"), _num(r.redis_cpu_us, ".1f"), _num(r.redis_writes, ".3f"),
            _ms(r.guaranteed_ms), _ms(r.e2e_ms), r.note)
    out.print(table)


def write_json(path: str, rows: list[Row], info: dict[str, Any]) -> None:
    """The table as JSON: ``{"machine": ..., "rows": [...]}``."""
    data = {"machine": info, "rows": [asdict(r) | {"median": r.median, "ratio": ratio(r, rows)}
                                      for r in rows]}
    Path(path).write_text(json.dumps(data, indent=2) + "\n")
