"""Decode-time context caching: drafting with a conversation's cache (context keys / values of earlier rounds
kept, only new rows projected) gives the same drafts as projecting the whole context every round."""

from __future__ import annotations

import pytest
import torch

from deepspec_train.models.block_drafting import DraftContext
from tests.helpers.chat_model_drafters import load_tiny_target, random_drafter


@pytest.fixture(scope="module")
def tiny_target(tmp_path_factory, one_torch_thread):
    return load_tiny_target(tmp_path_factory.mktemp("target"))


@pytest.mark.parametrize("kind", ["dspark", "dflash", "eagle3"])
def test_cached_rounds_equal_uncached(tiny_target, kind) -> None:
    target, tokenizer = tiny_target
    loaded = random_drafter(target, tokenizer, kind, seed=3)
    drafter = loaded.block_drafter()
    g = torch.Generator().manual_seed(0)
    width = loaded.module.fc.weight.shape[1]
    features = torch.randn(40, width, generator=g)
    tokens = torch.randint(5, 90, (40,), generator=g)
    cache: dict = {}
    # The context grows round by round, as a conversation's does (by the accepted drafts plus one).
    # EAGLE-3's first round with a 1-token context has no context entries to project (a - 1 = 0).
    for length in (1, 6, 9, 10, 16, 23):
        anchor = tokens[length : length + 1]
        with_cache = DraftContext(features[:length], tokens[:length], cache=cache)
        without = DraftContext(features[:length], tokens[:length])
        a = drafter.draft(with_cache, anchor, loaded.block_size, 1.0, torch.Generator().manual_seed(length))
        b = drafter.draft(without, anchor, loaded.block_size, 1.0, torch.Generator().manual_seed(length))
        assert torch.equal(a.tokens, b.tokens)
        torch.testing.assert_close(a.probs, b.probs, rtol=1e-5, atol=1e-6)
    assert len(cache) == 1 and next(iter(cache.values()))["rows"] in (22, 23)
    other = DraftContext(features[:8], torch.randint(5, 90, (8,), generator=g), cache=cache)
    with pytest.raises(ValueError, match="another conversation"):
        drafter.draft(other, tokens[8:9], loaded.block_size, 1.0)
