"""The demo's ledger view: what counts as sent when a SIGKILL cut a send's lines short."""

from __future__ import annotations

from pathlib import Path

from eoguard.demo.observe import LedgerView


def test_a_send_guaranteed_before_its_sent_line_counts_as_sent(tmp_path: Path) -> None:
    ledger = tmp_path / "p1.ledger"
    # Order 2 was guaranteed by the callback, then the kill came before its "S" line.
    ledger.write_text("S 0 a\nG a\nS 1 b\nG c\n")
    view = LedgerView(ledger).poll()
    assert view.sent_ids == {"a", "b", "c"}
    assert view.max_seq == 1
    assert view.next_seq == 3


def test_next_seq_follows_the_last_sent_line_when_none_is_missing(tmp_path: Path) -> None:
    ledger = tmp_path / "p1.ledger"
    ledger.write_text("S 0 a\nG a\nS 1 b\nF b BrokerError\nS 2 c\n")
    view = LedgerView(ledger).poll()
    assert view.sent_ids == {"a", "b", "c"}
    assert view.next_seq == 3
    assert LedgerView(tmp_path / "absent").poll().next_seq == 0
