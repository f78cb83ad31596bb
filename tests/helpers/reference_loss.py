"""Brute-force reference for the selected-logit loss, used only by the tests.

It builds the full ``[N, V]`` logits of both models and evaluates the loss one row at a time with the
textbook formulas, letting autograd produce the gradients. Slow and memory-hungry on purpose: it shares no
code with the chunked implementation, so agreement between the two is evidence that both are right.
"""

from __future__ import annotations

import math

import torch


def reference_loss(
    draft_hidden: torch.Tensor,
    draft_head_weight: torch.Tensor,
    target_hidden: torch.Tensor,
    target_head_weight: torch.Tensor,
    labels: torch.Tensor,
    weights: torch.Tensor,
    *,
    markov_rows: torch.Tensor | None = None,
    markov_w2: torch.Tensor | None = None,
    conf_logits: torch.Tensor | None = None,
    draft_to_target: torch.Tensor | None = None,
    temperature: float = 1.0,
    alpha_ce: float = 0.1,
    alpha_tv: float = 0.9,
    alpha_conf: float = 1.0,
    distance: str = "tv",
    normalizer: float | torch.Tensor | None = None,
) -> dict:
    """Return the loss (differentiable) and per-row terms as Python lists / tensors.

    ``distance="l1"`` uses ``sum_j |p_d[j] - p_t[j]|`` plus the uncovered target mass, written out rather than
    derived from TV; ``normalizer`` may be a number or one denominator per row.
    """
    n = draft_hidden.shape[0]
    target_logits = target_hidden @ target_head_weight.T
    draft_logits = draft_hidden @ draft_head_weight.T
    if markov_rows is not None:
        draft_logits = draft_logits + markov_rows @ markov_w2.T
    draft_ids = list(range(draft_head_weight.shape[0])) if draft_to_target is None else draft_to_target.tolist()
    draft_id_of_target = {target_id: j for j, target_id in enumerate(draft_ids)}

    if normalizer is None:
        normalizer = float(max(n, 1))
    row_norm = [float(x) for x in normalizer] if isinstance(normalizer, torch.Tensor) and normalizer.dim() else [
        float(normalizer)] * n
    total = draft_hidden.new_zeros(())
    rows = {"ce": [], "tv": [], "bce": [], "c_star": [], "draft_correct": [], "target_correct": [],
            "conf_prob": []}
    for i in range(n):
        p_target = torch.softmax(target_logits[i] / temperature, dim=0)
        p_draft = torch.softmax(draft_logits[i] / temperature, dim=0)
        covered = torch.stack([p_target[t] for t in draft_ids])
        tv = 0.5 * ((p_draft - covered).abs().sum() + (1.0 - covered.sum()))
        l1 = (p_draft - covered).abs().sum() + (1.0 - covered.sum())
        dist = {"tv": tv, "l1": l1}[distance]
        c_star = torch.minimum(p_draft, covered).sum().detach()
        label = int(labels[i])
        ce = -torch.log(p_draft[draft_id_of_target[label]]) if label in draft_id_of_target else total * 0
        if conf_logits is None:
            bce = total * 0
        else:
            prob = torch.sigmoid(conf_logits[i])
            bce = -(c_star * torch.log(prob) + (1 - c_star) * torch.log(1 - prob))
            rows["conf_prob"].append(float(prob.detach()))
        total = total + weights[i] * (alpha_ce * ce + alpha_tv * dist + alpha_conf * bce) / row_norm[i]
        rows["ce"].append(float(ce.detach()))
        rows["tv"].append(float(tv.detach()))
        rows["bce"].append(float(bce.detach()))
        rows["c_star"].append(float(c_star))
        rows["draft_correct"].append(draft_ids[int(draft_logits[i].argmax())] == label)
        rows["target_correct"].append(int(target_logits[i].argmax()) == label)
    w = weights.tolist()
    return {
        "loss": total,
        "ce_sum": math.fsum(wi * x for wi, x in zip(w, rows["ce"])),
        "tv_sum": math.fsum(wi * x for wi, x in zip(w, rows["tv"])),
        "conf_sum": math.fsum(wi * x for wi, x in zip(w, rows["bce"])),
        **rows,
    }
