"""The tap builds its target's attention mask itself (``target.layer_masks``, no device value read): the features
are those of transformers' own mask building, bit for bit, at every position (padded ones included, which see the
padding mask), for Qwen3 and Llama targets under ``sdpa`` and ``eager``, with right, left and no padding; a target
with sliding-window layers keeps transformers' own mask building."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, Qwen3ForCausalLM

from deepspec_train.target.hidden_states import TargetTap
from tests.helpers.tiny_geometry import VOCAB, tiny_qwen3_config

LAYERS = [0, 2]


def _target(family: str, attention: str, **fields):
    torch.manual_seed(0)
    if family == "qwen3":
        return Qwen3ForCausalLM(tiny_qwen3_config(intermediate_size=64, head_dim=8, attn_implementation=attention,
                                                  **fields)).eval()
    return LlamaForCausalLM(LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=4,
                                        num_attention_heads=4, num_key_value_heads=2,
                                        attn_implementation=attention)).eval()


def _transformers_states(model, input_ids: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Tapped layers and final-norm output with the 2D mask handed to the model (its own mask building)."""
    with torch.no_grad():
        out = model.model(input_ids=input_ids, attention_mask=mask, output_hidden_states=True, use_cache=False)
    return torch.cat([out.hidden_states[i + 1] for i in LAYERS], dim=-1), out.last_hidden_state


MASKS = {
    "none": [[1] * 9] * 3,
    "right": [[1] * 9, [1] * 5 + [0] * 4, [1] * 7 + [0] * 2],
    "left": [[1] * 9, [0] * 4 + [1] * 5, [0] * 2 + [1] * 7],
}


@pytest.mark.parametrize("family", ["qwen3", "llama"])
@pytest.mark.parametrize("attention", ["sdpa", "eager"])
@pytest.mark.parametrize("padding", sorted(MASKS))
def test_the_taps_masks_give_transformers_features_bit_for_bit(family: str, attention: str, padding: str) -> None:
    model = _target(family, attention)
    tap = TargetTap(model, LAYERS)
    assert tap.builds_masks
    input_ids = torch.randint(0, VOCAB - 1, (3, 9), generator=torch.Generator().manual_seed(1))
    mask = torch.tensor(MASKS[padding])
    states = tap(input_ids, None if padding == "none" else mask)
    ctx, final = _transformers_states(model, input_ids, mask)
    assert torch.equal(states.ctx_features, ctx) and torch.equal(states.final_hidden, final)


def test_a_target_with_sliding_window_layers_keeps_transformers_mask_building() -> None:
    model = _target("qwen3", "sdpa", use_sliding_window=True, sliding_window=4, max_window_layers=1)
    tap = TargetTap(model, LAYERS)
    assert not tap.builds_masks
    input_ids = torch.randint(0, VOCAB - 1, (3, 9), generator=torch.Generator().manual_seed(1))
    mask = torch.tensor(MASKS["right"])
    states = tap(input_ids, mask)
    ctx, final = _transformers_states(model, input_ids, mask)
    assert torch.equal(states.ctx_features, ctx) and torch.equal(states.final_hidden, final)
