"""What the levers that learn more per target token cost on a GPU, modeled at a production recipe's widths: anchor
density (``anchors.num_per_sequence`` / ``anchors.per_1k_tokens``), feature reuse (``train.feature_reuse`` R) and
the drafter's start from target layers (``drafter.init_from_target_layers``, no cost per step: a copy at start).

    python -m deepspec_train.costs levers                      # the docs' table: qwen3-8b, anchors x R
    python -m deepspec_train.costs levers qwen3-8b train.feature_reuse=4 anchors.num_per_sequence=64
    python -m deepspec_train.costs levers qwen3-8b-eagle3 --seq-len 4096 --gpu H200

A model, not a measurement. One optimizer step trains ``train.global_batch_sequences`` nominal sequences of
``seq_len`` tokens, fully supervised (``costs.stream_payload``'s nominal packing). The target runs one pass over a
step's sequences every R steps (``training.feature_source.PassReplay``): ``target_flops_per_sequence`` per sequence, forward only.
The drafter runs every step: its kind's forward + backward FLOPs (``drafter_flops_per_sequence``), which grow with
the anchors through the work at supervised block slots (LM heads over the vocabulary, Markov factor), the block
slots' layer passes and their attention; ``heads_share`` is the part of it that the supervised slots cost (the
kind's count with the slots left out, subtracted). Seconds are FLOPs at ``costs.gpu_split.ASSUMED_FLOPS_PER_S``'s
utilisation of the GPU's dense bf16 peak (``gpu_specs``; H100 and H200 have the same peak, so the same seconds); GPU-seconds add
over GPUs, so they do not depend on how many GPUs share a step (communication and memory traffic not modelled).

A recommendation reads validation E[L] per modeled GPU-hour: a run of ``N`` steps costs ``N * step_seconds / 3600``
GPU-hours (``gpu_hours``). ``kept_bytes_per_gpu`` is what feature reuse holds on each drafter rank (one pass's
packed micro-batches of its share, against ``train.feature_reuse_bytes``) on one node of ``GPUS_PER_NODE``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Optional, Sequence

from deepspec_train.config.schema import RecipeConfig
from deepspec_train.costs.gpu_specs import GPUS, GpuSpec, gpu_spec
from deepspec_train.kinds.registry import kind_spec
from deepspec_train.costs.gpu_split import ASSUMED_FLOPS_PER_S, GPUS_PER_NODE
from deepspec_train.costs.reference_targets import reference_target_config
from deepspec_train.costs.stream_payload import nominal_anchor_count, nominal_anchors, payload_bytes
from deepspec_train.costs.training_flops import drafter_flops_per_sequence, target_flops_per_sequence

# The fraction of a GPU's dense bf16 peak the sizing tables assume (0.4 of an H100's).
ASSUMED_UTILISATION = ASSUMED_FLOPS_PER_S / GPUS["H100"].bf16_dense_flops_per_s
DEFAULT_RECIPE = "qwen3-8b"
DEFAULT_SEQ_LEN = 2048
DEFAULT_GPU = "H100"
# The docs' grid: the laptop benchmark's 16 anchors up to the production recipes' 512, reuse 1 to 8.
TABLE_ANCHORS = (16, 64, 128, 512)
TABLE_REUSE = (1, 2, 4, 8)


@dataclass(frozen=True)
class LeverCost:
    """One setting's modeled work: FLOPs of a target pass and of a drafter step, the pass's feature bytes kept per
    GPU, and the derived seconds on ``gpu`` (see the module docstring)."""

    recipe: str
    seq_len: int
    sequences_per_step: int
    anchors: int
    reuse: int
    gpu: GpuSpec
    target_pass_flops: float
    drafter_step_flops: float
    drafter_heads_flops: float
    kept_bytes_per_gpu: float

    @property
    def flops_per_s(self) -> float:
        return ASSUMED_UTILISATION * self.gpu.bf16_dense_flops_per_s

    @property
    def target_pass_seconds(self) -> float:
        return self.target_pass_flops / self.flops_per_s

    @property
    def drafter_step_seconds(self) -> float:
        return self.drafter_step_flops / self.flops_per_s

    @property
    def step_seconds(self) -> float:
        """GPU-seconds per optimizer step: a target pass shared by ``reuse`` steps, and the step's drafter work."""
        return self.target_pass_seconds / self.reuse + self.drafter_step_seconds

    @property
    def target_tokens_per_step(self) -> float:
        return self.sequences_per_step * self.seq_len / self.reuse

    @property
    def seconds_per_target_token(self) -> float:
        """GPU-seconds per token the target runs: one pass and the ``reuse`` steps it feeds, over its tokens."""
        return self.step_seconds / self.target_tokens_per_step

    @property
    def target_share(self) -> float:
        """The part of a step's GPU-seconds spent in the target forward."""
        return self.target_pass_seconds / self.reuse / self.step_seconds

    @property
    def heads_share(self) -> float:
        """The part of the drafter's FLOPs spent at supervised slots (LM heads, Markov factor)."""
        return self.drafter_heads_flops / self.drafter_step_flops

    def gpu_hours(self, steps: int) -> float:
        """Modeled GPU-hours of ``steps`` optimizer steps: what validation E[L] after them is divided by."""
        return steps * self.step_seconds / 3600


def lever_cost(cfg: RecipeConfig, name: str, seq_len: int = DEFAULT_SEQ_LEN, gpu: str = DEFAULT_GPU,
               hf_config: Optional[Any] = None) -> LeverCost:
    """The modeled cost of ``cfg``'s levers at its target's published widths (or ``hf_config``'s), ``seq_len``
    tokens per nominal sequence, on ``gpu``."""
    from deepspec_train.models.geometry import geometry_from_target_config

    hf_config = hf_config if hf_config is not None else reference_target_config(cfg)
    geometry = geometry_from_target_config(hf_config, cfg.drafter.intermediate_size)
    anchors = nominal_anchor_count(cfg, seq_len)
    batch = cfg.train.global_batch_sequences
    drafter = drafter_flops_per_sequence(cfg, geometry, seq_len, anchors)
    without_slots = kind_spec(cfg.drafter.kind).flops_per_sequence(cfg, geometry, nominal_anchors(seq_len, anchors), 0)
    share = -(-batch // GPUS_PER_NODE)
    kept = payload_bytes(cfg, geometry, share, seq_len, anchors).total_bytes if cfg.train.feature_reuse > 1 else 0
    return LeverCost(name, seq_len, batch, anchors, cfg.train.feature_reuse, gpu_spec(gpu),
                     batch * target_flops_per_sequence(hf_config, seq_len), batch * drafter,
                     batch * (drafter - without_slots), kept)


def recipe_lever_cost(recipe: str, overrides: Sequence[str] = (), seq_len: int = DEFAULT_SEQ_LEN,
                      gpu: str = DEFAULT_GPU) -> LeverCost:
    """``lever_cost`` of a recipe with ``dotted.key=value`` overrides, e.g. ``train.feature_reuse=4``."""
    from deepspec_train.kinds.recipe_validation import load_recipe

    cfg = load_recipe(recipe, list(overrides), check_target=False)
    label = " ".join([recipe, *overrides])
    return lever_cost(cfg, label, seq_len, gpu)


def table_costs(recipe: str = DEFAULT_RECIPE, seq_len: int = DEFAULT_SEQ_LEN,
                gpu: str = DEFAULT_GPU) -> list[LeverCost]:
    """The docs' grid: ``TABLE_ANCHORS`` x ``TABLE_REUSE`` for ``recipe``."""
    from deepspec_train.kinds.recipe_validation import load_recipe

    base = load_recipe(recipe, check_target=False)
    hf_config = reference_target_config(base)
    costs = []
    for anchors in TABLE_ANCHORS:
        cfg = dataclasses.replace(
            base, anchors=dataclasses.replace(base.anchors, num_per_sequence=anchors, per_1k_tokens=None),
            train=dataclasses.replace(base.train, feature_reuse=max(TABLE_REUSE)))
        # The FLOPs and the kept pass do not depend on R (only whether a pass is kept): one count per anchor setting.
        reused = lever_cost(cfg, recipe, seq_len, gpu, hf_config)
        costs += [dataclasses.replace(reused, reuse=reuse, kept_bytes_per_gpu=reused.kept_bytes_per_gpu * (reuse > 1))
                  for reuse in TABLE_REUSE]
    return costs


COLUMNS = ("anchors", "R", "target s / pass", "drafter s / step", "heads share", "GPU-s / step",
           "GPU-ms / 1K target tok", "target share", "kept GB / GPU")


def table_row(cost: LeverCost) -> list[str]:
    """One markdown row of ``COLUMNS``."""
    return [str(cost.anchors), str(cost.reuse), f"{cost.target_pass_seconds:,.1f}", f"{cost.drafter_step_seconds:,.1f}",
            f"{cost.heads_share:.0%}", f"{cost.step_seconds:,.1f}", f"{cost.seconds_per_target_token * 1e6:,.1f}",
            f"{cost.target_share:.0%}", f"{cost.kept_bytes_per_gpu / 1e9:,.1f}"]


def print_levers(recipe: str, overrides: Sequence[str], seq_len: int, gpu: str) -> None:
    """The grid of ``table_costs`` for ``recipe``, or, with ``overrides``, the recipe's row and the overridden one."""
    if overrides:
        costs = [recipe_lever_cost(recipe, (), seq_len, gpu), recipe_lever_cost(recipe, overrides, seq_len, gpu)]
    else:
        costs = table_costs(recipe, seq_len, gpu)
    columns = ("setting",) + COLUMNS if overrides else COLUMNS
    print(f"### {recipe}: modeled cost of the levers, L = {seq_len}, {costs[0].sequences_per_step} sequences per step, "
          f"{gpu} at {ASSUMED_UTILISATION:.0%} of its dense bf16 peak (a model, not a measurement)\n")
    print("| " + " | ".join(columns) + " |")
    print("|" + "---|" * len(columns))
    for cost in costs:
        print("| " + " | ".join(([cost.recipe] if overrides else []) + table_row(cost)) + " |")
