"""W&B runs of a drafter comparison (``deepspec eval`` with several drafters): one run per drafter in the group
of the training runs, so the group's workspace puts the drafters side by side without hand work.

Every run logs the same keys, which is what lets W&B overlay the runs of a group in one panel:

- per position ``k`` (logged at step ``k``): ``eval/T<t>/acceptance/<suite>`` = ``P(A_k | A_<k)``, so the default
  line panels show each suite's acceptance curve of every drafter;
- in the summary: ``eval/T<t>/tau/<suite>``, ``eval/T<t>/tau/macro_avg`` and, for drafters other than the
  baseline, ``eval/T<t>/ratio/<suite>`` with ``_low`` / ``_high`` interval ends;
- in the summary, per position axis and bucket (``evaluation.position_buckets``):
  ``eval/T<t>/tau_by_<axis>_position/<suite>/<bucket>`` with ``_low`` / ``_high`` and ``_rounds``, and for
  drafters other than the baseline ``eval/T<t>/ratio_by_<axis>_position/<suite>/<bucket>`` with its interval
  (buckets without rounds left out);
- ``eval/T<t>/table1``: the whole Table 1 (all drafters, every suite), ``eval/T<t>/tau_per_suite``: a bar chart
  of this drafter's tau per suite, ``eval/T<t>/acceptance_curves``: its per-position curves, one line per suite,
  and the comparison's PNGs.

Runs are offline unless ``WANDB_MODE`` says otherwise (``wandb sync`` uploads them later); their files go under
``WANDB_DIR`` when set, else under the comparison's output directory.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Optional, Sequence

from deepspec_train.evaluation.paired_bootstrap import RatioEstimate
from deepspec_train.evaluation.table1 import MACRO, Table1, tau_rows
from deepspec_train.metrics.sinks import WandbSink


def _prefix(table: Table1) -> str:
    return f"eval/T{table.temperature:g}"


def position_metrics(tables: Sequence[Table1], drafter: str, k: int) -> dict[str, float]:
    """This drafter's ``P(A_k | A_<k)`` on every suite at every temperature (positions it did not reach left out)."""
    metrics = {}
    for table in tables:
        for suite, curve in table.acceptance[drafter].items():
            if k <= len(curve) and curve[k - 1] is not None:
                metrics[f"{_prefix(table)}/acceptance/{suite}"] = curve[k - 1]
    return metrics


def _with_interval(metrics: dict[str, float], key: str, value: float, estimate: Optional[RatioEstimate]) -> None:
    metrics[key] = value
    if estimate is not None:
        metrics[f"{key}_low"], metrics[f"{key}_high"] = estimate.low, estimate.high


def position_summary(table: Table1, drafter: str) -> dict[str, float]:
    """This drafter's tau (and ratio against the baseline) per position axis, suite and bucket."""
    metrics: dict[str, float] = {}
    for axis, by_drafter in table.positions.items():
        for suite, buckets in by_drafter[drafter].items():
            for b in buckets:
                if b.tau is None:
                    continue
                key = f"{_prefix(table)}/tau_by_{axis}_position/{suite}/{b.bucket}"
                _with_interval(metrics, key, b.tau, b.interval)
                metrics[f"{key}_rounds"] = b.rounds
                if b.ratio is not None:
                    _with_interval(metrics, f"{_prefix(table)}/ratio_by_{axis}_position/{suite}/{b.bucket}",
                                   b.ratio.value, b.ratio)
    return metrics


def summary_metrics(tables: Sequence[Table1], drafter: str) -> dict[str, float]:
    metrics: dict[str, float] = {}
    for table in tables:
        metrics.update(position_summary(table, drafter))
        prefix = _prefix(table)
        metrics.update({f"{prefix}/tau/{s}": v for s, v in table.tau[drafter].items()})
        metrics[f"{prefix}/tau/{MACRO.replace(' ', '_')}"] = table.macro_tau[drafter]
        for suite, estimate in table.ratios.get(drafter, {}).items():
            metrics[f"{prefix}/ratio/{suite}"] = estimate.value
            metrics[f"{prefix}/ratio/{suite}_low"] = estimate.low
            metrics[f"{prefix}/ratio/{suite}_high"] = estimate.high
    return metrics


def _charts(wandb: Any, table: Table1, drafter: str) -> dict[str, Any]:
    prefix, title = _prefix(table), f"{drafter}, T = {table.temperature:g}"
    columns, rows = tau_rows(table)
    bars = wandb.Table(columns=["suite", "tau"], data=[[s, table.tau[drafter][s]] for s in table.suites])
    curves = [(s, [(k, v) for k, v in enumerate(table.acceptance[drafter][s], 1) if v is not None])
              for s in table.suites]
    curves = [(s, points) for s, points in curves if points]
    charts = {
        f"{prefix}/table1": wandb.Table(columns=columns, data=rows),
        f"{prefix}/tau_per_suite": wandb.plot.bar(bars, "suite", "tau", title=f"tau per suite, {title}"),
    }
    if curves:
        charts[f"{prefix}/acceptance_curves"] = wandb.plot.line_series(
            xs=[[k for k, _ in points] for _, points in curves], ys=[[v for _, v in points] for _, points in curves],
            keys=[s for s, _ in curves], title=f"P(A_k | A_<k), {title}", xname="k")
    return charts


def log_drafter_runs(tables: Sequence[Table1], kinds: dict[str, str], plots: Sequence[Path], project: str,
                     group: str, out_dir: Path) -> list[Path]:
    """Log one run per drafter of ``tables`` into ``group``; returns the runs' local directories."""
    import wandb

    run_dirs = []
    width = max(len(c) for t in tables for by_suite in t.acceptance.values() for c in by_suite.values())
    for drafter, kind in kinds.items():
        config = {"drafter_kind": kind, "baseline": tables[0].baseline, "suites": list(tables[0].suites),
                  "temperatures": [t.temperature for t in tables], "prompts": tables[0].prompts}
        # Directory and group go to each run explicitly: W&B keeps the first run's settings for the whole process.
        sink = WandbSink(project, f"eval {drafter}", config, mode="offline",
                         dir=os.environ.get("WANDB_DIR") or out_dir, group=group,
                         tags=[f"drafter:{kind}", "eval:table1"], job_type="eval")
        try:
            for k in range(1, width):
                sink.log(position_metrics(tables, drafter, k), step=k)
            last = position_metrics(tables, drafter, width)
            for table in tables:
                last.update(_charts(wandb, table, drafter))
            last.update({f"eval/{p.stem}": wandb.Image(str(p)) for p in plots})
            sink.run.log(last, step=width)
            sink.run.summary.update(summary_metrics(tables, drafter))
            # run.dir is the run's "files" folder; its parent is the offline run that `wandb sync` uploads.
            run_dirs.append(Path(sink.run.dir).parent)
        finally:
            sink.finish()
    return run_dirs
