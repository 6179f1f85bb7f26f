"""Run a module inside a cgroup: ``python -m tests.fault.chaos.in_cgroup PROCS MODULE ARGS...``.

Writes this process's pid to the cgroup's ``cgroup.procs`` file PROCS, then runs MODULE as
``python -m MODULE ARGS...`` would, so every socket the module opens carries the cgroup
(netcut.py matches a worker's packets by it). A wrapper instead of a ``preexec_fn``: nothing
runs between fork and exec in the parent's threads' company.
"""

from __future__ import annotations

import os
import runpy
import sys
from pathlib import Path


def main() -> None:
    procs, module, *args = sys.argv[1:]
    Path(procs).write_text(str(os.getpid()))
    sys.argv = [module, *args]
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
