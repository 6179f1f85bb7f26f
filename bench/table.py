"""The table ``python -m bench`` prints: every path beside its baseline, and the machine.

Each suite adds a :class:`Row` per path it measured (and keeps printing its own detail);
``python -m bench`` prints the rows of every suite it ran within 100 columns (a table of
rates, one of latencies, then each suite's baseline and notes) and, with ``--json``, writes
them with the machine and the versions to a file, so two runs can be compared.
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import statistics
import subprocess
from collections.abc import Callable
from dataclasses import asdict, dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

from rich import box
from rich.console import Console
from rich.markup import escape
from rich.table import Table

__all__ = ["ROWS", "WIDTH", "Row", "add", "machine", "render", "write_json"]


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


WIDTH = 100
"""Columns the tables fit in, so a terminal of that width shows them unwrapped."""


def _ms(pair: tuple[float, float] | None) -> str:
    return "" if pair is None else f"{pair[0]:.1f} / {pair[1]:.1f}"


def _num(value: float | None, fmt: str) -> str:
    return "" if value is None else format(value, fmt)


def _table(title: str, caption: str, columns: list[tuple[str, str]], rows: list[Row],
           cells: Callable[[Row], list[str]]) -> Table:
    """A table of ``rows`` grouped by suite: a section per suite, headed by its name."""
    table = Table(title=title, title_justify="left", caption=caption, caption_justify="left",
                  box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False)
    table.add_column("path", overflow="fold")
    for name, justify in columns:
        table.add_column(name, justify=justify)  # type: ignore[arg-type]
    for suite in _suites(rows):
        table.add_row(f"[bold]{escape(suite)}[/]")
        for r in rows:
            if r.suite == suite:
                table.add_row(f"  {escape(r.path)}", *cells(r))
        table.add_section()
    return table


def _suites(rows: list[Row]) -> list[str]:
    return list(dict.fromkeys(r.suite for r in rows))


def _rates(row: Row, rows: list[Row]) -> list[str]:
    x = ratio(row, rows)
    return [_num(min(row.rates), ",.0f"), _num(row.median, ",.0f"),
            "" if x is None else f"{x:.2f}x", _num(row.cpu_us, ".1f"),
            _num(row.redis_cpu_us, ".1f"), _num(row.redis_writes, ".3f")]


def render(rows: list[Row], info: dict[str, Any], *, console: Console | None = None) -> None:
    """Print ``rows`` within :data:`WIDTH` columns: the machine, then the rates (each path
    beside its suite's baseline), then the latencies, then per suite its baseline and notes."""
    out = console or Console(width=WIDTH)
    out.print(", ".join(f"{k} {v}" for k, v in info.items()), highlight=False)
    rated = [r for r in rows if r.rates]
    timed = [r for r in rows if r.guaranteed_ms is not None or r.e2e_ms is not None]
    if rated:
        out.print(_table(
            "Rates, msg/s",
            "x base: median over the suite's baseline's. Per message: cpu and redis, the CPU "
            "of this process and of the Redis server in us; writes, Redis writes.",
            [("min/s", "right"), ("median/s", "right"), ("x base", "right"), ("cpu", "right"),
             ("redis", "right"), ("writes", "right")],
            rated, lambda r: _rates(r, rows)))
    if timed:
        out.print(_table(
            "Latency, p50 / p99 ms", "",
            [("send -> guaranteed", "right"), ("produce -> handler", "right")],
            timed, lambda r: [_ms(r.guaranteed_ms), _ms(r.e2e_ms)]))
    for suite in _suites(rows):
        of_suite = [r for r in rows if r.suite == suite]
        bases = list(dict.fromkeys(r.baseline for r in of_suite
                                   if r.baseline and ratio(r, rows) is not None))
        notes = list(dict.fromkeys(r.note for r in of_suite if r.note))
        said = [f"x base: over {', '.join(bases)}"] if bases else []
        if said or notes:
            out.print(escape(f"{suite}: " + "; ".join(said + notes)), highlight=False)


def write_json(path: str, rows: list[Row], info: dict[str, Any]) -> None:
    """The table as JSON: ``{"machine": ..., "rows": [...]}``."""
    data = {"machine": info, "rows": [asdict(r) | {"median": r.median, "ratio": ratio(r, rows)}
                                      for r in rows]}
    Path(path).write_text(json.dumps(data, indent=2) + "\n")
