"""The drafter loss on selected positions: CE + TV + confidence BCE, computed chunk by chunk.

Both LM heads (the drafter's and the frozen target's) are applied only at supervised positions, and only
``chunk_size`` positions at a time, so the ``[positions, vocabulary]`` logits of both models never exist in
full -- neither in forward nor in backward. For Qwen3-8B (V = 151,936) 3,584 positions of fp32 logits are
2.2 GB per model; a chunk of 512 is 311 MB.

Gradients are computed analytically chunk by chunk during the forward pass (softmax, TV and CE have closed
form derivatives with respect to the logits) and projected straight onto the inputs, so backward needs no
recomputation and keeps only input-sized gradient buffers. They equal autograd through the naive full-logit
computation (tested against a brute-force reference).

Definitions, per supervised row ``i`` (one block slot), with temperature ``T``:

- target distribution ``p_t = softmax(target_hidden_i @ W_t^T / T)``;
- draft logits ``z_i = draft_hidden_i @ W_d^T (+ markov_rows_i @ markov_w2^T)``, draft distribution
  ``p_d = softmax(z_i / T)``. The temperature applies to both sides so that the draft is trained against the
  distribution it will be sampled from at temperature ``T``; at the default ``T = 1`` nothing changes;
- ``ce_i = -log p_d[label_i]`` (the same tempered draft distribution, so all terms see one draft);
- ``tv_i = 0.5 * sum_j |p_d[j] - p_t[j]|`` and ``c*_i = sum_j min(p_d[j], p_t[j]) = 1 - tv_i`` (detached);
- ``bce_i = BCE(conf_logit_i, c*_i)``;
- the distance term ``dist_i`` is ``tv_i`` (``distance="tv"``) or DeepSpec's ``l1_i = sum_j |p_d[j] - p_t[j]| =
  2 * tv_i`` (``distance="l1"``);
- ``loss = sum_i w_i * (alpha_ce * ce_i + alpha_tv * dist_i + alpha_conf * bce_i) / n_i``. The normalizer
  ``n_i`` is one number for every row (per-token normalisation: the caller passes the number of supervised
  positions across all drafter ranks; default: the local row count) or one per row (per-sequence
  normalisation: the summed position weights of the row's sequence times the number of sequences; see
  ``deepspec_train.losses.normalization``), so that summing gradients over micro-batches and ranks gives the
  step's loss.

Draft vocabulary (EAGLE-3): with ``draft_to_target`` ``[Vd]`` the draft logits live on ``Vd`` draft ids, draft
id ``j`` standing for target id ``draft_to_target[j]``; ``markov_w2`` (if any) then has ``Vd`` rows. Target mass
outside the draft vocabulary is mass the draft can never cover, so it counts fully in TV:
``tv_i = 0.5 * (sum_j |p_d[j] - p_t[d2t[j]]| + 1 - sum_j p_t[d2t[j]])`` and ``c*_i = sum_j min(p_d[j],
p_t[d2t[j]])``. Rows whose label is not in the draft vocabulary get no CE term (their TV and BCE terms stay);
``LossOutput.num_label_outside_draft_vocab`` counts them. With ``l1`` the uncovered mass counts twice too
(``l1_i = 2 * tv_i`` holds with a draft vocabulary as well).

The call is ``selected_logit_loss(rows, settings, normalizer)``: ``rows`` (``SupervisedRows``) holds every
tensor of the call, the optional ones (Markov rows and factor, confidence logits, draft-vocabulary map) included,
as one frozen record that the chunk loop passes down whole; ``settings`` (``LossSettings``) holds the scalar
knobs of ``cfg.loss``, checked once when the record is made.

Gradients reach ``draft_hidden``, ``markov_rows``, ``markov_w2``, ``conf_logits`` and ``draft_head_weight``
(only when it requires grad: EAGLE-3 trains its own head, DSpark's copy of the target head is frozen); never
the target tensors, the weights or ``c*``. Softmax runs in fp32 whatever the input dtype.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Optional

import torch
import torch.nn.functional as F

from deepspec_train.config.schema import LossConfig
from deepspec_train.losses.device_checks import require

_DIFFERENTIABLE = ("draft_hidden", "draft_head_weight", "markov_rows", "markov_w2", "conf_logits")
# The fields of ``SupervisedRows`` with one entry per row: the ones a chunk of rows slices.
_PER_ROW = ("draft_hidden", "target_hidden", "labels", "weights", "markov_rows", "conf_logits")
# The distance term in units of total variation: L1 = sum |p_d - p_t| = 2 TV.
DISTANCE_SCALE = {"tv": 1.0, "l1": 2.0}


@dataclass(frozen=True)
class LossSettings:
    """The scalar knobs of ``selected_logit_loss``, from ``cfg.loss`` once per run (``LossSettings.of``) and
    checked once when the record is made. The position weights and the normaliser are the caller's."""

    temperature: float = 1.0
    alpha_ce: float = 0.1
    alpha_tv: float = 0.9
    alpha_conf: float = 1.0
    distance: str = "tv"
    chunk_size: int = 1024

    def __post_init__(self) -> None:
        if self.distance not in DISTANCE_SCALE:
            raise ValueError(f"distance must be one of {sorted(DISTANCE_SCALE)}, got {self.distance!r}")
        if self.chunk_size <= 0:
            raise ValueError(f"chunk_size must be positive, got {self.chunk_size}")
        if self.temperature <= 0:
            raise ValueError(f"temperature must be positive, got {self.temperature}")

    @classmethod
    def of(cls, loss: LossConfig) -> "LossSettings":
        """The settings of a recipe's ``loss`` section."""
        return cls(loss.temperature, loss.alpha_ce, loss.alpha_tv, loss.alpha_conf, loss.distance, loss.chunk_size)


@dataclass(frozen=True)
class SupervisedRows:
    """The tensors of one loss call over ``N`` supervised rows; see ``selected_logit_loss`` for the shapes.

    The last four are optional: only a drafter with a Markov head has ``markov_rows`` and ``markov_w2``, only one
    with a confidence head ``conf_logits``, only one with a reduced draft vocabulary ``draft_to_target``.
    """

    draft_hidden: torch.Tensor
    draft_head_weight: torch.Tensor
    target_hidden: torch.Tensor
    target_head_weight: torch.Tensor
    labels: torch.Tensor
    weights: torch.Tensor
    markov_rows: Optional[torch.Tensor] = None
    markov_w2: Optional[torch.Tensor] = None
    conf_logits: Optional[torch.Tensor] = None
    draft_to_target: Optional[torch.Tensor] = None

    @property
    def num_rows(self) -> int:
        return self.draft_hidden.shape[0]

    def select(self, rows: slice) -> "SupervisedRows":
        """The same record for ``rows`` only: per-row tensors sliced, the heads and maps kept whole."""
        return replace(self, **{name: _rows_of(getattr(self, name), rows) for name in _PER_ROW})


def _rows_of(tensor: Optional[torch.Tensor], rows: slice) -> Optional[torch.Tensor]:
    return None if tensor is None else tensor[rows]


@dataclass
class LossOutput:
    """The loss and its detached diagnostics.

    ``ce_sum``, ``tv_sum`` and ``conf_sum`` are ``sum_i w_i * term_i`` over the local rows: weighted by the
    position weights, not by the alphas, and not divided by the normalizer. ``tv_sum`` is the total variation
    whichever ``distance`` the loss uses (``1 - c*`` summed), so logs stay comparable across the two.
    """

    loss: torch.Tensor
    ce_sum: torch.Tensor
    tv_sum: torch.Tensor
    conf_sum: torch.Tensor
    c_star: torch.Tensor
    draft_correct: torch.Tensor
    conf_prob: torch.Tensor | None
    # A 0-dim integer tensor on the inputs' device (reading it is the caller's choice: it costs a host sync).
    num_label_outside_draft_vocab: torch.Tensor


@dataclass(frozen=True)
class _Coefficients:
    """The scalar knobs of the loss and its compute dtype, passed down the chunk loop as one value."""

    compute_dtype: torch.dtype
    temperature: float
    alpha_ce: float
    # alpha_tv times 1 (TV) or 2 (L1 = 2 TV): the weight of the total variation in the loss.
    alpha_tv: float
    alpha_conf: float


class _PrecomputedGradients(torch.autograd.Function):
    """Return a loss value whose backward hands out gradients that were computed in the forward pass."""

    @staticmethod
    def forward(ctx, value: torch.Tensor, grads: tuple, *inputs: torch.Tensor):  # type: ignore[override]
        ctx.grads = grads
        return value.clone()

    @staticmethod
    def backward(ctx, grad_output: torch.Tensor):  # type: ignore[override]
        scaled = tuple(None if g is None else g * grad_output.to(g.dtype) for g in ctx.grads)
        return (None, None, *scaled)


def selected_logit_loss(
    rows: SupervisedRows,
    settings: LossSettings = LossSettings(),
    normalizer: float | torch.Tensor | None = None,
) -> LossOutput:
    """Chunked CE + TV (or L1) + confidence loss over ``N`` supervised rows; see the module docstring.

    Shapes in ``rows``: ``draft_hidden [N, d]``, ``draft_head_weight [Vd, d]``, ``target_hidden [N, dt]``,
    ``target_head_weight [V, dt]``, ``labels [N]`` (target ids), ``weights [N]``, ``markov_rows [N, r]``,
    ``markov_w2 [Vd, r]``, ``conf_logits [N]``, ``draft_to_target [Vd]`` (``Vd == V`` without it); ``normalizer``
    a positive number or a positive ``[N]`` tensor (one denominator per row).
    """
    _check_inputs(rows)
    num_rows = rows.num_rows
    # Softmax and the loss terms run in fp32 at least (fp64 stays fp64, which the reference tests rely on).
    compute_dtype = torch.promote_types(rows.draft_hidden.dtype, torch.float32)
    row_normalizer = _row_normalizer(normalizer, num_rows, compute_dtype, rows.draft_hidden.device)
    coeffs = _Coefficients(compute_dtype, float(settings.temperature), float(settings.alpha_ce),
                           float(settings.alpha_tv) * DISTANCE_SCALE[settings.distance], float(settings.alpha_conf))

    differentiable = {name: getattr(rows, name) for name in _DIFFERENTIABLE}
    wanted = {
        name: torch.is_grad_enabled() and t is not None and t.requires_grad
        for name, t in differentiable.items()
    }
    with torch.no_grad():
        result = _run_chunks(_detached(rows, compute_dtype), row_normalizer, coeffs, settings.chunk_size, wanted)
    loss = result.pop("loss")
    grads = result.pop("grads")
    if any(wanted.values()):
        inputs = tuple(differentiable[name] if wanted[name] else None for name in _DIFFERENTIABLE)
        grad_tuple = tuple(grads.get(name) for name in _DIFFERENTIABLE)
        loss = _PrecomputedGradients.apply(loss, grad_tuple, *inputs)
    return LossOutput(loss=loss, **result)


def _detached(rows: SupervisedRows, compute_dtype: torch.dtype) -> SupervisedRows:
    """The chunk loop's copy of ``rows``: no autograd history, integer labels, weights in the compute dtype."""
    return SupervisedRows(
        rows.draft_hidden.detach(), rows.draft_head_weight.detach(), rows.target_hidden.detach(),
        rows.target_head_weight.detach(), rows.labels.long(), rows.weights.detach().to(compute_dtype),
        markov_rows=None if rows.markov_rows is None else rows.markov_rows.detach(),
        markov_w2=None if rows.markov_w2 is None else rows.markov_w2.detach(),
        conf_logits=None if rows.conf_logits is None else rows.conf_logits.detach(),
        draft_to_target=rows.draft_to_target,
    )


def _row_normalizer(
    normalizer: float | torch.Tensor | None, num_rows: int, dtype: torch.dtype, device: torch.device
) -> torch.Tensor:
    """The denominator of every row as a ``[N]`` tensor (a scalar normalizer broadcast; default: ``N``)."""
    if normalizer is None:
        normalizer = float(max(num_rows, 1))
    if isinstance(normalizer, torch.Tensor) and normalizer.dim() > 0:
        if normalizer.shape != (num_rows,):
            raise ValueError(f"a per-row normalizer must be [{num_rows}], got {tuple(normalizer.shape)}")
        # Checked on the given tensor (the per-sequence normaliser builds it on the host from positive sums).
        if num_rows:
            require((normalizer > 0).all(), "every row's normalizer must be positive")
        return normalizer.detach().to(device=device, dtype=dtype)
    if isinstance(normalizer, torch.Tensor):
        # A step's token count reduced over the ranks on the device: checked there, broadcast without a read.
        require(normalizer > 0, "normalizer must be positive")
        return normalizer.detach().to(device=device, dtype=dtype).expand(num_rows)
    if float(normalizer) <= 0:
        raise ValueError(f"normalizer must be positive, got {float(normalizer)}")
    return torch.full((num_rows,), float(normalizer), dtype=dtype, device=device)


def _run_chunks(
    rows: SupervisedRows,
    normalizer: torch.Tensor,
    coeffs: _Coefficients,
    chunk_size: int,
    wanted: dict[str, bool],
) -> dict:
    """Loop over row chunks of the detached ``rows``; return the loss value, detached diagnostics and the
    requested gradients."""
    num_rows = rows.num_rows
    device = rows.draft_hidden.device
    weights = rows.weights
    row_coef = weights / normalizer
    draft_label, label_in_draft = _labels_in_draft_vocab(
        rows.labels, rows.draft_to_target, rows.target_head_weight.shape[0]
    )
    need_logit_grad = any(wanted[name] for name in _DIFFERENTIABLE if name != "conf_logits")
    grads = _gradient_buffers(wanted, rows)
    # The Markov bias is accumulated into compute-dtype logits: cast W2 once, not once per chunk.
    markov_w2_compute = None if rows.markov_w2 is None else rows.markov_w2.to(coeffs.compute_dtype)

    def per_row(dtype: torch.dtype = coeffs.compute_dtype) -> torch.Tensor:
        return torch.zeros(num_rows, dtype=dtype, device=device)

    ce, tv, bce, c_star = per_row(), per_row(), per_row(), per_row()
    draft_correct = per_row(torch.bool)
    conf_prob = None if rows.conf_logits is None else per_row()

    for start in range(0, num_rows, chunk_size):
        span = slice(start, min(start + chunk_size, num_rows))
        chunk_rows = rows.select(span)
        chunk = _chunk_terms(
            chunk_rows, draft_label[span], label_in_draft[span], row_coef[span], markov_w2_compute, coeffs,
            need_logit_grad,
        )
        ce[span], tv[span], c_star[span] = chunk["ce"], chunk["tv"], chunk["c_star"]
        draft_correct[span] = chunk["draft_correct"]
        if chunk_rows.conf_logits is not None:
            x = chunk_rows.conf_logits.to(coeffs.compute_dtype)
            bce[span] = F.binary_cross_entropy_with_logits(x, chunk["c_star"], reduction="none")
            conf_prob[span] = torch.sigmoid(x)
            if wanted["conf_logits"]:
                # d BCE(x, c) / dx = sigmoid(x) - c, with c* held constant.
                d_conf = row_coef[span] * coeffs.alpha_conf * (conf_prob[span] - chunk["c_star"])
                grads["conf_logits"][span] = d_conf
        if need_logit_grad:
            _project_logit_grad(chunk["logit_grad"], chunk_rows, span, grads)
        # Free this chunk's [C, V] gradient before the next chunk allocates its logits.
        del chunk

    combined = coeffs.alpha_ce * ce.double() + coeffs.alpha_tv * tv.double() + coeffs.alpha_conf * bce.double()
    w64 = weights.double()
    return {
        "loss": (w64 * combined / normalizer.double()).sum().to(coeffs.compute_dtype),
        "grads": _cast_to_input_dtypes(grads, rows),
        "ce_sum": (w64 * ce.double()).sum().to(coeffs.compute_dtype),
        "tv_sum": (w64 * tv.double()).sum().to(coeffs.compute_dtype),
        "conf_sum": (w64 * bce.double()).sum().to(coeffs.compute_dtype),
        "c_star": c_star,
        "draft_correct": draft_correct,
        "conf_prob": conf_prob,
        "num_label_outside_draft_vocab": (~label_in_draft).sum(),
    }


def _chunk_terms(
    chunk: SupervisedRows,
    draft_label: torch.Tensor,
    label_in_draft: torch.Tensor,
    row_coef: torch.Tensor,
    markov_w2: torch.Tensor | None,
    coeffs: _Coefficients,
    need_logit_grad: bool,
) -> dict[str, torch.Tensor]:
    """Per-row CE, TV, c* and the draft's argmax hits for one chunk of rows, plus d loss / d draft logits when
    asked (``markov_w2`` is the chunk's Markov factor already cast to the compute dtype).

    Works in place on a handful of ``[C, V]`` fp32 buffers: those are the whole memory cost of the loss.
    """
    t = coeffs.temperature
    labels, draft_to_target = chunk.labels, chunk.draft_to_target
    target_logits = (chunk.target_hidden @ chunk.target_head_weight.T).to(coeffs.compute_dtype)
    p_target = torch.softmax(target_logits.div_(t), dim=-1)
    del target_logits
    covered = p_target if draft_to_target is None else p_target.index_select(1, draft_to_target)
    del p_target

    logits = (chunk.draft_hidden @ chunk.draft_head_weight.T).to(coeffs.compute_dtype)
    if chunk.markov_rows is not None:
        # Accumulate the bias inside the GEMM (beta = 1): no [C, V] temporary and no separate add pass.
        logits.addmm_(chunk.markov_rows.to(logits.dtype), markov_w2.T)
    draft_argmax = logits.argmax(dim=-1)
    draft_token = draft_argmax if draft_to_target is None else draft_to_target[draft_argmax]
    logits.div_(t)
    log_norm = torch.logsumexp(logits, dim=-1)
    label_logit = logits.gather(1, draft_label.unsqueeze(1)).squeeze(1)
    ce = torch.where(label_in_draft, log_norm - label_logit, torch.zeros_like(log_norm))
    p_draft = logits.sub_(log_norm.unsqueeze(1)).exp_()
    del logits

    diff = p_draft - covered
    abs_sum = torch.linalg.vector_norm(diff, ord=1, dim=-1)
    uncovered = 0.0 if draft_to_target is None else 1.0 - covered.sum(dim=-1)
    tv = 0.5 * (abs_sum + uncovered)
    c_star = torch.minimum(p_draft, covered).sum(dim=-1)
    del covered

    out = {"ce": ce, "tv": tv, "c_star": c_star, "draft_correct": draft_token == labels}
    if need_logit_grad:
        out["logit_grad"] = _draft_logit_grad(diff, p_draft, draft_label, label_in_draft, row_coef, coeffs)
    return out


def _draft_logit_grad(
    diff: torch.Tensor,
    p_draft: torch.Tensor,
    draft_label: torch.Tensor,
    label_in_draft: torch.Tensor,
    row_coef: torch.Tensor,
    coeffs: _Coefficients,
) -> torch.Tensor:
    """d loss / d draft logits for one chunk, built in place in ``diff``'s buffer.

    With ``u = logits / T`` and ``p = softmax(u)``: ``d TV / d p_j = sign(p_j - q_j) / 2`` (the uncovered mass
    does not depend on the draft), the softmax Jacobian turns a gradient ``g`` over ``p`` into
    ``p * (g - <p, g>)`` over ``u``, and ``d CE / d u = p - onehot(label)``. Dividing by ``T`` maps back to
    the logits. ``sign(0) = 0`` matches autograd's derivative of ``abs`` at 0.
    """
    sign = diff.sign_()
    sign_mean = torch.linalg.vecdot(p_draft, sign)
    grad = sign.sub_(sign_mean.unsqueeze(1)).mul_(p_draft).mul_(0.5 * coeffs.alpha_tv)
    ce_scale = (coeffs.alpha_ce * label_in_draft.to(row_coef.dtype)).unsqueeze(1)
    grad.addcmul_(p_draft, ce_scale)
    rows = torch.arange(grad.shape[0], device=grad.device)
    grad.index_put_((rows, draft_label), -ce_scale.squeeze(1), accumulate=True)
    return grad.mul_((row_coef / coeffs.temperature).unsqueeze(1))


def _project_logit_grad(
    logit_grad: torch.Tensor, chunk: SupervisedRows, rows: slice, grads: dict[str, torch.Tensor]
) -> None:
    """Chain rule through ``logits = h @ W^T + m @ W2^T`` for one chunk of rows (``rows`` locates the chunk in
    the row-shaped gradient buffers)."""
    h, markov_rows, markov_w2 = chunk.draft_hidden, chunk.markov_rows, chunk.markov_w2
    g = logit_grad.to(h.dtype)
    if "draft_hidden" in grads:
        grads["draft_hidden"][rows] = g @ chunk.draft_head_weight
    if "draft_head_weight" in grads:
        _accumulate_product(grads["draft_head_weight"], g.T, h)
    if "markov_rows" in grads:
        grads["markov_rows"][rows] = g.to(markov_w2.dtype) @ markov_w2
    if "markov_w2" in grads:
        _accumulate_product(grads["markov_w2"], g.to(markov_rows.dtype).T, markov_rows)


def _accumulate_product(acc: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> None:
    """``acc += a @ b``, without a weight-sized temporary when the dtypes allow it."""
    if a.dtype == acc.dtype:
        acc.addmm_(a, b)
    else:
        acc.add_(a @ b)


def _gradient_buffers(wanted: dict[str, bool], rows: SupervisedRows) -> dict[str, torch.Tensor]:
    """Gradient buffers for the wanted inputs; row-shaped ones are filled per chunk, weight-shaped ones
    accumulate over chunks and so accumulate in fp32 at least, whatever the weight dtype."""
    shapes = {name: getattr(rows, name) for name in _DIFFERENTIABLE}
    accumulated = {"draft_head_weight", "markov_w2"}
    return {
        name: torch.zeros_like(t, dtype=torch.promote_types(t.dtype, torch.float32)) if name in accumulated
        else torch.empty_like(t)
        for name, t in shapes.items() if wanted[name]
    }


def _cast_to_input_dtypes(grads: dict[str, torch.Tensor], rows: SupervisedRows) -> dict[str, torch.Tensor]:
    """Autograd requires each gradient in its input's dtype."""
    return {name: g.to(getattr(rows, name).dtype) for name, g in grads.items()}


def _labels_in_draft_vocab(
    labels: torch.Tensor, draft_to_target: torch.Tensor | None, target_vocab: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Map target-id labels to draft ids; return (draft id, or 0 where absent) and the in-vocabulary mask."""
    if draft_to_target is None:
        return labels, torch.ones_like(labels, dtype=torch.bool)
    target_to_draft = torch.full((target_vocab,), -1, dtype=torch.long, device=labels.device)
    target_to_draft[draft_to_target] = torch.arange(draft_to_target.numel(), device=labels.device)
    draft_label = target_to_draft[labels]
    return draft_label.clamp_min(0), draft_label >= 0


def _check_inputs(rows: SupervisedRows) -> None:
    """Fail early, with the offending shapes, rather than deep inside a chunk. Shapes are checked on the host;
    id ranges on the tensors' device (``device_checks.require``: no host sync per call)."""
    draft_head_weight, target_hidden, target_head_weight = (
        rows.draft_head_weight, rows.target_hidden, rows.target_head_weight
    )
    labels, markov_rows, markov_w2, draft_to_target = (
        rows.labels, rows.markov_rows, rows.markov_w2, rows.draft_to_target
    )
    n, d = rows.draft_hidden.shape
    vd = draft_head_weight.shape[0]
    v = target_head_weight.shape[0]

    def expect(ok: bool, what: str) -> None:
        if not ok:
            raise ValueError(what)

    expect(draft_head_weight.shape[1] == d, f"draft head {tuple(draft_head_weight.shape)} vs hidden {d}")
    expect(target_hidden.shape[0] == n and target_hidden.shape[1] == target_head_weight.shape[1],
           f"target hidden {tuple(target_hidden.shape)} vs head {tuple(target_head_weight.shape)} for {n} rows")
    expect(labels.shape == (n,) and not labels.is_floating_point(), f"labels must be integer [{n}]")
    expect(rows.weights.shape == (n,), f"weights must be [{n}], got {tuple(rows.weights.shape)}")
    expect((markov_rows is None) == (markov_w2 is None), "markov_rows and markov_w2 go together")
    if markov_rows is not None:
        expect(markov_rows.shape[0] == n and markov_w2.shape == (vd, markov_rows.shape[1]),
               f"markov rows {tuple(markov_rows.shape)} / w2 {tuple(markov_w2.shape)} vs {n} rows, {vd} ids")
    if rows.conf_logits is not None:
        expect(rows.conf_logits.shape == (n,), f"conf_logits must be [{n}], got {tuple(rows.conf_logits.shape)}")
    if draft_to_target is None:
        expect(vd == v, f"draft vocabulary {vd} != target vocabulary {v} needs draft_to_target")
    else:
        expect(draft_to_target.shape == (vd,), f"draft_to_target must be [{vd}]")
        expect(draft_to_target.dtype == torch.long, "draft_to_target must be a LongTensor")
        if vd:
            require((draft_to_target.min() >= 0) & (draft_to_target.max() < v),
                    "draft_to_target ids must be target ids")
    if n:
        require((labels.min() >= 0) & (labels.max() < v), "labels must be target ids in [0, V)")
