"""The producer's ledger follows the state table in its docstring, exactly.

The table is read from ``eoguard.producer.ledger.__doc__``; then, per mode, every stage is
reached from NEW along legal transitions and every event is applied to it through the
ledger's own methods: a legal one leads to the stage, room and handle state the table gives,
any other raises StageError.
"""

from __future__ import annotations

import math
import re
import threading
from collections import deque
from collections.abc import Callable, Iterator

import pytest

from eoguard.envelope import now_ms
from eoguard.errors import BackpressureError, BrokerError, StateError
from eoguard.modes import KeepUntil
from eoguard.producer import ledger as ledger_module
from eoguard.producer.callbacks import CallbackDispatcher
from eoguard.producer.ledger import Ledger
from eoguard.producer.messages import MessageState, PendingMessage, Stage, StageError

EVENTS = {
    "persist-first": ("send", "take", "written", "found", "expired", "write_failed", "expire",
                      "produced", "acked", "refused", "unavailable", "close"),
    "delayed": ("send", "withdraw", "take", "written", "found", "expired", "write_failed",
                "expire", "acked", "refused", "unavailable", "close"),
}
STAYS = "="
_ROW = re.compile(r"^    ([A-Z_]+) +([x.?-]) +([x.?-]) +([x.?-]) +([x.?-]) +([x.?-]) +([x.?-]) +"
                  r"(accepted|guaranteed|failed) +(.*)$")
_EVENTS_FROM = re.compile(r"([a-z_]+(?:, [a-z_]+)*): ([A-Z_]+(?:, +[A-Z_]+)*)")


class Table:
    """The docstring's table: per stage its room and handle columns, per mode its stages, and
    per (mode, stage, event) the next stage (STAYS when it stays)."""

    def __init__(self, doc: str) -> None:
        lines = doc.split("\n")
        start = next(i for i, line in enumerate(lines) if line.strip().startswith("stage "))
        blocks: list[list[Stage]] = [[]]
        reached: dict[Stage, str] = {}
        self.room: dict[Stage, bool] = {}
        self.handle: dict[Stage, MessageState] = {}
        last: Stage | None = None
        for line in lines[start + 1:]:
            if not line.strip():
                if not blocks[-1]:
                    break
                blocks.append([])
                continue
            row = _ROW.match(line)
            if row is None:
                if last is None or not line.startswith(" " * 20):
                    break
                reached[last] += " " + line.strip()
                continue
            last = Stage[row[1]]
            blocks[-1].append(last)
            self.room[last] = row[6] == "x"
            self.handle[last] = MessageState(row[8])
            reached[last] = row[9]
        blocks = [b for b in blocks if b]
        assert len(blocks) == 4, "blocks: both modes, persist-first, delayed, both"
        both = {*blocks[0], *blocks[3]}
        self.stages = {"persist-first": both | set(blocks[1]), "delayed": both | set(blocks[2])}
        into = [(src, event, dst) for dst, text in reached.items()
                for event, src in self._pairs(text)]
        stays_block = doc[doc.index("stays as it is"):].split("::", 1)[1].split("\n\n")[1]
        stays = list(self._pairs(stays_block))
        self.next: dict[tuple[str, Stage, str], Stage | str] = {}
        for mode, stages in self.stages.items():
            for src, event, dst in into:
                if src in stages and dst in stages:
                    assert (mode, src, event) not in self.next, (mode, src, event)
                    self.next[mode, src, event] = dst
            for event, src in stays:
                if src in stages:
                    assert (mode, src, event) not in self.next, (mode, src, event)
                    self.next[mode, src, event] = STAYS

    @staticmethod
    def _pairs(text: str) -> Iterator[tuple[str, Stage]]:
        for events, stages in _EVENTS_FROM.findall(text):
            for event in events.split(", "):
                for name in re.split(r",\s+", stages):
                    yield event, Stage[name]


TABLE = Table(ledger_module.__doc__ or "")


@pytest.fixture(scope="module")
def dispatcher() -> Iterator[CallbackDispatcher]:
    d = CallbackDispatcher(threading.Condition(), name="test-ledger-callbacks")
    yield d
    d.close(5)


def message(n: int = 0) -> PendingMessage:
    return PendingMessage(f"00000000-0000-7000-8000-{n:012d}", "t", 2**62, threading.Condition(),
                          key=None, value=b"v" * 10, created_at_ms=0, created_mono=0.0,
                          on_guaranteed=None, on_failed=None, sink=lambda report: None)


def full() -> BackpressureError:
    return BackpressureError("full")


def in_line(ledger: Ledger, msg: PendingMessage) -> None:
    """Put ``msg`` in the line if a legal path did not leave it there (take, expire and close
    only see messages in the line; this is how a message of any stage meets them)."""
    if not any(m is msg for m in ledger._line):
        ledger._line.append(msg)


def apply(ledger: Ledger, msg: PendingMessage, event: str) -> None:
    """The ledger call that applies ``event`` to ``msg`` alone."""
    calls: dict[str, Callable[[], object]] = {
        "send": lambda: ledger.send(msg, 1.0, full, lambda m: None),
        "withdraw": lambda: ledger.withdraw(msg),
        "take": lambda: (in_line(ledger, msg), ledger.take_write(
            limit=10, cutoff_mono=math.inf, backing_off=False, closing=False)),
        "written": lambda: ledger.written([msg], marks_done=0, expired=set(), existing=set()),
        "found": lambda: ledger.written([msg], marks_done=0, expired=set(), existing={id(msg)}),
        "expired": lambda: ledger.written([msg], marks_done=0, expired={msg.id}, existing=set()),
        "write_failed": lambda: ledger.write_failed([msg], [], [], now_ms=now_ms()),
        "expire": lambda: (in_line(ledger, msg), setattr(msg, "expires_at_ms", 0),
                           ledger.expire_waiting(now_ms())),
        "close": lambda: (in_line(ledger, msg), ledger.fail_waiting()),
        "produced": lambda: ledger.produced([msg]),
        "acked": lambda: ledger.acked([msg], []),
        "refused": lambda: ledger.delivery_failed([(msg, BrokerError("refused"), False)], []),
        "unavailable": lambda: ledger.delivery_failed([(msg, BrokerError("down"), True)], []),
    }
    calls[event]()


def path_to(mode: str, stage: Stage) -> list[str]:
    """Events leading from NEW to ``stage`` along legal transitions (breadth first)."""
    paths: dict[Stage, list[str]] = {Stage.NEW: []}
    todo = deque([Stage.NEW])
    while todo:
        src = todo.popleft()
        for event in EVENTS[mode]:
            dst = TABLE.next.get((mode, src, event))
            if isinstance(dst, Stage) and dst not in paths:
                paths[dst] = [*paths[src], event]
                todo.append(dst)
    return paths[stage]


def reach(mode: str, stage: Stage, dispatcher: CallbackDispatcher) -> tuple[Ledger, PendingMessage]:
    ledger = Ledger(delayed=mode == "delayed", max_messages=10, max_bytes=1000,
                    dispatcher=dispatcher)
    msg = message()
    for event in path_to(mode, stage):
        apply(ledger, msg, event)
    assert msg.stage is stage
    return ledger, msg


CASES = [(mode, stage, event) for mode, stages in TABLE.stages.items()
         for stage in sorted(stages, key=list(Stage).index) for event in EVENTS[mode]]


@pytest.mark.parametrize(("mode", "stage", "event"), CASES,
                         ids=[f"{m}-{s.name}-{e}" for m, s, e in CASES])
def test_every_event_from_every_stage_does_what_the_table_says(
        mode: str, stage: Stage, event: str, dispatcher: CallbackDispatcher) -> None:
    ledger, msg = reach(mode, stage, dispatcher)
    expected = TABLE.next.get((mode, stage, event))
    if expected is None:
        with pytest.raises(StageError) as caught:
            apply(ledger, msg, event)
        assert (caught.value.stage, caught.value.event) == (stage, event)
        return
    apply(ledger, msg, event)
    after = stage if expected == STAYS else expected
    assert msg.stage is after
    assert msg.state is TABLE.handle[after]
    assert ledger.backlog()[0] == (1 if TABLE.room[after] else 0)  # the room column
    assert (msg.value == b"") is not TABLE.room[after] or after is Stage.NEW


def test_the_table_covers_every_stage_and_every_stage_is_reachable() -> None:
    assert set(TABLE.room) == set(Stage)
    for mode, stages in TABLE.stages.items():
        for stage in stages:
            path_to(mode, stage)  # raises KeyError when unreachable


def test_stage_names_bound_for_the_hot_path_are_the_members() -> None:
    for stage in Stage:
        assert getattr(ledger_module, f"_{stage.name}") is stage
    assert issubclass(StageError, StateError)


def test_a_delayed_send_librdkafka_refuses_is_withdrawn_and_its_room_given_back(
        dispatcher: CallbackDispatcher) -> None:
    ledger = Ledger(delayed=True, max_messages=10, max_bytes=1000, dispatcher=dispatcher)
    msg = message()

    def refuse(m: PendingMessage) -> None:
        raise BrokerError("refused at once")

    with pytest.raises(BrokerError):
        ledger.send(msg, 1.0, full, refuse)
    assert msg.stage is Stage.WITHDRAWN
    assert ledger.backlog() == (0, 0)
    assert ledger.snapshot()[0].sent == 0


def test_acknowledged_while_its_write_is_in_flight_is_marked_once_the_write_lands(
        dispatcher: CallbackDispatcher) -> None:
    """The delayed rule once split over deliveries and the writer: no write avoided, its
    publish mark queued when the write succeeds; if that write fails, no rewrite."""
    ledger = Ledger(delayed=True, max_messages=10, max_bytes=1000, dispatcher=dispatcher)
    landed, failed = message(1), message(2)
    for msg in (landed, failed):
        ledger.send(msg, 1.0, full, lambda m: None)
    batch, _, _ = ledger.take_write(limit=10, cutoff_mono=math.inf, backing_off=False,
                                    closing=False)
    ledger.acked(batch, [("resent-id", KeepUntil.CONSUMED)])
    assert [m.stage for m in batch] == [Stage.ACKED_WRITING] * 2
    assert all(m.state is MessageState.GUARANTEED for m in batch)
    assert ledger.take_marks() == ([], [("resent-id", KeepUntil.CONSUMED)])
    ledger.written([landed], marks_done=1, expired=set(), existing=set())
    ledger.write_failed([failed], [], [], now_ms=now_ms())
    assert (landed.stage, failed.stage) == (Stage.PUBLISHED, Stage.ACKED)
    assert ledger.take_marks() == ([landed.id], [])
    assert ledger.take_write(limit=10, cutoff_mono=math.inf, backing_off=False,
                             closing=False) == ([], [], [])  # nothing to rewrite
    counters = ledger.snapshot()[0]
    assert (counters.redis_writes_avoided, counters.persisted, counters.guaranteed) == (1, 1, 2)
    assert ledger.outstanding() == 1  # the landed one's mark, taken and not yet written


def test_an_ack_served_before_the_flusher_saw_librdkafka_take_the_message(
        dispatcher: CallbackDispatcher) -> None:
    """persist-first: the poll thread may settle a delivery report between produce_each
    handing the message over and the flusher's produced(); the message holds its room until
    then (found by the producer benchmark, not by the integration tests)."""
    ledger = Ledger(delayed=False, max_messages=10, max_bytes=1000, dispatcher=dispatcher)
    msg = message()
    ledger.send(msg, 1.0, full, lambda m: None)
    batch, _, _ = ledger.take_write(limit=10, cutoff_mono=math.inf, backing_off=False,
                                    closing=False)
    assert ledger.written(batch, marks_done=0, expired=set(), existing=set()) == [msg]
    ledger.acked([msg], [])
    assert (msg.stage, ledger.backlog()[0]) == (Stage.ACKED_STORED, 1)
    assert ledger.take_marks() == ([msg.id], [])
    ledger.produced([msg])
    assert (msg.stage, ledger.backlog()) == (Stage.PUBLISHED, (0, 0))
