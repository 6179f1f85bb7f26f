"""Where a traced GuardedConsumer's latency goes: its tail messages, stage by stage (issue 34).

``python -m bench.bench_latency --trace`` prints this report under each eoguard point. Its
rows are the p50, p99 and p999 messages by end-to-end latency (due -> committed for the
bench's messages, else produce -> committed; the bench's own figure stops at handled), the
mean over the messages at or past p99 and at or past p999, and the slowest; its columns split
that latency into stages, in ms, which add up to ``e2e``:

    due>prd   the sender's lag behind its open-loop schedule (when due times are known)
    prod>rd   the envelope's created_at -> out of Kafka (created_at is in whole ms: it and
              due>prd may be off by up to 1 ms, due>prd below 0)
    rd>cs     decoded, waiting for the next round trip, claims sent
    cs>cl     claims sent -> landed (read when the pipeline needs them: polls later)
    cl>hand   waiting for its turn, then the handler
    hand>ds   done marks built and sent
    ds>dl     done marks sent -> landed
    dl>com    retries, dead letters, offsets stored and the asynchronous commit sent
    stall     the longest Redis latency event that may have overlapped the message's time in
              the consumer (LATENCY HISTORY stamps whole seconds: a hint; mean rows: its mean)

Below it, Redis's latency monitor over the point (LATENCY LATEST and HISTORY) and the
consumer process's CPU and run-queue wait over the run (/proc/self/task/*/schedstat), from
the first warm-up message it saw to the last message (before it closed).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path

from bench.stats import rank
from eoguard.consumer.trace import TraceRecord

__all__ = ["SPANS", "Attribution", "SchedStat", "TracedRun", "attribute", "render",
           "render_sched", "render_stalls", "report", "spans_ns", "stall_ms", "tail", "tasks"]

SPANS = ("due>prd", "prod>rd", "rd>cs", "cs>cl", "cl>hand", "hand>ds", "ds>dl", "dl>com")
History = Mapping[str, Sequence[tuple[int, int]]]  # Redis event -> (epoch s, ms) samples
_MS = 1_000_000  # ns


def spans_ns(rec: TraceRecord, due_ns: int | None = None) -> list[int | None]:
    """The message's latency by stage (:data:`SPANS`), ns; due>prd is None without a due."""
    stamps = [rec.created_at_ms * _MS, *rec.stamps_ns()]
    lag = None if due_ns is None else stamps[0] - due_ns
    return [lag, *(b - a for a, b in pairwise(stamps))]


def tail(records: Sequence[TraceRecord], due: Mapping[str, int] | None = None
         ) -> list[tuple[int, TraceRecord]]:
    """(end-to-end ns, record), fastest first; end to end is from the due time when ``due``
    is given (records without one are left out: warm-up messages), else from created_at."""
    if due is None:
        return sorted(((r.committed_ns - r.created_at_ms * _MS, r) for r in records),
                      key=lambda pair: pair[0])
    return sorted(((r.committed_ns - due[r.message_id], r) for r in records
                   if r.message_id in due), key=lambda pair: pair[0])


def stall_ms(rec: TraceRecord, history: History) -> int:
    """The longest Redis latency event overlapping ``rec``'s time in the consumer (read ->
    committed). A sample stamped at second T is the worst event of that second: it ran
    within [T - its latency, T + 1)."""
    start, end = rec.read_ns, rec.committed_ns
    return max((ms for samples in history.values() for at_s, ms in samples
                if at_s * 1000 * _MS - ms * _MS <= end and start < (at_s + 1) * 1000 * _MS),
               default=0)


@dataclass(frozen=True)
class Attribution:
    """One row of the report: ``n`` messages' end to end and stages (ms), means for n > 1."""

    label: str
    n: int
    e2e_ms: float
    spans_ms: list[float | None]
    stall_ms: float


def _row(label: str, picked: Sequence[tuple[int, TraceRecord]],
         due: Mapping[str, int] | None, history: History) -> Attribution:
    n = len(picked)
    per = [spans_ns(r, None if due is None else due[r.message_id]) for _, r in picked]
    spans: list[float | None] = []
    for i in range(len(SPANS)):
        known = [v for v in (s[i] for s in per) if v is not None]
        spans.append(sum(known) / n / _MS if len(known) == n else None)
    return Attribution(label, n, sum(e for e, _ in picked) / n / _MS, spans,
                       sum(stall_ms(r, history) for _, r in picked) / n)


def attribute(records: Sequence[TraceRecord], due: Mapping[str, int] | None = None,
              history: History | None = None) -> list[Attribution]:
    """The report's rows: the p50, p99 and p999 messages (rank ``int(n * q)``, as the
    bench's percentiles), the means at or past p99 and p999, and the slowest message."""
    ranked = tail(records, due)
    if not ranked:
        return []
    history = history or {}
    n = len(ranked)
    rows = [_row(f"p{label}", [ranked[rank(n, q)]], due, history)
            for label, q in (("50", 0.5), ("99", 0.99), ("999", 0.999))]
    rows += [_row(f">= p{label} mean", ranked[rank(n, q):], due, history)
             for label, q in (("99", 0.99), ("999", 0.999))]
    rows.append(_row("slowest", ranked[-1:], due, history))
    return rows


def render(rows: Sequence[Attribution]) -> list[str]:
    """The rows as a table of 96 columns."""
    head = f"{'ms':12s}{'n':>6s}{'e2e':>8s}" + "".join(f"{s:>8s}" for s in SPANS)
    lines = [head + f"{'stall':>6s}"]
    for row in rows:
        cells = "".join(f"{'-':>8s}" if v is None else f"{v:8.1f}" for v in row.spans_ms)
        lines.append(f"{row.label:12s}{row.n:6d}{row.e2e_ms:8.1f}{cells}{row.stall_ms:6.0f}")
    return lines


def render_stalls(latest: str, history: History, since_s: float, width: int = 100) -> list[str]:
    """Redis's latency monitor: LATEST as given (``event max N ms, ...``), then each event's
    HISTORY samples as ``ms@+s`` (seconds after ``since_s``), wrapped to ``width``."""
    lines = _wrap("Redis latency monitor:", (latest or "no event over the threshold").split(", "),
                  width, sep=", ")
    for event, samples in history.items():
        cells = [f"{ms}ms@{round(at_s - since_s):+d}s" for at_s, ms in samples]
        lines += _wrap(f"  {event}:", cells, width)
    return lines


def _wrap(head: str, cells: Sequence[str], width: int, sep: str = " ") -> list[str]:
    """``head`` then ``cells`` joined by ``sep``, continued under the first cell."""
    lines, line = [], head
    for i, cell in enumerate(cells):
        joined = f"{line}{sep if i else ' '}{cell}"
        if i and len(joined) > width:
            lines.append(line + sep.rstrip())
            joined = " " * (len(head) + 1) + cell
        line = joined
    return [*lines, line]


@dataclass(frozen=True)
class SchedStat:
    """What a process's threads used (ns): CPU and run-queue wait, summed over its threads,
    and its main thread's (the poll loop's) alone."""

    cpu_ns: int
    wait_ns: int
    main_cpu_ns: int
    main_wait_ns: int

    @classmethod
    def between(cls, start: Mapping[int, tuple[int, int]], end: Mapping[int, tuple[int, int]]
                ) -> SchedStat:
        """From two :func:`tasks` of this process: a thread counts from ``start`` or from
        when it began; one that ended before ``end`` is left out (read ``end`` before the
        clients close: librdkafka's threads end with them)."""
        used = {tid: (cpu - start.get(tid, (0, 0))[0], wait - start.get(tid, (0, 0))[1])
                for tid, (cpu, wait) in end.items()}
        main = used.get(os.getpid(), (0, 0))
        return cls(sum(cpu for cpu, _ in used.values()), sum(wait for _, wait in used.values()),
                   *main)


def tasks() -> dict[int, tuple[int, int]]:
    """This process's threads now: tid -> (CPU ns, run-queue wait ns), from
    /proc/self/task/*/schedstat (a thread that ends while it is read is left out)."""
    out = {}
    for task in Path("/proc/self/task").iterdir():
        try:
            cpu, wait, _ = (task / "schedstat").read_text().split()
        except (OSError, ValueError):
            continue
        out[int(task.name)] = (int(cpu), int(wait))
    return out


def render_sched(used: SchedStat, wall_s: float) -> list[str]:
    """CPU and run-queue wait over ``wall_s`` seconds: the process's, then the poll loop's."""
    def s(ns: int) -> str:
        return f"{ns / 1e9:.2f} s"
    return [f"consumer process over {wall_s:.1f} s: cpu {s(used.cpu_ns)} "
            f"({used.cpu_ns / 1e9 / wall_s:.0%} of a core), run-queue wait {s(used.wait_ns)}",
            f"  its poll loop (main thread): cpu {s(used.main_cpu_ns)}, "
            f"run-queue wait {s(used.main_wait_ns)}"]


@dataclass(frozen=True)
class TracedRun:
    """What a traced consumer process sends back: its trace, the due time (epoch ns) of each
    message it handled, and its scheduler counters over the run."""

    records: list[TraceRecord]
    due_ns: dict[str, int]
    sched: SchedStat
    wall_s: float


def report(run: TracedRun, latest: str, history: History) -> list[str]:
    """The whole report of one point, in 96 columns (the bench indents it by 4): the table,
    Redis's latency monitor, the CPU lines."""
    rows = attribute(run.records, run.due_ns, history)
    traced = sum(1 for r in run.records if r.message_id in run.due_ns)
    first_s = min(run.due_ns.values(), default=0) / 1e9
    return [f"trace: {traced:,} messages; e2e = due -> committed (the bench's latency stops "
            "at handled)",
            *render(rows), *render_stalls(latest, history, first_s, width=96),
            *render_sched(run.sched, run.wall_s)]
