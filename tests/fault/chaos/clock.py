"""Clock skew of one chaos worker: its wall clock off by minutes, through libfaketime.

``producer-clock-skew`` / ``consumer-clock-skew`` SIGKILL a worker and start its replacement
with a wall clock ``skew_s`` ahead or behind (60-150 s either way) for the fault's hold, then
SIGKILL that one and start a worker in step again. The skew comes from Debian's libfaketime
(``FAKETIME=±<s>``, ``FAKETIME_DONT_FAKE_MONOTONIC=1``: timeouts and leases keep the real
monotonic clock), preloaded after ``faketime_fix.c``, which this module compiles once per
folder: Debian's 0.9.10 fails Python 3.11's ``time.sleep`` with that setting, and leaves
librdkafka's C11 condition waits on the skewed clock (every wait off by the skew).

What docs/design.md §5 (Clocks) says a skew does, the checker allows (checker.py,
:class:`Skews`): a consumer ahead drops as expired, unhandled, a message read less than the
skew before its ``expires_at``; a producer behind sends messages that live the skew less (a
long-TTL one that then expires unhandled is no stall).
"""

from __future__ import annotations

import random
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from eoguard.stack.debian import ensure_package, libfaketime_path

SKEW_S = (60, 150)  # how far off, either way
_FIX = Path(__file__).with_name("faketime_fix.c")


def draw_skew_s(rng: random.Random) -> int:
    """A skew of one to a few minutes, ahead or behind."""
    return rng.choice((-1, 1)) * rng.randint(*SKEW_S)


def faketime_env(skew_s: int, folder: Path) -> dict[str, str]:
    """The environment that runs a process with its wall clock ``skew_s`` seconds off."""
    faketime = ensure_package("libfaketime", libfaketime_path())
    fix = folder / "faketime_fix.so"
    if not fix.exists():
        subprocess.run([ensure_package("gcc", "gcc"), "-shared", "-fPIC", "-O2", "-o", str(fix),
                        str(_FIX), "-ldl"], check=True, capture_output=True)
    return {"LD_PRELOAD": f"{fix} {faketime}", "FAKETIME": f"{skew_s:+d}",
            "FAKETIME_DONT_FAKE_MONOTONIC": "1"}


@dataclass
class Skew:
    """One worker that ran with a skewed clock: who, how far off, and when (real ms)."""

    worker: str
    role: str
    scope: str | None  # a consumer's scope
    skew_ms: int
    from_ms: int
    to_ms: int = 0
    ids: set[str] = field(default_factory=set)  # a producer's messages
