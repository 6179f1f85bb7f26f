"""Straggling claim passes on the executors, without touching the job: copied into a directory
on the executors' ``PYTHONPATH`` as ``sitecustomize.py`` (see tests/spark/test_speculation.py).

Python imports ``sitecustomize`` at start (``site.main()``, after the site-packages), so every
executor Python process (pyspark's daemon, whose forked workers inherit it) runs
:func:`install`, which wraps :func:`eoguard_spark.claims.claim_partition`. The claim UDF
(``eoguard_spark.dedup.claim_status``) is pickled by value but names ``claim_partition`` by
reference (cloudpickle: an importable module's function), so the task gets the wrapper.

The wrapper makes the first attempt (``attemptNumber() == 0``) of one planned partition per
micro-batch (``streaming.sql.batchId``, the local property Structured Streaming sets on the
batch's jobs) sleep after its first Arrow batch is claimed, once per (batch, partition) over
all stages. It writes a marker as it starts sleeping (``b<batch>-p<partition>.json``: pid,
stage, task attempt id), so the test knows which Python worker, and so which executor JVM,
holds the straggler. Later attempts (speculative copies, retries) run unchanged.

Only the standard library is imported at module level: the test imports this module too.
The plan comes from ``EOG_STRAGGLE`` (``spark.executorEnv.EOG_STRAGGLE``), made by
:func:`plan_env`. A ``sitecustomize`` further down ``sys.path`` is shadowed (the venv has none).
"""

from __future__ import annotations

import functools
import json
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ENV = "EOG_STRAGGLE"
BATCH_ID_PROPERTY = "streaming.sql.batchId"  # set by MicroBatchExecution on its jobs


def plan_env(markers: Path, plan: dict[int, int], sleep_s: float) -> str:
    """``EOG_STRAGGLE``: partition ``plan[b]`` of micro-batch ``b`` straggles ``sleep_s``."""
    return json.dumps({"markers": str(markers), "sleep_s": sleep_s,
                       "plan": {str(batch): partition for batch, partition in plan.items()}})


def read_markers(markers: Path) -> list[dict[str, Any]]:
    """The stragglers that started sleeping so far (complete markers only)."""
    return [json.loads(path.read_text()) for path in sorted(markers.glob("*.json"))]


def _straggle(config: dict[str, Any]) -> tuple[Path, dict[str, Any]] | None:
    """Whether this task attempt is a planned straggler: its marker path and content."""
    from pyspark import TaskContext  # noqa: PLC0415 - executors only

    ctx = TaskContext.get()
    if ctx is None or ctx.attemptNumber() != 0:
        return None
    batch = ctx.getLocalProperty(BATCH_ID_PROPERTY)
    if batch is None or config["plan"].get(batch) != ctx.partitionId():
        return None
    markers = Path(config["markers"])
    name = f"b{batch}-p{ctx.partitionId()}"
    try:  # once per (batch, partition): not again in a later stage of the batch
        os.close(os.open(markers / f"{name}.taken", os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        return None
    return markers / f"{name}.json", {
        "batch": int(batch), "partition": ctx.partitionId(), "stage": ctx.stageId(),
        "task": ctx.taskAttemptId(), "attempt": ctx.attemptNumber(), "pid": os.getpid(),
        "sleep_s": config["sleep_s"]}


def install() -> None:
    """Wrap ``eoguard_spark.claims.claim_partition`` per the plan in ``EOG_STRAGGLE``."""
    spec = os.environ.get(ENV)
    if not spec:
        return
    config: dict[str, Any] = json.loads(spec)
    from eoguard_spark import claims  # noqa: PLC0415 - only where the plan is set

    original = claims.claim_partition

    @functools.wraps(original)
    def claim_partition(settings: Any, batches: Iterator[Any]) -> Iterator[Any]:
        straggler = _straggle(config)
        inner = original(settings, batches)
        if straggler is None:
            yield from inner
            return
        marker, content = straggler
        for first in inner:  # the first Arrow batch claimed (its next one is on the way)
            yield first
            break
        else:
            return
        content["since"] = time.time()
        partial = marker.with_suffix(".part")
        partial.write_text(json.dumps(content))
        partial.rename(marker)  # the test sees complete markers only
        time.sleep(config["sleep_s"])
        yield from inner

    claims.claim_partition = claim_partition  # type: ignore[assignment]


if __name__ == "sitecustomize":
    try:
        install()
    except Exception as exc:  # site swallows it silently: say so on the executor's stderr
        print(f"straggler_site: not installed: {exc!r}", file=sys.stderr)
        raise
