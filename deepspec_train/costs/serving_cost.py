"""Serving cost of a drafter at the widths it is served at, and the speedup it buys, modeled on named GPUs.

    python -m deepspec_train.costs.serving_cost                    # the tables of docs/explanation/drafter_quality.md
    python -m deepspec_train.costs.serving_cost --context 4096 --draft-topk 64

Per verification round, the drafter's kind lists its sequential kernel groups with the bytes each reads and
writes and its FLOPs (``DrafterKind.serving_round``, built from ``serving_kernels``); the target's verification
pass of ``K + 1`` tokens and its plain decode step of one token come from ``serving_kernels.target_round``. Each
group takes ``max(bytes / HBM bandwidth, FLOPs / dense bf16 peak)`` on a GPU of ``gpu_specs`` (the roofline), and
the groups of a round run one after the other, so their times add up. Peak bandwidth and peak FLOPs, no kernel
launch overhead, no overlap: a comparison of drafters on the same footing, not a latency prediction.

Modeled speedup over plain decoding: ``tau * t_target / (t_verify + t_draft)``, with tau the tokens a round emits
(bonus included), ``t_target`` one target decode step of one token, ``t_verify`` the ``K + 1``-token pass.

The **production counterpart** of a drafter (issue 22's cost rule) keeps its structure (kind, layer count, Markov
rank and head type, block size, confidence head, labels, TTT steps, DFlash2's convolution taps and selector
candidates, number of tapped layers) and takes the widths of the production recipe of the same kind
(``PRODUCTION_RECIPES``, Qwen3-8B: d 4,096, V 151,936, the target's MLP width, EAGLE-3's 32,000-token draft
vocabulary, DFlash2's channel groups of 128 and selector rank 256).
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Optional

from deepspec_train.config.schema import DrafterConfig
from deepspec_train.costs.gpu_specs import GPUS, GpuSpec, gpu_spec
from deepspec_train.kinds.registry import kind_spec
from deepspec_train.models.geometry import DrafterGeometry, geometry_from_target_config
from deepspec_train.kinds.serving_kernels import KernelGroup, RoundShape, ServingRound, target_round

# The recipes whose widths a counterpart takes, one per drafter kind.
PRODUCTION_RECIPES = ("qwen3-8b", "qwen3-8b-dflash", "qwen3-8b-eagle3", "qwen3-8b-dflash2")
# What a counterpart keeps of the drafter it mirrors; every other drafter setting is the production recipe's.
# DFlash2's taps and candidates are structure; its channel-group size and selector rank scale with the width.
STRUCTURE_FIELDS = (
    "kind", "num_layers", "block_size", "markov_rank", "markov_head_type", "confidence_head", "labels", "ttt_steps",
    "conv_kernel_size", "selector_top_k",
)
# Context positions each request holds (the KV cache a round attends to), when not given: a chat turn's length.
DEFAULT_CONTEXT = 1024
REPORT_GPU = "H200"
# The drafter the printed table divides draft times by (the cost rule's yardstick).
REFERENCE = "EAGLE-3 1x7"
REPORT_BATCHES = (1, 32)


@dataclass(frozen=True)
class ServedDrafter:
    """A drafter as served: its settings, how many target layers it taps, its geometry and the target's config."""

    name: str
    drafter: DrafterConfig
    taps: int
    geometry: DrafterGeometry
    target_config: Any

    def round(self, shape: RoundShape) -> ServingRound:
        return kind_spec(self.drafter.kind).serving_round(self.drafter, self.geometry, self.taps, shape)

    def sequential_passes(self) -> int:
        return kind_spec(self.drafter.kind).sequential_passes(self.drafter)


def served_recipe(recipe: str, overrides: Optional[list[str]] = None, name: Optional[str] = None) -> ServedDrafter:
    """A production recipe's drafter at its target's published widths (``models.reference_configs``)."""
    from deepspec_train.costs.reference_targets import reference_target_config
    from deepspec_train.kinds.recipe_validation import load_recipe

    cfg = load_recipe(recipe, overrides, check_target=False)
    hf_config = reference_target_config(cfg)
    geometry = geometry_from_target_config(hf_config, cfg.drafter.intermediate_size)
    return ServedDrafter(name or recipe, cfg.drafter, len(cfg.target.layer_ids), geometry, hf_config)


def production_counterpart(drafter: DrafterConfig, taps: int, name: str,
                           production: Sequence[str] = PRODUCTION_RECIPES) -> ServedDrafter:
    """``drafter``'s structure (``STRUCTURE_FIELDS``, ``taps``) at the widths of the production recipe of its kind."""
    for recipe in production:
        served = served_recipe(recipe)
        if served.drafter.kind == drafter.kind:
            structure = {f: getattr(drafter, f) for f in STRUCTURE_FIELDS}
            return dataclasses.replace(served, name=name, drafter=dataclasses.replace(served.drafter, **structure),
                                       taps=taps)
    raise ValueError(f"no production recipe of drafter kind {drafter.kind!r} among {list(production)}")


def group_seconds(group: KernelGroup, gpu: GpuSpec) -> float:
    """Roofline time of one group: bound by memory traffic or by tensor-core FLOPs, whichever is slower."""
    return max(group.bytes / gpu.hbm_bytes_per_s, group.flops / gpu.bf16_dense_flops_per_s)


def round_seconds(serving_round: ServingRound, gpu: GpuSpec) -> float:
    return sum(group_seconds(g, gpu) for g in serving_round.groups)


@dataclass(frozen=True)
class RoundTimes:
    """Modeled seconds of one round's draft, its verification pass and one plain target decode step."""

    draft_s: float
    verify_s: float
    target_s: float

    @property
    def speedup_per_token(self) -> float:
        """The modeled speedup per token a round emits: ``t_target / (t_verify + t_draft)``."""
        return self.target_s / (self.verify_s + self.draft_s)

    def speedup(self, tau: float) -> float:
        """``tau * t_target / (t_verify + t_draft)`` for ``tau`` tokens emitted per round."""
        return tau * self.speedup_per_token


def round_times(served: ServedDrafter, gpu: GpuSpec, batch: int, context_len: int = DEFAULT_CONTEXT,
                draft_topk: Optional[int] = None) -> RoundTimes:
    """Draft, verification and plain-decode times of ``served`` on ``gpu`` with ``batch`` requests."""
    shape = RoundShape(batch=batch, context_len=context_len, draft_topk=draft_topk)
    drafted = served.round(shape)
    verify = target_round(served.target_config, drafted.drafts + 1, shape)
    plain = target_round(served.target_config, 1, shape)
    return RoundTimes(round_seconds(drafted, gpu), round_seconds(verify, gpu), round_seconds(plain, gpu))


def _markdown(columns: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    header = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    return header + ["| " + " | ".join(r) + " |" for r in rows]


def group_table(served: ServedDrafter, gpu: GpuSpec, shape: RoundShape) -> list[str]:
    """One drafter's round, groups of the same name summed: count, weight / activation MB, GFLOP, microseconds."""
    totals: dict[str, list[float]] = {}
    for group in served.round(shape).groups:
        entry = totals.setdefault(group.name, [0, 0.0, 0.0, 0.0, 0.0])
        for i, value in enumerate((1, group.weight_bytes, group.activation_bytes, group.flops,
                                   group_seconds(group, gpu))):
            entry[i] += value
    rows = [[name, str(int(n)), f"{w / 1e6:,.1f}", f"{a / 1e6:,.2f}", f"{f / 1e9:,.2f}", f"{s * 1e6:,.1f}"]
            for name, (n, w, a, f, s) in totals.items()]
    total = [sum(v[i] for v in totals.values()) for i in range(1, 5)]
    rows.append(["total", "", f"{total[0] / 1e6:,.1f}", f"{total[1] / 1e6:,.2f}", f"{total[2] / 1e9:,.2f}",
                 f"{total[3] * 1e6:,.1f}"])
    return _markdown(["group", "count", "weights MB", "activations MB", "GFLOP", f"{gpu.name} us"], rows)


def report_drafters() -> list[ServedDrafter]:
    """The drafters of the printed tables: the production recipes (DSpark with its vanilla and RNN heads) and the
    production counterparts of the tiny recipes."""
    from deepspec_train.kinds.recipe_validation import load_recipe

    drafters = [
        served_recipe("qwen3-8b", name="DSpark 5L r256 vanilla"),
        served_recipe("qwen3-8b", ["drafter.markov_head_type=rnn"], name="DSpark 5L r256 rnn"),
        served_recipe("qwen3-8b", ["drafter.draft_vocab_size=32000"], name="DSpark 5L r256 vanilla, draft vocab 32K"),
        served_recipe("qwen3-8b-dflash", name="DFlash 5L"),
        served_recipe("qwen3-8b-dflash2", name="DFlash2 5L k8 r256"),
        served_recipe("qwen3-8b-eagle3", name=REFERENCE),
    ]
    for tiny in ("tiny-dspark", "tiny-eagle3"):
        cfg = load_recipe(tiny, check_target=False)
        drafters.append(production_counterpart(cfg.drafter, len(cfg.target.layer_ids), f"{tiny} at Qwen3-8B"))
    return drafters


def main(argv: Optional[list[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--context", type=int, default=DEFAULT_CONTEXT, help="context positions per request")
    parser.add_argument("--draft-topk", type=int, default=None, help="vLLM's dspark_draft_topk (default: off)")
    args = parser.parse_args(argv)
    drafters = report_drafters()
    gpu = gpu_spec(REPORT_GPU)
    for served in drafters:
        print(f"### {served.name}: one round at batch 1, context {args.context}, {gpu.name}\n")
        print("\n".join(group_table(served, gpu, RoundShape(1, args.context, draft_topk=args.draft_topk))) + "\n")
    reference = next(d for d in drafters if d.name == REFERENCE)
    rows = []
    for served in drafters:
        for batch in REPORT_BATCHES:
            for spec in GPUS.values():
                times = round_times(served, spec, batch, args.context, args.draft_topk)
                base = round_times(reference, spec, batch, args.context, args.draft_topk)
                rows.append([served.name, str(served.sequential_passes()), str(batch), spec.name,
                             f"{times.draft_s * 1e6:,.1f}", f"{times.draft_s / base.draft_s:.2f}",
                             f"{times.verify_s * 1e6:,.1f}", f"{times.target_s * 1e6:,.1f}",
                             f"{times.speedup_per_token:.3f}"])
    print(f"### Draft time per round and modeled speedup per emitted token (context {args.context})\n")
    print("\n".join(_markdown(["drafter", "layer passes", "batch", "GPU", "draft us", f"draft / {reference.name}",
                               "verify us", "target step us", "t_target / (t_verify + t_draft)"], rows)))
    facts = (f"{s.name} {s.hbm_bytes_per_s / 1e12:g} TB/s, {s.bf16_dense_flops_per_s / 1e12:g} TFLOP/s ({s.source})"
             for s in GPUS.values())
    print("\nGPU facts: " + "; ".join(facts))


if __name__ == "__main__":
    main()
