"""The demo's report and the invariants it checks (docs/design.md §10)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from itertools import pairwise
from typing import Any


@dataclass
class ScopeResult:
    """How one consumer scope fared; ``lost`` and ``handled_twice`` must be 0."""

    scope: str
    engine: str  # "GuardedConsumer" or "Spark"
    handled: int  # distinct messages handled
    guaranteed_handled: int
    lost: int  # guaranteed, unexpired, not handled
    handled_twice: int  # messages whose committed effect exists more than once
    expired_handled: int  # expired messages that reached the handler
    duplicates_dropped: int | None = None
    expired_dropped: int | None = None
    dead_lettered: int | None = None
    lost_sample: list[str] = field(default_factory=list)
    twice_sample: list[str] = field(default_factory=list)


@dataclass
class DelayedRun:
    """The delayed-mode producer p2 over its run: one row per 250 ms sample."""

    sent: int
    persisted: int  # written to the Redis outbox: not acknowledged within the delay
    avoided: int  # acknowledged by Kafka within the delay: never written to Redis
    seconds: list[float]
    delay_ms: list[float]
    avoided_per_sample: list[int]  # writes avoided since the previous sample

    @property
    def avoided_share(self) -> float:
        return self.avoided / max(self.avoided + self.persisted, 1)


def delayed_run(stats: Mapping[str, Any]) -> DelayedRun | None:
    """p2's figures from its stats dump, or None if it wrote no series."""
    rows = stats.get("series")
    if not rows:
        return None
    avoided = [int(r[3]) for r in rows]
    return DelayedRun(sent=int(stats.get("sent", 0)), persisted=int(stats.get("persisted", 0)),
                      avoided=int(stats.get("redis_writes_avoided", 0)),
                      seconds=[float(r[0]) for r in rows], delay_ms=[float(r[4]) for r in rows],
                      avoided_per_sample=[b - a for a, b in pairwise([0, *avoided])])


BARS = "▁▂▃▄▅▆▇█"


def sparkline(values: Sequence[float], width: int = 60) -> str:
    """``values`` as one line of block characters, averaged into at most ``width`` cells."""
    if not values:
        return ""
    step = max(1, -(-len(values) // width))
    cells = [sum(values[i:i + step]) / len(values[i:i + step]) for i in range(0, len(values), step)]
    top = max(cells)
    if top <= 0:
        return BARS[0] * len(cells)
    return "".join(BARS[min(len(BARS) - 1, int(v / top * (len(BARS) - 1) + 0.5))] for v in cells)


@dataclass
class DemoReport:
    """Everything ``eoguard-dev demo`` prints; ``failures`` lists each broken invariant."""

    run_id: str
    topic: str
    prefix: str
    messages: int
    sent: int = 0
    guaranteed: int = 0
    failed: int = 0
    producer_killed_after: int | None = None  # guaranteed count when SIGKILLed
    consumer_killed_after: int | None = None  # handled count when SIGKILLed
    duplicates_injected: int = 0  # the same envelope produced a second time on purpose
    resent_by_recovery: int = 0
    expired_injected: int = 0
    malformed_injected: int = 0
    malformed_dead_lettered: int = 0
    dead_lettered: int = 0  # distinct source records on the dead-letter topic
    scopes: list[ScopeResult] = field(default_factory=list)
    spark: str = "off"
    delayed: DelayedRun | None = None
    elapsed_s: float = 0.0
    failures: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.failures

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "ok": self.ok}


def scope_result(*, scope: str, engine: str, counts: Mapping[str, int], guaranteed: set[str],
                 expired_ids: Iterable[str], late: int = 0) -> ScopeResult:
    """Compare what a scope committed (id -> count) with what the producers guaranteed."""
    lost = sorted(guaranteed - counts.keys())
    twice = sorted(i for i, n in counts.items() if n > 1)
    expired_handled = sum(1 for i in expired_ids if i in counts) + late
    return ScopeResult(scope=scope, engine=engine, handled=len(counts),
                       guaranteed_handled=len(guaranteed & counts.keys()), lost=len(lost),
                       handled_twice=len(twice), expired_handled=expired_handled,
                       lost_sample=lost[:5], twice_sample=twice[:5])


def check(report: DemoReport, malformed_positions: Iterable[tuple[int, int]],
          dead_positions: Iterable[tuple[int, int]]) -> None:
    """Fill ``report.failures`` from docs/design.md §10's invariants."""
    for s in report.scopes:
        if s.lost:
            report.failures.append(f"{s.scope}: {s.lost} guaranteed message(s) lost, e.g. {s.lost_sample}")
        if s.handled_twice:
            report.failures.append(f"{s.scope}: {s.handled_twice} message(s) handled twice, "
                                   f"e.g. {s.twice_sample}")
        if s.expired_handled:
            report.failures.append(f"{s.scope}: {s.expired_handled} expired message(s) handled")
    missing = set(malformed_positions) - set(dead_positions)
    if missing:
        report.failures.append(f"{len(missing)} malformed record(s) not on the dead-letter topic: "
                               f"{sorted(missing)[:5]}")
    if report.guaranteed == 0:
        report.failures.append("no message was guaranteed: the producers did not run")


def render(report: DemoReport) -> list[Any]:
    """Rich renderables: the summary and one row per scope."""
    from rich.table import Table  # noqa: PLC0415 - only the demo's report renders tables

    summary = Table(title=f"eoguard demo {report.run_id}", title_justify="left", show_header=False)
    summary.add_column("what", style="bold")
    summary.add_column("count", justify="right")
    rows: list[tuple[str, Any]] = [
        ("topic", report.topic),
        ("Redis key prefix", report.prefix),
        ("orders sent", report.sent),
        ("guaranteed (on_guaranteed fired)", report.guaranteed),
        ("failed (on_failed fired)", report.failed),
        ("not yet guaranteed when p1 died (the app's)", report.sent - report.guaranteed - report.failed),
        ("first producer SIGKILLed after guaranteed", report.producer_killed_after),
        ("resent by the new producer's recovery", report.resent_by_recovery),
        ("duplicates injected (same envelope twice)", report.duplicates_injected),
        ("expired injected (TTL already passed)", report.expired_injected),
        ("malformed records injected", report.malformed_injected),
        ("  of them on the dead-letter topic", report.malformed_dead_lettered),
        ("dead-lettered (distinct records)", report.dead_lettered),
        ("first consumer SIGKILLed after handled", report.consumer_killed_after),
        ("Spark job", report.spark),
        ("elapsed", f"{report.elapsed_s:.1f} s"),
    ]
    for name, value in rows:
        text = "-" if value is None else f"{value:,}" if isinstance(value, int) else str(value)
        summary.add_row(name, text)
    scopes = Table(title="per consumer scope", title_justify="left")
    scopes.add_column("", style="bold")
    for s in report.scopes:
        scopes.add_column(f"{s.scope} ({s.engine})", justify="right")

    def num(v: int | None) -> str:
        return "-" if v is None else f"{v:,}"

    def bad(v: int) -> str:
        return f"[bold red]{v:,}[/]" if v else f"[green]{v}[/]"

    for label, cells in (
        ("handled", [num(s.handled) for s in report.scopes]),
        ("duplicates dropped (incl. redeliveries)", [num(s.duplicates_dropped) for s in report.scopes]),
        ("expired dropped", [num(s.expired_dropped) for s in report.scopes]),
        ("dead-lettered", [num(s.dead_lettered) for s in report.scopes]),
        ("lost (must be 0)", [bad(s.lost) for s in report.scopes]),
        ("handled twice (must be 0)", [bad(s.handled_twice) for s in report.scopes]),
        ("expired handled (must be 0)", [bad(s.expired_handled) for s in report.scopes]),
    ):
        scopes.add_row(label, *cells)
    parts: list[Any] = [summary, scopes]
    if report.delayed is not None:
        parts.append(render_delayed(report.delayed))
    verdict = ("[bold green]every invariant holds: nothing lost, nothing handled twice, "
               "no expired message handled, every malformed record dead-lettered[/]"
               if report.ok else "[bold red]INVARIANTS BROKEN:[/]\n  " + "\n  ".join(report.failures))
    return [*parts, verdict]


def render_delayed(run: DelayedRun) -> Any:
    """p2's adaptive delay and the Redis writes it avoided, as sparklines over its run."""
    from rich.table import Table  # noqa: PLC0415

    table = Table(title=f"p2, delayed mode: {run.avoided:,} of {run.avoided + run.persisted:,} "
                        f"messages ({run.avoided_share:.1%}) acked within the delay, never "
                        f"written to Redis", title_justify="left")
    table.add_column(f"over {run.seconds[-1]:.0f} s, every 250 ms", style="bold")
    table.add_column("chart")
    table.add_column("min / median / max", justify="right")
    for label, values, unit in (("adaptive delay", run.delay_ms, " ms"),
                                ("Redis writes avoided", run.avoided_per_sample, "")):
        ordered = sorted(values)
        table.add_row(label, sparkline(values),
                      f"{ordered[0]:,.0f} / {ordered[len(ordered) // 2]:,.0f} / {ordered[-1]:,.0f}{unit}")
    return table
