"""A consumer batch's stages go in order; a step out of order is a StateError, not a bare
RuntimeError (the pipeline lost track of the batch: a retry fails the same way)."""

from __future__ import annotations

import pytest

from eoguard.consumer.state import Batch, BatchStage
from eoguard.errors import StateError


def test_stages_go_in_order_and_any_may_drop() -> None:
    batch = Batch([], [], {})
    for stage in (BatchStage.CLAIMING, BatchStage.CLAIMED, BatchStage.MARKING,
                  BatchStage.COMMITTED):
        batch.advance(stage)
        assert batch.stage is stage
    batch.advance(BatchStage.DROPPED)
    assert batch.stage is BatchStage.DROPPED


@pytest.mark.parametrize("stage", [BatchStage.CLAIMED, BatchStage.MARKING, BatchStage.COMMITTED])
def test_a_step_out_of_order_is_a_state_error(stage: BatchStage) -> None:
    batch = Batch([], [], {})
    with pytest.raises(StateError, match=f"batch cannot go from decoded to {stage.value}"):
        batch.advance(stage)
    assert batch.stage is BatchStage.DECODED
