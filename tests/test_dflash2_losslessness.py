"""Losslessness of speculative decoding with a DFlash2 drafter on the tiny random target: the selector's walk
proposes from q over the K candidates, and verification with that q must give the target's own law. At T = 1 the
joint law of the first two tokens of 20,000 decodings passes the chi-square test of ``tests/test_losslessness.py``
(same prompt, same rounds); at T = 0 every decoding emits the target's greedy pair."""

from __future__ import annotations

import pytest
import torch

from deepspec_train.formats.drafter_loader import LoadedDrafter
from deepspec_train.models.geometry import geometry_from_target_config
from deepspec_train.models.dflash2_drafter import DFlash2Drafter
from tests.helpers.chat_model_drafters import load_tiny_target
from tests.helpers.dflash2_drafters import dflash2_config, randomize
from tests.helpers.two_token_law import chi_square_p, exact_joint, first_two_tokens, last_logits, prompt_ids

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    return load_tiny_target(tmp_path_factory.mktemp("tiny_target"))


def _flattened_dflash2(model, tokenizer) -> LoadedDrafter:
    mask_id = tokenizer.convert_tokens_to_ids("<|mask|>")
    geometry = geometry_from_target_config(model.config, intermediate_size=48)
    torch.manual_seed(3)
    # Top 32 of the tiny vocabulary: the target's law still puts mass outside the candidates, which only the
    # residual of a rejection can emit, so that path is exercised too.
    cfg = dflash2_config(block_size=4, mask_token_id=mask_id, conv_group_size=geometry.hidden_size // 4,
                         selector_top_k=32)
    module = randomize(DFlash2Drafter(geometry, cfg, [0]), seed=3)
    module.load_target_heads(model.get_input_embeddings().weight.detach().float(),
                             model.get_output_embeddings().weight.detach().float())
    with torch.no_grad():
        module.norm.weight.mul_(0.2)
        # A pairwise term of the size of the flattened logits' differences, not one that swamps them.
        module.candidate_selector.successor_codebook.mul_(0.1)
    return LoadedDrafter(module.eval(), "dflash2", 4, [0], mask_id, None, "zlab", "training")


def test_first_two_tokens_follow_the_target_at_temperature_one(target):
    model, tokenizer = target
    loaded = _flattened_dflash2(model, tokenizer)
    ids = prompt_ids(tokenizer)
    y1, y2, accepted = first_two_tokens(model, loaded.block_drafter(), loaded.target_layer_ids, ids, 1.0)
    rate = float((accepted > 0).double().mean())
    assert 0.05 < rate < 0.95
    assert chi_square_p(y1, y2, exact_joint(model, ids, 1.0)) > 0.01


def test_greedy_decoding_emits_the_targets_greedy_pair(target):
    model, tokenizer = target
    loaded = _flattened_dflash2(model, tokenizer)
    ids = prompt_ids(tokenizer)
    y1, y2, _ = first_two_tokens(model, loaded.block_drafter(), loaded.target_layer_ids, ids, 0.0)
    first = int(last_logits(model, ids[None], 1)[0, -1].argmax())
    second = int(last_logits(model, torch.cat([ids, torch.tensor([first])])[None], 1)[0, -1].argmax())
    assert bool((y1 == first).all()) and bool((y2 == second).all())
