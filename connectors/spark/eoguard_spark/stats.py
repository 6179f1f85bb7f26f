"""What one micro-batch of the job did: :class:`BatchStats`, handed to ``on_batch``."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from eoguard_spark.decode import RowStatus

__all__ = ["BatchStats"]


@dataclass(slots=True)
class BatchStats:
    """What one micro-batch did. ``replayed``: its sinks had committed before a crash.

    The ``records_*`` counts are the batch's records (one per shard it claimed on) as the done
    mark found them: open (``records_done``: marked done now), done already (a replay whose
    done mark had landed), and open but past their lease by this host's clock
    (``records_lapsed``, counted in ``records_done`` too: claims of them may have been taken
    over by another reader, which then handles those messages too).
    """

    batch_id: int
    rows: dict[str, int] = field(default_factory=dict)  # RowStatus value -> count
    records_done: int = 0
    records_already_done: int = 0
    records_lapsed: int = 0
    lease_renewals: int = 0  # renewals of the batch's records by the driver while it ran
    acked: int = 0  # senders' outbox records acknowledged (0 when ack_deferred)
    ack_deferred: bool = False  # acknowledged in the background (eoguard_spark.acks): logged
    replayed: bool = False
    duration_s: float = 0.0
    # classify, sinks, settle, commit, dead letters, hook, done, ack (or ack wait: for the
    # previous batch's background pass): one after the other
    phases_s: dict[str, float] = field(default_factory=dict)

    @property
    def written(self) -> int:
        return sum(self.rows.get(s, 0) for s in RowStatus.to_output())

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        started = time.monotonic()
        try:
            yield
        finally:
            self.phases_s[name] = round(time.monotonic() - started, 3)
