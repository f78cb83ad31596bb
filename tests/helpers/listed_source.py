"""A feature source over micro-batches made in advance: for trainer tests that run ``DrafterTrainer.fit`` without a
target (``FeatureSource`` protocol, ``training.feature_source``)."""

from __future__ import annotations

from typing import Iterator

from deepspec_train.packing.batch import PackedBatch
from deepspec_train.training.feature_source import StepBatches


class ListedSource:
    """Yields ``steps[i]`` as step ``i`` (cycling); its data position is the next step's index."""

    def __init__(self, steps: list[list[PackedBatch]]) -> None:
        self.steps = steps
        self.next_step = 0

    def __iter__(self) -> Iterator[StepBatches]:
        while True:
            batches = self.steps[self.next_step % len(self.steps)]
            self.next_step += 1
            yield StepBatches.of(batches)

    def state_dict(self) -> dict:
        return {"next_step": self.next_step}

    def load_state_dict(self, state: dict) -> None:
        self.next_step = int(state["next_step"])

    def pop_metrics(self) -> dict[str, float]:
        return {}
