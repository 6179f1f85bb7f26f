"""Runs the application's on_guaranteed / on_failed callbacks on eoguard's own thread.

Callbacks are queued in batches by the threads that settle messages (after they released
their locks) and run here one by one, in order. A callback that raises, or returns an
awaitable (closed unrun: eoguard never awaits one), is logged and the next one runs: an
application bug never stops delivery, nor changes a message's guarantee.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable, Sequence

from eoguard.callbacks import awaitable_refused
from eoguard.errors import EoguardError
from eoguard.producer.messages import PendingMessage

__all__ = ["CallbackDispatcher"]

log = logging.getLogger(__name__)

Settled = tuple[PendingMessage, EoguardError | None]
"""A message whose handle was just settled; the error is None when it was guaranteed."""


class CallbackDispatcher:
    """One daemon thread that runs callbacks of settled messages, then wakes handle waiters."""

    def __init__(self, done: threading.Condition, name: str = "eoguard-callbacks") -> None:
        self._done = done
        self._queue: queue.SimpleQueue[Sequence[Settled] | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()
        self.errors = 0

    def submit(self, settled: Sequence[Settled], *, wake: bool = False) -> None:
        """Queue a batch of settled messages (cheap: one queue put per batch).

        ``wake``: messages were settled without a callback to run; wake handle waiters (on
        the calling thread when nothing is queued: no callback to run first).
        """
        if settled:
            self._queue.put(settled)
        elif wake:
            with self._done:
                self._done.notify_all()

    def close(self, timeout_s: float | None = None) -> None:
        """Run what is queued, then stop the thread."""
        self._queue.put(None)
        self._thread.join(timeout_s)

    def _run(self) -> None:
        while True:
            batch = self._queue.get()
            if batch is None:
                return
            for msg, error in batch:
                # Typed to return object: what it returns is looked at (an awaitable is refused).
                guaranteed: Callable[[PendingMessage], object] | None = msg.on_guaranteed
                failed: Callable[[PendingMessage, EoguardError], object] | None = msg.on_failed
                returned: object = None
                try:
                    if error is None:
                        if guaranteed is not None:
                            returned = guaranteed(msg)
                    elif failed is not None:
                        returned = failed(msg, error)
                except Exception:  # an application callback must not stop delivery
                    self.errors += 1
                    log.exception("a callback of message %s raised; ignored", msg.id)
                    continue
                if returned is not None:
                    refused = awaitable_refused(
                        returned, "on_guaranteed" if error is None else "on_failed")
                    if refused is not None:
                        self.errors += 1
                        log.error("a callback of message %s: %s", msg.id, refused)
            with self._done:
                self._done.notify_all()
