"""Losslessness of speculative decoding on the tiny random target: the joint law of the first two generated tokens.

For a fixed prompt, 20,000 independent speculative decodings are run at once. Round 1 is the same for every
sample up to the random draws, so all rows are drafted by the real drafting code in one batch (the backbone
runs once per distinct anchor) and verified with one batched target pass. A row whose first round emitted only
one token runs a second round, anchored at that token, the same way. The joint counts of the first two tokens
``(y_1, y_2)`` are compared by a chi-square test with the exact target law ``p(y_1) p(y_2 | y_1)`` computed from
the target's own probabilities (cells with expected count below 5 pooled into one). The joint law is the
stronger check: it covers the accept, reject-and-resample and bonus paths of both rounds.

The drafters are random, with a flattened output (final norm scaled down) so that drafts are often accepted
and every path is exercised; EAGLE-3, and DSpark in one case, use a reduced draft vocabulary, so ``q`` is zero on
some target tokens.
"""

from __future__ import annotations

import pytest
import torch
from scipy.stats import chisquare

from deepspec_train.models.block_drafting import BlockDrafter, DraftBlock, DraftContext
from deepspec_train.evaluation.speculative_decoder import verify_drafts
from deepspec_train.target.hidden_states import TargetTap
from tests.helpers.chat_model_drafters import load_tiny_target, random_drafter

NUM_SAMPLES = 20_000
# Drafted tokens per round. Only the first two generated tokens are tested, and later drafts cannot change them,
# so two drafts per round cover every path (the drafters are built with block size 4: drafting fewer is allowed).
DRAFTS = 2
CHUNK = 2_500
MIN_EXPECTED = 5.0
# A short raw prompt (no chat template): the test is about one fixed prefix, and short rows keep it fast.
PROMPT = "Two plus three is"


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    return load_tiny_target(tmp_path_factory.mktemp("tiny_target"))


def _prompt_ids(tokenizer) -> torch.Tensor:
    return torch.tensor(tokenizer(PROMPT, add_special_tokens=False)["input_ids"])


@torch.no_grad()
def _last_logits(model, sequences: torch.Tensor, keep: int) -> torch.Tensor:
    """Target logits at the last ``keep`` positions of every row, computed in chunks of rows."""
    return torch.cat([model(input_ids=c, logits_to_keep=keep).logits.float() for c in sequences.split(CHUNK)])


def _speculative_round(
    model, drafter: BlockDrafter, prefix: torch.Tensor, context: DraftContext, anchors: torch.Tensor,
    temperature: float, generator: torch.Generator,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One round for every row: the row's sequence is ``prefix`` then its anchor. Returns (accepted, tokens)."""
    accepted, tokens = [], []
    for rows in anchors.split(CHUNK):
        draft = drafter.draft(context, rows, DRAFTS, temperature, generator)
        sequences = torch.cat([prefix.expand(len(rows), -1), rows[:, None], draft.tokens], dim=1)
        logits = _last_logits(model, sequences, DRAFTS + 1)
        result, _, _ = verify_drafts(DraftBlock(draft.tokens, draft.probs, None), logits, temperature, generator)
        accepted.append(result.accepted)
        tokens.append(result.tokens)
    return torch.cat(accepted), torch.cat(tokens)


def _first_two_tokens(
    model, drafter: BlockDrafter, layer_ids: list[int], ids: torch.Tensor, temperature: float, seed: int = 1234
):
    """``(y_1, y_2)`` of ``NUM_SAMPLES`` speculative decodings, and how many drafts each first round accepted."""
    generator = torch.Generator().manual_seed(seed)
    features = TargetTap(model, layer_ids)(ids[None]).ctx_features[0].float()
    num = len(ids)
    anchors = ids[-1].repeat(NUM_SAMPLES)
    first_context = DraftContext(features[: num - 1], ids[: num - 1])
    accepted, tokens = _speculative_round(model, drafter, ids[:-1], first_context, anchors, temperature, generator)
    y1, y2 = tokens[:, 0], tokens[:, 1].clone()
    short = accepted == 0
    # A single-token first round: the second token comes from a round anchored at y_1 (position P).
    _, second = _speculative_round(
        model, drafter, ids, DraftContext(features, ids), y1[short], temperature, generator
    )
    y2[short] = second[:, 0]
    return y1, y2, accepted


def _exact_joint(model, ids: torch.Tensor, temperature: float) -> torch.Tensor:
    """``p(y_1) p(y_2 | y_1)`` over every pair, from the target's own logits (fp64)."""
    vocab = model.config.vocab_size
    p1 = torch.softmax(_last_logits(model, ids[None], 1)[0, -1].double() / temperature, -1)
    extended = torch.cat([ids.expand(vocab, -1), torch.arange(vocab)[:, None]], dim=1)
    p2 = torch.softmax(_last_logits(model, extended, 1)[:, -1].double() / temperature, -1)
    return p1[:, None] * p2


def _chi_square_p(y1: torch.Tensor, y2: torch.Tensor, joint: torch.Tensor) -> float:
    vocab = joint.shape[0]
    observed = torch.bincount(y1 * vocab + y2, minlength=vocab * vocab).double()
    expected = joint.flatten() * len(y1)
    big = expected >= MIN_EXPECTED
    obs = torch.cat([observed[big], observed[~big].sum()[None]])
    exp = torch.cat([expected[big], expected[~big].sum()[None]])
    assert int(big.sum()) > 50, "too few well-populated cells for a meaningful test"
    return float(chisquare(obs.numpy(), exp.numpy() * obs.sum().item() / exp.sum().item()).pvalue)


def _flattened_drafter(model, tokenizer, kind: str, reduced_vocab: bool):
    vocab_size = model.config.vocab_size
    loaded = random_drafter(model, tokenizer, kind, seed=3, draft_vocab_size=vocab_size * 3 // 4 if reduced_vocab else None)
    with torch.no_grad():
        loaded.module.norm.weight.mul_(0.2)
    return loaded


@pytest.mark.parametrize(
    ("kind", "temperature", "reduced_vocab"),
    [("dspark", 1.0, False), ("dspark", 1.0, True), ("dflash", 0.7, False), ("eagle3", 1.0, True)],
)
def test_first_two_tokens_follow_the_target(target, kind, temperature, reduced_vocab):
    model, tokenizer = target
    loaded = _flattened_drafter(model, tokenizer, kind, reduced_vocab)
    ids = _prompt_ids(tokenizer)
    y1, y2, accepted = _first_two_tokens(model, loaded.block_drafter(), loaded.target_layer_ids, ids, temperature)
    # Both branches of the first round must be well exercised for the test to mean anything.
    rate = float((accepted > 0).double().mean())
    assert 0.05 < rate < 0.95
    p_value = _chi_square_p(y1, y2, _exact_joint(model, ids, temperature))
    print(f"{kind} T={temperature} reduced vocabulary {reduced_vocab}: first-round acceptance {rate:.3f}, p={p_value:.3f}")
    assert p_value > 0.01
