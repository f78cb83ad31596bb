"""The modeled cost of the levers (``costs.levers``) against the real modules and pipeline.

- Anchor density: what a drafter step costs per supervised slot (its LM heads and Markov factor, the work that
  grows with the vocabulary) is counted by ``torch.utils.flop_counter`` on a real tiny DSpark step (forward, loss,
  backward) at two vocabulary sizes; the model's difference is the counted one, FLOP for FLOP.
- Feature reuse: a colocated source with ``train.feature_reuse`` R runs the target once per R steps (its forwards
  counted), the amortisation the model divides the target pass by.
- The command takes a recipe and overrides, and the docs' grid is what it prints.
"""

from __future__ import annotations

import dataclasses
import runpy
import sys

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from deepspec_train.kinds.registry import kind_spec
from deepspec_train.models.parallel_drafter import ParallelDrafter
from deepspec_train.packing.packer import SequenceItem, pack_sequences
from deepspec_train.costs.stream_payload import nominal_anchors
from deepspec_train.costs.levers import recipe_lever_cost, table_costs
from deepspec_train.training.batch_loss import DrafterLoss
from tests.helpers.step_trainers import tiny_recipe
from tests.helpers.tiny_geometry import BLOCK, HIDDEN, MASK_ID, TINY_GEOMETRY

SEQ_LEN, ANCHORS = 40, 8


def _addmm_flops(bias_shape, a_shape, b_shape, *args, out_shape=None, **kwargs) -> int:
    return 2 * a_shape[0] * a_shape[1] * b_shape[1]


# The loss accumulates the Markov bias and the weight gradients with in-place ``addmm_``, which the counter's
# registry leaves out (it has ``addmm``): counted like ``addmm``.
IN_PLACE_ADDMM = {torch.ops.aten.addmm_: _addmm_flops}


def _counted_and_modeled_step(vocab: int) -> tuple[int, float]:
    """FLOPs of a real DSpark step on one fully supervised nominal sequence over a ``vocab``-token vocabulary, as
    torch counts them and as the kind's cost model has them."""
    cfg = tiny_recipe()
    geometry = dataclasses.replace(TINY_GEOMETRY, vocab_size=vocab)
    generator = torch.Generator().manual_seed(0)
    item = SequenceItem(torch.randint(0, MASK_ID, (SEQ_LEN,), generator=generator),
                        torch.ones(SEQ_LEN, dtype=torch.bool),
                        torch.randn(SEQ_LEN, 2 * HIDDEN, generator=generator),
                        torch.randn(SEQ_LEN, HIDDEN, generator=generator), 0)
    anchors = nominal_anchors(SEQ_LEN, ANCHORS)
    [batch] = pack_sequences([item], [torch.tensor(anchors)], BLOCK, 4096, MASK_ID)
    torch.manual_seed(0)
    drafter = ParallelDrafter(geometry, cfg.drafter, list(cfg.target.layer_ids)).train()
    loss = DrafterLoss.for_recipe(cfg, torch.randn(vocab, HIDDEN, generator=generator), "sdpa")
    with FlopCounterMode(display=False, custom_mapping=IN_PLACE_ADDMM) as counter:
        loss(drafter, batch, float(batch.num_supervised)).loss.loss.backward()
    modeled = kind_spec("dspark").flops_per_sequence(cfg, geometry, anchors, batch.num_supervised)
    return counter.get_total_flops(), modeled


def test_the_work_per_supervised_slot_is_the_counted_work_of_the_real_heads() -> None:
    small, large = _counted_and_modeled_step(MASK_ID + 1), _counted_and_modeled_step(MASK_ID + 1 + 256)
    assert large[0] - small[0] == large[1] - small[1]


def test_a_pass_feeds_feature_reuse_steps() -> None:
    """The target runs once per R steps of a colocated source (``InProcessFeatureSource`` with a ``PassReplay``),
    so the model's target tokens per step are a pass's over R."""
    from bench.target_syncs import SEQUENCES, step_rows
    from deepspec_train.steps.chunk_builder import ChunkBuilder
    from deepspec_train.steps.chunk_plan import PackingSpec
    from deepspec_train.steps.plan import StepPlan
    from deepspec_train.training.feature_source import PassReplay
    from deepspec_train.training.feature_source import InProcessFeatureSource
    from deepspec_train.target.hidden_states import TargetTap
    from transformers import Qwen3ForCausalLM
    from tests.helpers.tiny_geometry import tiny_qwen3_config

    tap = TargetTap(Qwen3ForCausalLM(tiny_qwen3_config(intermediate_size=64, head_dim=8)).eval(), [0, 2])
    forwards = []

    def counted(input_ids, attention_mask=None):
        forwards.append(input_ids.shape[0])
        return tap(input_ids, attention_mask)

    reuse, steps = 4, 8
    spec = PackingSpec(BLOCK, 6, 256, MASK_ID, SEQUENCES)
    plan = StepPlan(step_rows() * 2, SEQUENCES, 0, spec, 0, 1, reuse=reuse)
    source = iter(InProcessFeatureSource(plan, ChunkBuilder(counted, spec, "cpu"), PassReplay(2**30, reuse)))
    for _ in range(steps):
        list(next(source).batches)
    assert sum(forwards) == SEQUENCES * steps // reuse
    cost = recipe_lever_cost("qwen3-8b", [f"train.feature_reuse={reuse}"])
    assert cost.target_tokens_per_step == cost.sequences_per_step * cost.seq_len / reuse


def test_the_modeled_table_moves_the_way_the_levers_do() -> None:
    costs = {(c.anchors, c.reuse): c for c in table_costs()}
    one = costs[(512, 1)]
    # The target pass is one per R steps; the drafter's step grows with the anchors.
    assert costs[(512, 4)].step_seconds == pytest.approx(one.target_pass_seconds / 4 + one.drafter_step_seconds)
    assert costs[(16, 1)].drafter_step_seconds < costs[(64, 1)].drafter_step_seconds < one.drafter_step_seconds
    assert costs[(16, 8)].kept_bytes_per_gpu > 0 == costs[(16, 1)].kept_bytes_per_gpu


def _command(monkeypatch, *words: str) -> int:
    """``python -m deepspec_train.costs levers qwen3-8b WORDS``, run as ``__main__`` in this process (a fresh
    interpreter would only import torch and transformers again); its exit status."""
    monkeypatch.setattr(sys, "argv", ["python -m deepspec_train.costs", "levers", "qwen3-8b", *words])
    try:
        runpy.run_module("deepspec_train.costs", run_name="__main__")
    except SystemExit as ended:
        return ended.code
    return 0


def test_the_command_takes_a_recipe_and_overrides_and_refuses_a_bad_key_in_one_line(monkeypatch, capsys) -> None:
    assert _command(monkeypatch, "train.feature_reuse=4", "anchors.num_per_sequence=64") == 0
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| qwen3-8b")]
    assert [row.split(" | ")[1:3] for row in rows] == [["512", "1"], ["64", "4"]]
    assert _command(monkeypatch, "train.feature_reus=4") == 2
    assert "train.feature_reuse" in capsys.readouterr().err.strip().splitlines()[-1]
