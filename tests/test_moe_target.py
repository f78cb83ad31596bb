"""Mixture-of-experts targets through the whole pipeline, on the random-weight scale model of Qwen3-30B-A3B
(``tests/helpers/moe_world.py``: 48 decoder layers, 151,936-token vocabulary, 128 experts routing 8 per token, widths
shrunk) and the ``qwen3-30b-a3b`` recipe's production settings (taps 1, 12, 23, 34, 45, block 7, mask id 151669,
512 anchors; EAGLE-3: taps [1, L//2-1, L-4] and a 32,000-token draft vocabulary).

- taps: a ``Qwen3MoeDecoderLayer`` returns a plain tensor (no tuple with router logits), and the hooks of
  ``TargetTap`` give exactly ``output_hidden_states``' entries;
- every drafter kind trains on it (colocated, validation included), exports through ``deepspec export`` (the
  engines' capture rule for a ``Qwen3MoeForCausalLM`` target) and decodes exactly with the evaluator's
  speculative decoder (what ``deepspec eval`` runs): greedy speculative decoding with the exported drafter equals
  the target's own greedy generation.

Streaming from a tensor-parallel group over this target is in ``tests/test_target_groups.py``.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from deepspec_train.commands.dispatch import main as deepspec_main
from deepspec_train.kinds.recipe_validation import load_recipe
from deepspec_train.evaluation.speculative_decoder import SpeculativeDecoder
from deepspec_train.formats.drafter_loader import load_exported_drafter
from deepspec_train.jobs.run import run_training
from deepspec_train.models.reference_configs import REFERENCE_LAYER_IDS
from deepspec_train.target.hidden_states import TargetTap
from tests.helpers.moe_world import MOE_REFERENCE, moe_overrides

PROMPT = "What is two plus three?"
MAX_NEW = 8
KIND_OVERRIDES = {
    "dspark": [],
    "dflash": ["drafter.kind=dflash", "drafter.markov_rank=0", "drafter.confidence_head=false"],
    "eagle3": [
        "drafter.kind=eagle3", "drafter.num_layers=1", "drafter.markov_rank=0", "drafter.confidence_head=false",
        "drafter.ttt_steps=7", "drafter.ttt_decay=0.8", "drafter.draft_vocab_size=32000", "target.layer_ids=[1,23,44]",
    ],
}

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def moe_target(moe_world):
    """The scale target and its tokenizer, loaded once (transformers takes seconds to assemble 128 experts x 48
    layers)."""
    model = AutoModelForCausalLM.from_pretrained(moe_world["target"], dtype=torch.float32).eval()
    return model, AutoTokenizer.from_pretrained(moe_world["target"])


def test_moe_decoder_layers_are_tapped_like_dense_ones(moe_target) -> None:
    model, _ = moe_target
    layers = model.model.layers
    assert type(model).__name__ == "Qwen3MoeForCausalLM" and len(layers) == 48
    assert type(layers[0].mlp).__name__ == "Qwen3MoeSparseMoeBlock" and layers[0].mlp.experts.num_experts == 128
    outputs = []
    handle = layers[5].register_forward_hook(lambda _m, _i, out: outputs.append(out))
    ids = torch.randint(0, 300, (2, 11))
    with torch.no_grad():
        reference = model.model(input_ids=ids, output_hidden_states=True).hidden_states
    handle.remove()
    assert isinstance(outputs[0], torch.Tensor)
    layer_ids = REFERENCE_LAYER_IDS[MOE_REFERENCE]
    states = TargetTap(model, layer_ids)(ids)
    expected = torch.cat([reference[k + 1] for k in layer_ids], dim=-1)
    assert torch.equal(states.ctx_features, expected)
    # transformers 5's last hidden state already has the final norm applied: it is what the LM head reads.
    assert torch.equal(states.final_hidden, reference[-1])


def _greedy(model, tokenizer, max_new: int) -> list[int]:
    rendered = tokenizer.apply_chat_template([{"role": "user", "content": PROMPT}], tokenize=False,
                                             add_generation_prompt=True, enable_thinking=False)
    ids = tokenizer(rendered, add_special_tokens=False)["input_ids"]
    out = model.generate(torch.tensor([ids]), max_new_tokens=max_new, do_sample=False)
    return out[0, len(ids):].tolist()


@pytest.mark.slow
@pytest.mark.parametrize("kind", sorted(KIND_OVERRIDES))
def test_moe_target_trains_exports_and_decodes_exactly(moe_world, moe_target, tmp_path: Path, kind: str) -> None:
    run = tmp_path / "run"
    cfg = load_recipe("qwen3-30b-a3b", moe_overrides(moe_world, run) + KIND_OVERRIDES[kind])
    summary = run_training(cfg)
    assert summary.steps == 1 and summary.final_loss > 0
    assert summary.val_metrics["val/expected_len"] >= 0
    export = tmp_path / "export"
    assert deepspec_main(["export", "--drafter", str(run / "drafter"), "--target", moe_world["target"],
                          "--out", str(export), "--dtype", "fp32"]) == 0
    loaded = load_exported_drafter(export, moe_world["target"])
    assert loaded.kind == kind and loaded.target_layer_ids == cfg.target.layer_ids
    target, tokenizer = moe_target
    decoder = SpeculativeDecoder(target, tokenizer, loaded.block_drafter(), loaded.target_layer_ids, 7, 0.0)
    (turn,), _ = decoder.decode_conversation([PROMPT], MAX_NEW)
    assert turn.tokens == _greedy(target, tokenizer, MAX_NEW)
