"""How far the served confidence head can rank teacher-forced acceptance: the trained head against the same linear
head refitted to convergence on frozen features, and against a small MLP that no engine loads.

    python bench/confidence_probe.py --run runs/demo/tiny-dspark [--train-steps 40]

The served head is one linear map of ``[h_k ; W1[x_prev]]`` (vLLM's and SGLang's ``confidence_head.proj``). With
``drafter.confidence_gradient=detached`` its BCE never changes the drafter, so the features it reads are fixed once
training ends and the best linear head on them can be fitted directly: if the trained head ranks as well as that
refit, more confidence training cannot help and only features shaped for it (the joint gradient) can. The script
collects the features and teacher-forced ``c*`` of the run's recipe on the first ``--train-steps`` training steps
and on every validation sequence (the validation pass's anchors; the tiny world's validation file runs code,
prose, math in order, so a prefix would leave a domain out), fits on the training
rows (full-batch L-BFGS on the BCE against ``c*``, features standardised) and scores on the validation rows with
``metrics.calibration.auroc_expected``: the AUROC against acceptance outcomes drawn from ``c*``, whose ceiling is
``c*`` itself. Rows for each block position, then all pooled.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Optional

import torch
from torch import nn

from deepspec_train.jobs.assembly import chunk_builder, load_token_datasets, train_plan, validation_plan
from deepspec_train.jobs.drafter_init import initialise_from
from deepspec_train.kinds.builder import build_drafter
from deepspec_train.metrics.calibration import auroc_expected
from deepspec_train.packing.batch import PackedBatch
from deepspec_train.target.hidden_states import TargetTap
from deepspec_train.target.loading import load_target_model
from deepspec_train.training.batch_loss import DrafterLoss
from deepspec_train.training.distributed import init_distributed
from deepspec_train.kinds.recipe_validation import load_recipe


@dataclass
class ConfidenceRows:
    """Per supervised slot: the head's input features, teacher-forced ``c*``, block position and trained logit."""

    features: torch.Tensor
    c_star: torch.Tensor
    slot: torch.Tensor
    logit: torch.Tensor


def collect(drafter: nn.Module, loss: DrafterLoss, batches: Iterable[PackedBatch]) -> ConfidenceRows:
    """Run ``loss`` on ``batches`` and keep what the confidence head read (a hook on its projection)."""
    captured: list[torch.Tensor] = []
    hook = drafter.confidence_head.proj.register_forward_hook(lambda m, i, o: captured.append(i[0].detach()))
    parts: list[tuple[torch.Tensor, ...]] = []
    try:
        for batch in batches:
            if batch.num_supervised == 0:
                continue
            with torch.no_grad():
                result = loss(drafter, batch, 1.0)
            conf = result.loss.conf_prob.double().clamp(1e-9, 1 - 1e-9)
            parts.append((captured[-1].double(), result.loss.c_star.double(), result.slot_index, torch.logit(conf)))
    finally:
        hook.remove()
    return ConfidenceRows(*(torch.cat(column) for column in zip(*parts)))


def fit_probe(model: nn.Module, x: torch.Tensor, y: torch.Tensor, weight_decay: float, iters: int = 300) -> nn.Module:
    """Full-batch L-BFGS on the BCE of ``model(x)`` against the soft targets ``y``."""
    model = model.double()
    opt = torch.optim.LBFGS(model.parameters(), max_iter=iters, line_search_fn="strong_wolfe")

    def closure() -> torch.Tensor:
        opt.zero_grad()
        value = nn.functional.binary_cross_entropy_with_logits(model(x).squeeze(-1), y)
        value = value + weight_decay * sum((p ** 2).sum() for p in model.parameters())
        value.backward()
        return value

    opt.step(closure)
    return model


def score_row(name: str, scores: torch.Tensor, rows: ConfidenceRows, block_size: int) -> list[str]:
    per_slot = [auroc_expected(scores[rows.slot == k], rows.c_star[rows.slot == k]) for k in range(block_size)]
    return [name, *(f"{v:.3f}" for v in per_slot), f"{auroc_expected(scores, rows.c_star):.3f}"]


def main(argv: Optional[list[str]] = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--run", required=True, help="a training run directory (resolved_config.yaml, drafter/)")
    parser.add_argument("--train-steps", type=int, default=40, help="training steps whose blocks the probes fit on")
    parser.add_argument("--out", default=None, help="write the table as JSON here")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    run = Path(args.run)
    every_sequence = f"train.eval_sequences={2 ** 31 - 1}"
    cfg = load_recipe(str(run / "resolved_config.yaml"), [f"drafter.init_from={run / 'drafter'}", every_sequence])
    if not cfg.drafter.confidence_head:
        raise SystemExit(f"{run}: the drafter has no confidence head")
    ctx = init_distributed()
    data = load_token_datasets(cfg, ctx)
    if "validation" not in data:
        raise SystemExit(f"{run}: the recipe names no validation data")
    target = load_target_model(cfg.target, ctx.device)
    drafter = build_drafter(cfg, target, data["train"])
    initialise_from(drafter, cfg)
    drafter.eval()
    loss = DrafterLoss.for_recipe(cfg, target.get_output_embeddings().weight.detach(), "sdpa")
    builder = chunk_builder(cfg, TargetTap(target, cfg.target.layer_ids), ctx.device)
    plan = train_plan(cfg, data["train"], 0, 1)
    fit_rows = collect(drafter, loss, (b for s in range(args.train_steps) for b in builder.build_all(plan.chunks(s))))
    val_rows = collect(drafter, loss, builder.build_all(validation_plan(cfg, data["validation"], 0, 1).chunks(0)))

    mean, std = fit_rows.features.mean(0), fit_rows.features.std(0) + 1e-6
    x_fit, x_val = (fit_rows.features - mean) / std, (val_rows.features - mean) / std
    hidden = x_fit.shape[1] - cfg.drafter.markov_rank  # the head reads [h_k ; W1[x_prev]], W1 rows of the rank
    torch.manual_seed(0)
    probes = {
        "linear head refitted (what the engines load)": (nn.Linear(x_fit.shape[1], 1), slice(None), 0.0),
        "linear head refitted, h_k only": (nn.Linear(hidden, 1), slice(0, hidden), 1e-4),
        "MLP, 64 hidden units (no engine loads it)": (
            nn.Sequential(nn.Linear(x_fit.shape[1], 64), nn.GELU(), nn.Linear(64, 1)), slice(None), 1e-3),
    }
    block = cfg.drafter.block_size
    table = [score_row("ceiling: c* itself", val_rows.c_star, val_rows, block),
             score_row("trained head", val_rows.logit, val_rows, block)]
    for name, (model, columns, decay) in probes.items():
        fitted = fit_probe(model, x_fit[:, columns], fit_rows.c_star, decay)
        with torch.no_grad():
            table.append(score_row(name, fitted(x_val[:, columns]).squeeze(-1), val_rows, block))
    header = ["head", *(f"k={k + 1}" for k in range(block)), "pooled"]
    print(f"Expected AUROC against acceptance drawn from teacher-forced c* ({len(fit_rows.c_star)} fit rows, "
          f"{len(val_rows.c_star)} validation rows; {run})\n")
    print("| " + " | ".join(header) + " |\n|" + "---|" * len(header))
    for row in table:
        print("| " + " | ".join(row) + " |")
    report = {"run": str(run), "fit_rows": len(fit_rows.c_star), "validation_rows": len(val_rows.c_star),
              "columns": header, "rows": table}
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
    return report


if __name__ == "__main__":
    main()
