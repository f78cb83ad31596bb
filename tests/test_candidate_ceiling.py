"""``bench/candidate_ceiling.py`` against brute force: the target's top-k mass, the answer's logits (one forward of
the whole conversation), and a DFlash2 slot's head / ceiling / selector acceptances (loops over the vocabulary and
the candidates), wired end to end through a drafter on a real (tiny random) target; then the command line on the
tiny world's target."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import candidate_ceiling as cc  # noqa: E402
from deepspec_train.models.block_drafting import DraftContext  # noqa: E402
from deepspec_train.target.hidden_states import TargetTap  # noqa: E402
from tests.helpers.chat_model_drafters import load_tiny_target, random_drafter  # noqa: E402
from tests.helpers.dflash2_drafters import tiny_dflash2  # noqa: E402
from tests.helpers.tiny_geometry import HIDDEN, VOCAB  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_torch_thread")


# --- top-k mass ----------------------------------------------------------------------------------------------


def _loop_top_k_mass(row: list[float], temperature: float, k: int) -> float:
    """The k largest probabilities of softmax(row / T), summed, one token at a time."""
    top = max(row)
    weights = [math.exp((x - top) / temperature) for x in row]
    total = sum(weights)
    return sum(sorted((w / total for w in weights), reverse=True)[:k])


@pytest.mark.parametrize("temperature", [0.5, 1.0])
def test_top_k_mass_is_the_sorted_probabilities_summed(temperature):
    logits = torch.randn(6, 50, generator=torch.Generator().manual_seed(1)) * 3
    ks = [1, 3, 8, 50]
    masses = cc.top_k_mass(logits, temperature, ks)
    for k in ks:
        expected = [_loop_top_k_mass(row, temperature, k) for row in logits.tolist()]
        assert masses[k].tolist() == pytest.approx(expected, abs=1e-12)
    assert masses[50].tolist() == pytest.approx([1.0] * 6, abs=1e-12)


def test_top_k_mass_at_temperature_zero_is_one_and_bad_k_is_refused():
    logits = torch.randn(4, 10, generator=torch.Generator().manual_seed(2))
    masses = cc.top_k_mass(logits, 0.0, [1, 5])
    assert all(m.tolist() == [1.0] * 4 for m in masses.values())
    for bad in (0, 11):
        with pytest.raises(ValueError, match=f"top-k {bad} "):
            cc.top_k_mass(logits, 1.0, [1, bad])


# --- the answer's logits -------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def world_target(tiny_world):
    path = tiny_world / "target"
    target = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    lines = (tiny_world / "conversations" / "validation.jsonl").read_text().splitlines()
    return target, AutoTokenizer.from_pretrained(path), [json.loads(line)["messages"] for line in lines[:4]]


@pytest.mark.parametrize("cap", [10_000, 16])
def test_answer_logits_are_the_full_forward_at_the_answer_positions(world_target, cap):
    target, tokenizer, conversations = world_target
    for messages in conversations:
        full = tokenizer(tokenizer.apply_chat_template(messages, tokenize=False), add_special_tokens=False)
        prefix = tokenizer(tokenizer.apply_chat_template(messages[:-1], tokenize=False, add_generation_prompt=True),
                           add_special_tokens=False)
        ids, start = full["input_ids"], len(prefix["input_ids"])
        with torch.no_grad():
            every = target(input_ids=torch.tensor([ids])).logits[0]
        count = min(cap, len(ids) - start)
        rows = cc.answer_logits(target, tokenizer, messages, cap)
        assert rows.shape == (count, every.shape[-1])
        for j in range(count):
            # Row j predicts answer token start + j, from the position before it.
            torch.testing.assert_close(rows[j], every[start + j - 1], atol=1e-4, rtol=1e-4)
        if cap >= len(ids):
            assert messages[-1]["content"] in tokenizer.decode(ids[start:])


def test_a_conversation_without_a_final_answer_is_refused(world_target):
    target, tokenizer, conversations = world_target
    with pytest.raises(ValueError, match="not an assistant turn"):
        cc.answer_logits(target, tokenizer, conversations[0][:-1], 8)


# --- a DFlash2 slot's acceptances ----------------------------------------------------------------------------


TOP_K = 8


@torch.no_grad()
def _loop_slot(module, hidden: torch.Tensor, predecessor: int, target_probs: torch.Tensor,
               temperature: float) -> tuple[float, float, float]:
    """head, ceiling and selector of one slot, token by token: the head's logits ``W h``, the K best of them,
    each scored ``logit + <A[pred] * W_h h, B[c]>``, both laws softmaxed at T and overlapped with p_t."""
    selector = module.candidate_selector
    weight, h = module.lm_head.weight.double(), hidden.double()
    gate = selector.hidden_projection.weight.double() @ h
    logits = [float(weight[v] @ h) for v in range(VOCAB)]
    p = target_probs.tolist()
    head_norm = sum(math.exp(x / temperature) for x in logits)
    head = sum(min(math.exp(logits[v] / temperature) / head_norm, p[v]) for v in range(VOCAB))
    candidates = sorted(range(VOCAB), key=lambda v: -logits[v])[:TOP_K]
    scores = {c: logits[c] + float((selector.predecessor_codebook[predecessor].double() * gate
                                    * selector.successor_codebook[c].double()).sum()) for c in candidates}
    norm = sum(math.exp(s / temperature) for s in scores.values())
    ceiling = sum(p[c] for c in candidates)
    chosen = sum(min(math.exp(scores[c] / temperature) / norm, p[c]) for c in candidates)
    return head, ceiling, chosen


@pytest.mark.parametrize("temperature", [0.5, 1.0])
def test_slot_acceptance_is_the_loop_brute_force(temperature):
    module = tiny_dflash2(5, selector_top_k=TOP_K)
    generator = torch.Generator().manual_seed(6)
    with torch.no_grad():
        # A head sharper than nn.Linear's init, so the laws are far from uniform.
        module.lm_head.weight.copy_(torch.randn(VOCAB, HIDDEN, generator=generator) * 0.6)
    for _ in range(6):
        hidden = torch.randn(HIDDEN, generator=generator)
        predecessor = int(torch.randint(VOCAB, (1,), generator=generator))
        target_probs = torch.softmax(torch.randn(VOCAB, generator=generator, dtype=torch.float64) * 2, -1)
        slot = cc.slot_acceptance(module, hidden, predecessor, target_probs, temperature)
        head, ceiling, chosen = _loop_slot(module, hidden, predecessor, target_probs, temperature)
        assert slot.head == pytest.approx(head, abs=1e-5)
        assert slot.ceiling == pytest.approx(ceiling, abs=1e-9)
        assert slot.selector == pytest.approx(chosen, abs=1e-5)


def test_selector_never_exceeds_its_ceiling():
    module = tiny_dflash2(7, selector_top_k=TOP_K)
    generator = torch.Generator().manual_seed(8)
    hidden = torch.randn(200, HIDDEN, generator=generator) * 3
    # Targets close to the head's own law on some rows (a high head), far from it on others.
    head_logits = module.lm_head(hidden).double()
    noise = torch.randn(200, VOCAB, generator=generator, dtype=torch.float64) * torch.linspace(0, 4, 200)[:, None]
    target_probs = torch.softmax(head_logits + noise, -1)
    for row in range(200):
        slot = cc.slot_acceptance(module, hidden[row], row % VOCAB, target_probs[row], 1.0)
        assert 0 <= slot.selector <= slot.ceiling + 1e-12 and slot.ceiling <= 1 + 1e-12 and slot.head <= 1 + 1e-12


def test_first_slot_acceptance_refuses_temperature_zero():
    with pytest.raises(ValueError, match="temperature > 0"):
        cc.slot_acceptance(tiny_dflash2(0), torch.zeros(HIDDEN), 0, torch.ones(VOCAB) / VOCAB, 0.0)


@pytest.fixture(scope="module")
def chat_target(tmp_path_factory):
    model, tokenizer = load_tiny_target(tmp_path_factory.mktemp("chat_target"))
    ids = torch.tensor(tokenizer("one two three four five six seven", add_special_tokens=False)["input_ids"])
    return model, tokenizer, ids


@pytest.mark.parametrize("kind", ["dflash2", "dflash"])
def test_first_slot_acceptance_matches_what_the_drafter_drafts_from(chat_target, kind):
    """Through a loaded drafter on a real target: the selector's acceptance (DFlash2) or the head's (DFlash) is
    the overlap of p_t with the first slot's ``q`` that ``draft`` hands to verification, and DFlash2's ceiling
    is p_t's mass on that ``q``'s support (its K candidates)."""
    target, tokenizer, ids = chat_target
    loaded = random_drafter(target, tokenizer, kind, seed=4)
    features = TargetTap(target, loaded.target_layer_ids)(ids[None]).ctx_features[0].float()
    with torch.no_grad():
        logits = target(input_ids=ids[None]).logits[0].double()
    drafter, cache = loaded.block_drafter(), {}
    for anchor in range(2, len(ids) - 1):
        p_t = torch.softmax(logits[anchor] / 0.8, -1)
        slot = cc.first_slot_acceptance(loaded, features, ids, anchor, p_t, 0.8, cache)
        q = drafter.draft(DraftContext(features[:anchor], ids[:anchor]), ids[anchor : anchor + 1], 1, 0.8,
                          torch.Generator().manual_seed(0)).probs[0, 0].double()
        overlap = sum(min(float(q[v]), float(p_t[v])) for v in range(len(q)))
        if kind == "dflash2":
            assert slot.selector == pytest.approx(overlap, abs=1e-6)
            assert slot.ceiling == pytest.approx(float(p_t[q > 0].sum()), abs=1e-9)
            assert int((q > 0).sum()) == loaded.module.selector_top_k
            assert slot.selector <= slot.ceiling + 1e-12 and slot.head <= 1 + 1e-12
        else:
            assert slot.head == pytest.approx(overlap, abs=1e-6)
            assert slot.ceiling is None and slot.selector is None


# --- the command line ----------------------------------------------------------------------------------------


def test_cli_prints_a_row_per_k_with_masses_growing_with_k(tiny_world, tmp_path, capsys):
    out = tmp_path / "ceiling.md"
    ks = [1, 8, 32, 64]
    cc.main(["--target", str(tiny_world / "target"), "--data", str(tiny_world / "conversations" / "validation.jsonl"),
             "--conversations", "3", "--answer-tokens", "32", "--top-k", *map(str, ks), "--no-progress",
             "--out", str(out)])
    printed = capsys.readouterr().out
    assert out.read_text() == printed
    rows = [line.split("|") for line in printed.splitlines() if line.startswith("| ") and line[2].isdigit()]
    assert [int(r[1]) for r in rows] == ks
    masses = [float(r[2]) for r in rows]
    assert all(0 < a <= b <= 1 for a, b in zip(masses, masses[1:]))
    for r in rows:
        low, high = (float(x) for x in r[3].strip(" []").split(","))
        assert low <= float(r[2]) <= high


def test_cli_refuses_missing_inputs(tiny_world, tmp_path, capsys):
    for args, message in (
        (["--target", str(tmp_path), "--data", str(tiny_world / "conversations" / "validation.jsonl")],
         "--target " + str(tmp_path) + ": no config.json"),
        (["--target", str(tiny_world / "target"), "--data", str(tmp_path / "missing.jsonl")], "no such data file"),
    ):
        with pytest.raises(SystemExit) as info:
            cc.main(args)
        err = capsys.readouterr().err.strip().splitlines()
        assert info.value.code == 2 and len(err) == 1 and message in err[0], err
