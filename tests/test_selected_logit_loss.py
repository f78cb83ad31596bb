"""Chunked selected-logit loss vs the brute-force reference: values, gradients, diagnostics, memory shape."""

from __future__ import annotations

import math
from dataclasses import fields

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from deepspec_train.losses import LossOutput, LossSettings, SupervisedRows, decay_weights, selected_logit_loss
from tests.helpers.reference_loss import reference_loss

N, D, DT, R, V, VD = 11, 8, 6, 5, 50, 23
DIFFERENTIABLE = ("draft_hidden", "draft_head_weight", "markov_rows", "markov_w2", "conf_logits")
SETTINGS = {f.name for f in fields(LossSettings)}


def make_problem(
    *, markov: bool = False, conf: bool = False, draft_vocab: bool = False, trainable_head: bool = False,
    dtype: torch.dtype = torch.float64, n: int = N, seed: int = 0,
) -> dict:
    """Random inputs; targets require grad too, so that a leak of gradient into them would show."""
    g = torch.Generator().manual_seed(seed)
    vd = VD if draft_vocab else V

    def rand(*shape: int, scale: float = 1.0) -> torch.Tensor:
        return (torch.randn(*shape, generator=g, dtype=torch.float64) * scale).to(dtype)

    p = {
        "draft_hidden": rand(n, D).requires_grad_(),
        "draft_head_weight": rand(vd, D).requires_grad_(trainable_head),
        "target_hidden": rand(n, DT).requires_grad_(),
        "target_head_weight": rand(V, DT).requires_grad_(),
        "labels": torch.randint(0, V, (n,), generator=g),
        "weights": decay_weights(torch.arange(n) % 7, 4.0).to(dtype),
    }
    if markov:
        p["markov_rows"] = rand(n, R).requires_grad_()
        p["markov_w2"] = rand(vd, R, scale=0.5).requires_grad_()
    if conf:
        p["conf_logits"] = rand(n).requires_grad_()
    if draft_vocab:
        p["draft_to_target"] = torch.randperm(V, generator=g)[:vd]
        # Half the labels inside the draft vocabulary, the rest anywhere (mostly outside).
        inside = p["draft_to_target"][torch.randint(0, vd, (n,), generator=g)]
        p["labels"] = torch.where(torch.arange(n) % 2 == 0, inside, p["labels"])
    return p


def chunked(normalizer: float | torch.Tensor | None = None, **arguments) -> LossOutput:
    """The loss under test, called with the reference's flat keyword arguments: the tensors go into
    ``SupervisedRows``, the knobs into ``LossSettings``."""
    settings = {k: v for k, v in arguments.items() if k in SETTINGS}
    tensors = {k: v for k, v in arguments.items() if k not in SETTINGS}
    return selected_logit_loss(SupervisedRows(**tensors), LossSettings(**settings), normalizer)


def fresh(problem: dict) -> dict:
    """Independent leaf copies, so each implementation gets its own .grad."""
    return {k: v.detach().clone().requires_grad_(v.requires_grad) if v.is_floating_point() else v
            for k, v in problem.items()}


def grads_of(inputs: dict) -> dict:
    return {k: inputs[k].grad for k in DIFFERENTIABLE if k in inputs and inputs[k].requires_grad}


def run_both(problem: dict, **kwargs) -> tuple:
    chunk_size = kwargs.pop("chunk_size", 4)
    mine_in, ref_in = fresh(problem), fresh(problem)
    mine = chunked(**mine_in, chunk_size=chunk_size, **kwargs)
    ref = reference_loss(**ref_in, **kwargs)
    mine.loss.backward()
    ref["loss"].backward()
    return mine, ref, mine_in, ref_in


def assert_matches(mine, ref, mine_in: dict, ref_in: dict, rtol: float = 1e-5, atol: float = 1e-9) -> None:
    close = dict(rtol=rtol, atol=atol, check_dtype=False)
    torch.testing.assert_close(mine.loss, ref["loss"].detach(), **close)
    for name in ("ce_sum", "tv_sum", "conf_sum"):
        torch.testing.assert_close(mine.__dict__[name], torch.tensor(ref[name]), **close)
    torch.testing.assert_close(mine.c_star, torch.tensor(ref["c_star"]), **close)
    assert mine.draft_correct.tolist() == ref["draft_correct"]
    if ref["conf_prob"]:
        torch.testing.assert_close(mine.conf_prob, torch.tensor(ref["conf_prob"]), **close)
    else:
        assert mine.conf_prob is None
    mine_grads, ref_grads = grads_of(mine_in), grads_of(ref_in)
    assert mine_grads.keys() == ref_grads.keys()
    for name, grad in ref_grads.items():
        assert mine_grads[name] is not None, name
        torch.testing.assert_close(mine_grads[name], grad, rtol=rtol, atol=atol, check_dtype=False,
                                   msg=lambda m: f"{name}: {m}")
    for name in ("target_hidden", "target_head_weight"):
        assert mine_in[name].grad is None, f"gradient leaked into {name}"


CASES = {
    "plain": {},
    "markov": {"markov": True},
    "confidence": {"conf": True},
    "markov_confidence": {"markov": True, "conf": True},
    "draft_vocab": {"draft_vocab": True, "markov": True, "conf": True},
    "trainable_head": {"trainable_head": True, "markov": True, "conf": True},
    "draft_vocab_trainable_head": {"draft_vocab": True, "trainable_head": True, "conf": True},
}


@pytest.mark.parametrize("case", CASES)
def test_matches_brute_force(case: str) -> None:
    assert_matches(*run_both(make_problem(**CASES[case])))


@pytest.mark.parametrize("chunk_size", [1, 3, N, N + 5])
def test_chunk_size_does_not_change_values_or_gradients(chunk_size: int) -> None:
    problem = make_problem(markov=True, conf=True, trainable_head=True, seed=1)
    assert_matches(*run_both(problem, chunk_size=chunk_size))


@pytest.mark.parametrize("temperature", [0.6, 1.7])
def test_temperature(temperature: float) -> None:
    problem = make_problem(markov=True, conf=True, draft_vocab=True, trainable_head=True, seed=2)
    assert_matches(*run_both(problem, temperature=temperature))


def test_alphas_and_normalizer() -> None:
    problem = make_problem(markov=True, conf=True, seed=3)
    assert_matches(*run_both(problem, alpha_ce=0.3, alpha_tv=0.5, alpha_conf=2.0, normalizer=123.0))


@pytest.mark.parametrize("case", ["plain", "markov_confidence", "draft_vocab", "draft_vocab_trainable_head"])
def test_l1_distance_matches_brute_force(case: str) -> None:
    assert_matches(*run_both(make_problem(**CASES[case], seed=11), distance="l1"))


def test_l1_is_twice_tv_in_loss_and_gradient() -> None:
    """With only the distance term, L1 gives exactly twice TV's loss and gradients (its diagnostics stay TV)."""
    problem = make_problem(markov=True, draft_vocab=True, seed=12)
    outs, grads = {}, {}
    for distance in ("tv", "l1"):
        inputs = fresh(problem)
        outs[distance] = chunked(**inputs, alpha_ce=0.0, distance=distance, chunk_size=4)
        outs[distance].loss.backward()
        grads[distance] = grads_of(inputs)
    torch.testing.assert_close(outs["l1"].loss, 2 * outs["tv"].loss)
    torch.testing.assert_close(outs["l1"].tv_sum, outs["tv"].tv_sum)
    for name, grad in grads["tv"].items():
        torch.testing.assert_close(grads["l1"][name], 2 * grad)


@pytest.mark.parametrize("distance", ["tv", "l1"])
def test_per_row_normalizer_matches_brute_force(distance: str) -> None:
    problem = make_problem(markov=True, conf=True, trainable_head=True, seed=13)
    g = torch.Generator().manual_seed(0)
    per_row = torch.rand(N, generator=g, dtype=torch.float64) * 20 + 0.5
    assert_matches(*run_both(problem, normalizer=per_row, distance=distance))


def test_constant_per_row_normalizer_equals_scalar() -> None:
    problem = make_problem(markov=True, conf=True, seed=14)
    scalar = chunked(**fresh(problem), normalizer=7.5, chunk_size=4)
    rows = chunked(**fresh(problem), normalizer=torch.full((N,), 7.5, dtype=torch.float64), chunk_size=4)
    torch.testing.assert_close(rows.loss, scalar.loss)


def test_joint_confidence_gradient_reaches_the_features() -> None:
    """Confidence logits computed from the drafter's states (the joint switch): the chained gradients of the
    states and of the head's weights equal autograd through the brute-force reference."""
    problem = make_problem(markov=True, trainable_head=True, seed=15)
    g = torch.Generator().manual_seed(1)
    head_w = torch.randn(D + R, generator=g, dtype=torch.float64)
    head_b = torch.randn((), generator=g, dtype=torch.float64)
    results = []
    for loss_fn in (chunked, reference_loss):
        inputs = fresh(problem)
        w, b = head_w.clone().requires_grad_(), head_b.clone().requires_grad_()
        conf = torch.cat([inputs["draft_hidden"], inputs["markov_rows"]], dim=-1) @ w + b
        kwargs = {"chunk_size": 3} if loss_fn is chunked else {}
        out = loss_fn(**inputs, conf_logits=conf, distance="l1", **kwargs)
        (out.loss if loss_fn is chunked else out["loss"]).backward()
        results.append((inputs, w.grad, b.grad))
    (mine_in, mine_w, mine_b), (ref_in, ref_w, ref_b) = results
    for name in ("draft_hidden", "markov_rows", "markov_w2", "draft_head_weight"):
        torch.testing.assert_close(mine_in[name].grad, ref_in[name].grad, rtol=1e-5, atol=1e-9, check_dtype=False)
    torch.testing.assert_close(mine_w, ref_w, rtol=1e-5, atol=1e-9)
    torch.testing.assert_close(mine_b, ref_b, rtol=1e-5, atol=1e-9)


def test_frozen_head_gets_no_gradient_trainable_head_does() -> None:
    frozen = fresh(make_problem(markov=True))
    chunked(**frozen, chunk_size=3).loss.backward()
    assert frozen["draft_head_weight"].grad is None
    trainable = fresh(make_problem(markov=True, trainable_head=True))
    chunked(**trainable, chunk_size=3).loss.backward()
    assert trainable["draft_head_weight"].grad is not None
    assert trainable["draft_head_weight"].grad.abs().sum() > 0


def test_float32_inputs_match_float64_reference() -> None:
    problem = make_problem(markov=True, conf=True, trainable_head=True, seed=4)
    mine_in = fresh({k: v.float() if v.is_floating_point() else v for k, v in problem.items()})
    mine = chunked(**mine_in, chunk_size=3)
    mine.loss.backward()
    ref_in = fresh(problem)
    ref = reference_loss(**ref_in)
    ref["loss"].backward()
    assert mine.loss.dtype == torch.float32
    assert_matches(mine, ref, mine_in, ref_in, rtol=1e-5, atol=1e-6)


def test_bfloat16_inputs_give_fp32_loss_and_input_dtype_gradients() -> None:
    problem = make_problem(markov=True, conf=True, trainable_head=True, seed=5)
    inputs = fresh({k: v.bfloat16() if v.is_floating_point() else v for k, v in problem.items()})
    out = chunked(**inputs, chunk_size=4)
    out.loss.backward()
    ref = reference_loss(**fresh({k: v.bfloat16().double() if v.is_floating_point() else v
                                   for k, v in problem.items()}))
    assert out.loss.dtype == torch.float32
    torch.testing.assert_close(out.loss, ref["loss"].float().detach(), rtol=2e-2, atol=1e-2)
    for name in DIFFERENTIABLE:
        assert inputs[name].grad.dtype == torch.bfloat16


def test_c_star_is_one_minus_tv() -> None:
    for draft_vocab in (False, True):
        problem = make_problem(markov=True, draft_vocab=draft_vocab, seed=6)
        problem["weights"] = torch.ones(N, dtype=torch.float64)
        out = chunked(**fresh(problem), chunk_size=5)
        ref = reference_loss(**fresh(problem))
        torch.testing.assert_close(out.c_star, 1.0 - torch.tensor(ref["tv"]), rtol=1e-5, atol=1e-9,
                                   check_dtype=False)
        torch.testing.assert_close(out.tv_sum, (1.0 - out.c_star).sum(), rtol=1e-5, atol=1e-9)
        assert bool((out.c_star >= 0).all() and (out.c_star <= 1 + 1e-9).all())


def test_identical_models_have_zero_tv_and_full_coverage() -> None:
    problem = make_problem(seed=7)
    problem["target_hidden"] = problem["draft_hidden"].detach().clone()
    problem["target_head_weight"] = problem["draft_head_weight"].detach().clone()
    out = chunked(**fresh(problem), chunk_size=4)
    torch.testing.assert_close(out.c_star, torch.ones(N), rtol=0, atol=1e-12, check_dtype=False)
    assert float(out.tv_sum) < 1e-10
    target_argmax = (problem["target_hidden"] @ problem["target_head_weight"].T).argmax(dim=-1)
    assert torch.equal(out.draft_correct, target_argmax == problem["labels"])


def test_labels_outside_draft_vocabulary_are_counted_and_skip_ce() -> None:
    problem = make_problem(draft_vocab=True, seed=8)
    in_vocab = torch.isin(problem["labels"], problem["draft_to_target"])
    out = chunked(**fresh(problem), chunk_size=4)
    assert out.num_label_outside_draft_vocab == int((~in_vocab).sum()) > 0
    only_outside = dict(problem, weights=(~in_vocab).double())
    assert float(chunked(**fresh(only_outside)).ce_sum) == 0.0


def test_gradient_scales_with_upstream_gradient() -> None:
    problem = make_problem(markov=True, conf=True, trainable_head=True, seed=9)
    once, twice = fresh(problem), fresh(problem)
    chunked(**once, chunk_size=4).loss.backward()
    (2.5 * chunked(**twice, chunk_size=4).loss).backward()
    for name in DIFFERENTIABLE:
        torch.testing.assert_close(twice[name].grad, 2.5 * once[name].grad)


def test_no_grad_mode_returns_plain_value() -> None:
    problem = make_problem(markov=True, conf=True)
    with torch.no_grad():
        out = chunked(**fresh(problem))
    assert out.loss.grad_fn is None
    ref = reference_loss(**fresh(problem))
    torch.testing.assert_close(out.loss, ref["loss"].detach().float(), rtol=1e-5, atol=0, check_dtype=False)


def test_empty_batch() -> None:
    problem = make_problem(markov=True, conf=True, n=0)
    inputs = fresh(problem)
    out = chunked(**inputs)
    out.loss.backward()
    assert float(out.loss.detach()) == 0.0 and out.c_star.shape == (0,)
    assert inputs["draft_hidden"].grad.shape == (0, D)


class _ShapeRecorder(TorchDispatchMode):
    """Records the shape of every tensor any op produces."""

    def __init__(self) -> None:
        super().__init__()
        self.shapes: list[tuple[int, ...]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else [out]:
            if isinstance(t, torch.Tensor):
                self.shapes.append(tuple(t.shape))
        return out


def test_logits_exist_only_per_chunk_in_forward_and_backward() -> None:
    n, chunk = 20, 4
    problem = make_problem(markov=True, conf=True, trainable_head=True, n=n, seed=10)
    inputs = fresh(problem)
    with _ShapeRecorder() as recorder:
        chunked(**inputs, chunk_size=chunk).loss.backward()
    weight_like = {D, DT, R}
    vocab_by_positions = [s for s in recorder.shapes if len(s) == 2 and V in s and not weight_like & set(s)]
    assert vocab_by_positions, "recorder saw no logits at all"
    assert max(min(s) for s in vocab_by_positions) <= chunk


def test_decay_weights_formula() -> None:
    gamma = 4.0
    slots = torch.arange(7)
    expected = torch.tensor([math.exp(-(k - 1) / gamma) for k in range(1, 8)])
    torch.testing.assert_close(decay_weights(slots, gamma), expected)
    assert float(decay_weights(0, 7.0)) == 1.0
    torch.testing.assert_close(decay_weights(torch.tensor([[0, 6]]), 7.0), torch.tensor([[1.0, math.exp(-6 / 7)]]))
    with pytest.raises(ValueError):
        decay_weights(slots, 0.0)
    with pytest.raises(ValueError):
        decay_weights(torch.tensor([-1]), 4.0)
    with pytest.raises(TypeError):
        decay_weights(torch.tensor([0.5]), 4.0)


def test_rejects_bad_inputs() -> None:
    problem = make_problem()
    with pytest.raises(ValueError, match="chunk_size"):
        chunked(**problem, chunk_size=0)
    with pytest.raises(ValueError, match="draft_to_target"):
        chunked(**dict(problem, draft_head_weight=problem["draft_head_weight"][:VD]))
    with pytest.raises(ValueError, match="markov"):
        chunked(**problem, markov_rows=torch.zeros(N, R, dtype=torch.float64))
    with pytest.raises(ValueError, match="labels"):
        chunked(**dict(problem, labels=problem["labels"] + V))
    with pytest.raises(ValueError, match="distance"):
        chunked(**problem, distance="l2")
    with pytest.raises(ValueError, match="per-row normalizer"):
        chunked(**problem, normalizer=torch.ones(N + 1))
    with pytest.raises(ValueError, match="positive"):
        chunked(**problem, normalizer=torch.zeros(N))
