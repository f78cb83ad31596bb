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

from tests.helpers.chat_model_drafters import load_tiny_target, random_drafter
from tests.helpers.two_token_law import chi_square_p, exact_joint, first_two_tokens, prompt_ids

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    return load_tiny_target(tmp_path_factory.mktemp("tiny_target"))


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
    ids = prompt_ids(tokenizer)
    y1, y2, accepted = first_two_tokens(model, loaded.block_drafter(), loaded.target_layer_ids, ids, temperature)
    # Both branches of the first round must be well exercised for the test to mean anything.
    rate = float((accepted > 0).double().mean())
    assert 0.05 < rate < 0.95
    p_value = chi_square_p(y1, y2, exact_joint(model, ids, temperature))
    print(f"{kind} T={temperature} reduced vocabulary {reduced_vocab}: first-round acceptance {rate:.3f}, p={p_value:.3f}")
    assert p_value > 0.01
