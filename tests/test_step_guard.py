"""The non-finite guard (``training.step_guard``) in a real 2-rank gloo run through ``train.py``.

Rank 1 alone sees a NaN step loss from step 3 on (the trainer's accumulation is patched in that process only).
Both ranks must skip the same updates (the checkpoint after the first skipped step holds the weights and AdamW
state of the one before it), count and log the skip, and after ``train.max_bad_steps`` = 2 skips in a row end
with exit status 2 and one ``error:`` line, leaving the checkpoints of the good steps and writing none for the
step that stopped the run. Unit checks of the verdict and the counter come first.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from deepspec_train.common.errors import UserError
from deepspec_train.training.checkpoint import list_checkpoints
from deepspec_train.training.distributed import DistContext
from deepspec_train.training.step_guard import BadSteps, TooManyBadSteps, agree_on_step
from tests.helpers.streaming_world import read_logs, recipe_overrides, start_ranks, wait_all

SINGLE = DistContext(0, 1, 0, torch.device("cpu"), None)
FIRST_BAD_STEP = 3
# Run on rank 1 only: from FIRST_BAD_STEP on its share of the step loss is NaN (gradients stay finite).
INJECT = f"""
import math, os, sys
from deepspec_train.training import trainer

original = trainer.DrafterTrainer._accumulate

def accumulate(self, step, stats):
    loss, parts = original(self, step, stats)
    if os.environ["RANK"] == "1" and self.step + 1 >= {FIRST_BAD_STEP}:
        loss = loss * math.nan
    return loss, parts

trainer.DrafterTrainer._accumulate = accumulate
from deepspec_train.commands.train_entry import main
sys.exit(main(sys.argv[1:]))
"""


def test_the_verdict_flags_a_nan_or_inf_loss_or_norm() -> None:
    finite, nan, inf = torch.tensor(1.0), torch.tensor(math.nan), torch.tensor(math.inf)
    assert not agree_on_step(finite, finite, SINGLE).bad
    assert agree_on_step(nan, finite, SINGLE).bad
    assert agree_on_step(finite, inf, SINGLE).bad
    assert agree_on_step(inf, None, SINGLE).bad
    assert not agree_on_step(finite, None, SINGLE).stop


def test_the_counter_resets_on_a_good_step_and_stops_at_the_limit() -> None:
    warnings: list[str] = []
    steps = BadSteps(2, warnings.append)
    steps.record(1, True)
    steps.record(2, False)
    steps.record(3, True)
    assert (steps.in_a_row, steps.total) == (1, 2)
    with pytest.raises(TooManyBadSteps, match="train.max_bad_steps=2") as stopped:
        steps.record(4, True)
    assert isinstance(stopped.value, UserError) and "\n" not in str(stopped.value)
    assert warnings[-1].startswith("step 4: non-finite") and "2 in a row, 3 in all" in warnings[-1]


@pytest.mark.slow
def test_a_nan_on_one_rank_skips_the_step_on_every_rank_and_stops_after_max_bad_steps(
    streaming_world, tmp_path: Path
) -> None:
    out = tmp_path / "run"
    args = recipe_overrides(streaming_world, out, **{
        "train.max_steps": 8, "train.checkpoint_every": 1, "train.keep_last": 0, "train.max_bad_steps": 2,
        "logging.log_every": 1,
    })
    codes = wait_all(start_ranks(["-c", INJECT, *args], 2, out / "logs"), 300)
    logs = read_logs(out / "logs", 2)
    assert codes == [2, 2], logs
    errors = [line for line in logs.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "training stopped at step 4" in errors[0], logs
    assert "step 3: non-finite loss or gradient norm" in logs
    # Steps 1-2 trained, step 3 was skipped (and checkpointed: same weights), step 4 stopped the run unsaved.
    checkpoints = {int(c.name.split("_")[1]): c for c in list_checkpoints(out)}
    assert sorted(checkpoints) == [1, 2, 3]
    weights = {step: load_file(c / "drafter.safetensors") for step, c in checkpoints.items()}
    moments = {step: torch.load(c / "optimizer.pt", weights_only=True)["state"] for step, c in checkpoints.items()}
    assert any(not torch.equal(value, weights[1][name]) for name, value in weights[2].items())
    for name, value in weights[3].items():
        assert torch.equal(value, weights[2][name]), name
    for index, state in moments[3].items():
        assert torch.equal(state["exp_avg"], moments[2][index]["exp_avg"])
        assert torch.equal(state["step"], moments[2][index]["step"])
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    skipped = {r["step"]: r["train/skipped_steps"] for r in records if "train/skipped_steps" in r}
    assert skipped == {1: 0.0, 2: 0.0, 3: 1.0}
