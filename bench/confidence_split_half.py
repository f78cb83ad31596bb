"""Decode-time quality of a confidence head from one set of evaluator traces: sequential temperature scaling fitted
on half the prompts, scored on the other half (what selecting on validation prompts allows, where the suites'
held-out table of ``bench/quality.py`` would touch the suites).

    python bench/confidence_split_half.py runs/ablation/traces/tiny-dspark_T1.jsonl [more traces ...]

Prompts are split by sorted prompt id, alternately, so every category lands on both sides; all seeds of a prompt stay
on one side. Per position: held-out ECE of the calibrated survival ``S_k`` and its noise floor, the AUROC of
``S_k`` and of the position's own confidence, and the ceiling (the AUROC of ``c*_k``,
``calibration.heldout.conditional_auroc_bound``) with the ratio of the AUROC of ``S_k`` to it.
"""

from __future__ import annotations

import argparse
from typing import Optional

import numpy as np

from deepspec_train.calibration.cli import survival_arrays
from deepspec_train.calibration.heldout import conditional_auroc_bound, held_out_confidence
from deepspec_train.formats.eval_traces import read_traces


def split_half_lines(path: str) -> list[str]:
    rows = read_traces([path])
    prompts = sorted({str(r.prompt_id) for r in rows})
    fit_prompts = set(prompts[::2])
    fit = [r for r in rows if str(r.prompt_id) in fit_prompts]
    test = [r for r in rows if str(r.prompt_id) not in fit_prompts]
    report = held_out_confidence(survival_arrays(fit), survival_arrays(test))
    ceiling = conditional_auroc_bound(test, len(report.counts))

    def numbers(values) -> str:
        return " ".join(f"{v:.3f}" for v in values)

    return [
        f"{path}: fit on {len(fit_prompts)} prompts ({len(fit)} rounds), scored on {len(prompts) - len(fit_prompts)} "
        f"({len(test)} rounds)",
        f"  ECE held out        {numbers(report.ece)}",
        f"  noise floor         {numbers(report.ece_floor)}",
        f"  AUROC of S_k        {numbers(report.auroc_cumulative)}",
        f"  AUROC own conf.     {numbers(report.auroc_conditional)}",
        f"  ceiling (c*_k)      {numbers(ceiling)}",
        f"  S_k / ceiling       {numbers(np.asarray(report.auroc_cumulative) / np.asarray(ceiling))}",
    ]


def main(argv: Optional[list[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("traces", nargs="+", help="trace JSONL files of a drafter with a confidence head")
    for path in parser.parse_args(argv).traces:
        print("\n".join(split_half_lines(path)))


if __name__ == "__main__":
    main()
