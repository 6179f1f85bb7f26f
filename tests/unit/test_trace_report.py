"""The trace report's arithmetic: stages add up to end to end, the tail is picked by rank, a
Redis stall is matched to the messages whose time it overlaps, the report fits 100 columns."""

from __future__ import annotations

import os

import pytest

from bench.trace_report import (
    SPANS,
    SchedStat,
    TracedRun,
    attribute,
    render,
    render_sched,
    render_stalls,
    report,
    spans_ns,
    stall_ms,
    tail,
    tasks,
)
from eoguard.consumer.trace import TraceRecord

MS = 1_000_000
T0_MS = 1_700_000_000_000  # an epoch ms on a whole second


def record(mid: str, e2e_ms: int, *, created_ms: int = T0_MS, slow: int = 3) -> TraceRecord:
    """A message created at ``created_ms``, read 1 ms later, each stage 1 ms after the last,
    except stage ``slow`` (an index of the seven stamps' gaps), which takes the rest."""
    gaps = [1] * 7
    gaps[slow] = e2e_ms - 6
    stamps, at = [], created_ms * MS
    for gap in gaps:
        at += gap * MS
        stamps.append(at)
    return TraceRecord(mid, created_ms, *stamps)


def test_the_stages_add_up_to_end_to_end_from_the_due_time() -> None:
    rec = record("a", 40, slow=2)
    due = (T0_MS - 5) * MS  # the sender sent it 5 ms late
    spans = spans_ns(rec, due)
    assert spans == [5 * MS, MS, MS, 34 * MS, MS, MS, MS, MS]
    assert sum(s for s in spans if s is not None) == rec.committed_ns - due
    assert spans_ns(rec)[0] is None  # no due time: no sender lag
    assert sum(s for s in spans_ns(rec)[1:] if s is not None) == 40 * MS


def test_the_tail_rows_pick_by_rank_and_average_what_is_past_it() -> None:
    # 1,000 messages, message k taking 10 + k ms: the one at rank int(n * q) is the p-message.
    records = [record(f"m{k}", 10 + k) for k in range(1000)]
    rows = {row.label: row for row in attribute(records[::-1])}  # order does not matter
    assert rows["p50"].e2e_ms == 510
    assert rows["p99"].e2e_ms == 1000
    assert rows["p999"].e2e_ms == 1009
    assert rows["slowest"].e2e_ms == 1009
    past_p99 = rows[">= p99 mean"]
    assert past_p99.n == 10
    assert past_p99.e2e_ms == pytest.approx(sum(10 + k for k in range(990, 1000)) / 10)
    # Every row's stages add up to its end to end; the slow stage carries the tail.
    for row in rows.values():
        assert row.spans_ms[0] is None  # no due times given
        assert sum(s for s in row.spans_ms if s is not None) == pytest.approx(row.e2e_ms)
    assert past_p99.spans_ms[SPANS.index("cl>hand")] == pytest.approx(past_p99.e2e_ms - 6)


def test_with_due_times_messages_without_one_are_left_out() -> None:
    fast, slow, warm_up = record("fast", 10), record("slow", 30), record("warm", 900)
    due = {"fast": T0_MS * MS, "slow": (T0_MS - 20) * MS}
    ranked = tail([warm_up, slow, fast], due)
    assert [(e // MS, r.message_id) for e, r in ranked] == [(10, "fast"), (50, "slow")]
    slowest = attribute([warm_up, slow, fast], due)[-1]
    assert slowest.e2e_ms == 50
    assert slowest.spans_ms[0] == 20  # due -> produce: the sender's lag


def test_a_redis_stall_counts_for_the_messages_whose_time_it_overlaps() -> None:
    rec = record("a", 100)  # in the consumer from T0 + 1 ms to T0 + 100 ms
    second = T0_MS // 1000
    assert stall_ms(rec, {"aof-fsync-always": [(second, 45)]}) == 45  # during it
    assert stall_ms(rec, {"fork": [(second + 1, 30)]}) == 0  # stamped a second later, 30 ms long
    assert stall_ms(rec, {"fork": [(second + 1, 950)]}) == 950  # a long one reaches back
    assert stall_ms(rec, {"fork": [(second - 1, 20)]}) == 0  # over before it was read
    assert stall_ms(rec, {"a": [(second, 21)], "b": [(second, 60)]}) == 60


def test_the_report_fits_100_columns_indented_by_4() -> None:
    records = [record(f"m{k}", 10 + k, slow=k % 7) for k in range(2000)]
    due = {r.message_id: r.created_at_ms * MS - 123_456_789 for r in records}
    second = T0_MS // 1000
    history = {"aof-fsync-always": [(second + k, 20 + k) for k in range(40)],
               "fork": [(second, 123)]}
    sched = SchedStat(cpu_ns=2_300_000_000, wait_ns=410_000_000, main_cpu_ns=1_900_000_000,
                      main_wait_ns=300_000_000)
    latest = ", ".join(f"{event} max {ms} ms" for event, ms in [
        ("aof-write", 41), ("fast-command", 32), ("aof-write-alone", 41),
        ("aof-fsync-always", 59), ("command", 577), ("fork", 123)])
    lines = report(TracedRun(records, due, sched, 3.2), latest, history)
    print("\n".join(lines))
    assert max(len(line) for line in lines) <= 96, lines
    assert all(part in "\n".join(lines) for part in latest.split(", "))
    assert " 20ms@+0s 21ms@+1s" in "\n".join(lines)
    assert lines[0].startswith("trace: 2,000 messages")
    assert len(render(attribute(records, due))) == 7  # the heading and six rows
    assert "cpu 2.30 s (72% of a core), run-queue wait 0.41 s" in render_sched(sched, 3.2)[0]
    assert render_stalls("", {}, 0)[0].endswith("no event over the threshold")
    assert attribute([]) == []


def test_cpu_and_run_queue_wait_count_each_thread_from_when_it_was_seen() -> None:
    main = os.getpid()
    start = {main: (100, 50), 7: (10, 5)}  # thread 7 ends before the end is read
    end = {main: (300, 80), 8: (40, 4)}  # thread 8 began meanwhile
    assert SchedStat.between(start, end) == SchedStat(cpu_ns=240, wait_ns=34, main_cpu_ns=200,
                                                      main_wait_ns=30)
    now = tasks()
    assert main in now
    assert all(cpu >= 0 and wait >= 0 for cpu, wait in now.values())
