"""Typed bindings of eoguard's Lua scripts: one class per script (``lua/<script>.lua``).

A binding owns its script's calling convention: ``build(...)`` lays KEYS and ARGV out from
named, typed fields (shard groups as typed records), ``parse(...)`` reads the reply into typed
results, and ``contract`` declares both (:mod:`eoguard.store.bindings.layout`), position by
position. The stores build calls only through these; tests/unit/test_lua_contracts.py checks
every script's header against its binding's contract. A reply asking for undeclared keys
(``{'?', key, ...}``) never reaches ``parse``: :meth:`Scripts.run` answers it for every script.
"""

from __future__ import annotations

from eoguard.store.bindings.dedup import DedupClaim, DedupDone, DedupOpen, DedupRelease, DedupRenew
from eoguard.store.bindings.layout import Binding
from eoguard.store.bindings.liveness import LiveHeartbeat, LiveRead
from eoguard.store.bindings.outbox import OutboxAck, OutboxClaimForResend, OutboxSweep, OutboxWrite

__all__ = ["BINDINGS"]

BINDINGS: tuple[type[Binding], ...] = (
    DedupClaim, DedupDone, DedupOpen, DedupRelease, DedupRenew,
    LiveHeartbeat, LiveRead,
    OutboxAck, OutboxClaimForResend, OutboxSweep, OutboxWrite,
)
"""Every script's binding."""
