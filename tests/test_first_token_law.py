"""The real-vocabulary distribution test of ``bench/first_token_law.py`` on the tiny random chat model: with the
exact verifier the first token follows the target's law, and the test has power: a verifier that keeps every
draft (no rejection) is caught. Its run on SmolLM2 is part of ``bench/realworld.py``."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import first_token_law as law  # noqa: E402
from deepspec_train.evaluation.speculative_decoder import verify_drafts  # noqa: E402
from tests.helpers.chat_model_drafters import load_tiny_target, random_drafter  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def flattened(tmp_path_factory):
    model, tokenizer = load_tiny_target(tmp_path_factory.mktemp("tiny_target"))
    loaded = random_drafter(model, tokenizer, "dspark", seed=3)
    with torch.no_grad():
        loaded.module.norm.weight.mul_(0.2)  # flatter drafts: both first-round branches are exercised
    ids = torch.tensor(tokenizer("Two plus three is", add_special_tokens=False)["input_ids"])
    return model, loaded, ids


def test_the_exact_verifier_follows_the_target(flattened) -> None:
    model, loaded, ids = flattened
    result = law.first_token_law(model, loaded.block_drafter(), loaded.target_layer_ids, ids, 4000)
    assert 0.05 < result.acceptance < 0.95 and result.cells > 20
    assert result.p_value > 0.01


def test_a_verifier_that_keeps_every_draft_is_caught(flattened, monkeypatch) -> None:
    model, loaded, ids = flattened

    def keep_everything(draft, logits, temperature, generator=None):
        result, ratios, c_star = verify_drafts(draft, logits, temperature, generator)
        result.tokens[:, 0] = draft.tokens[:, 0]
        result.accepted[:] = draft.tokens.shape[1]
        return result, ratios, c_star

    monkeypatch.setattr(law, "verify_drafts", keep_everything)
    result = law.first_token_law(model, loaded.block_drafter(), loaded.target_layer_ids, ids, 4000)
    assert result.p_value < 1e-6
