"""The z-lab DFlash export loads through ``AutoModel.from_pretrained(DIR, trust_remote_code=True)`` with the
modeling code deepspec_train writes into it (``dflash.py``), and that model computes what our drafter computes.

A DFlash trained with z-lab labels (random weights) is exported at fp32 for an untied 4-layer Qwen3 target, with
plain and YaRN-scaled RoPE. The loaded model's block states and logits equal ``ParallelDrafter``'s on every block
of a packed batch (each block fed its own context), its greedy ``spec_generate`` returns exactly the target's
greedy ``generate`` output, and without ``trust_remote_code`` transformers builds something else (the README's
warning).
"""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModel, AutoModelForCausalLM, Qwen3ForCausalLM

from deepspec_train.export.exporter import export_drafter
from tests.helpers.scaled_rope_targets import scaled_config
from tests.helpers.trained_drafters import (
    random_batch, save_tiny_target, tiny_recipe, trained_drafter, write_training_output,
)
from tests.helpers.slot_logits import slot_logits


def _target(directory, rope: str) -> str:
    if rope == "default":
        return save_tiny_target(directory)
    torch.manual_seed(5)
    Qwen3ForCausalLM(scaled_config(rope, tie_word_embeddings=False)).save_pretrained(str(directory))
    return str(directory)


@pytest.fixture(scope="module", params=["default", "yarn"])
def zlab_export(request, tmp_path_factory):
    root = tmp_path_factory.mktemp(f"zlab-{request.param}")
    target = _target(root / "target", request.param)
    cfg = tiny_recipe("dflash", target, labels="zlab", intermediate_size=96)
    drafter = trained_drafter(cfg)
    run = write_training_output(drafter, cfg, root / "run")
    out = export_drafter(run, target, root / "export", dtype=torch.float32)
    return out, target, drafter


def test_automodel_builds_our_modeling_code(zlab_export):
    out, _, drafter = zlab_export
    model = AutoModel.from_pretrained(str(out), trust_remote_code=True)
    assert type(model).__name__ == "DFlashDraftModel" and model.block_size == drafter.block_size
    assert model.mask_token_id == drafter.mask_token_id and model.target_layer_ids == drafter.target_layer_ids
    assert type(AutoModel.from_pretrained(str(out), trust_remote_code=False)).__name__ == "Qwen3Model"


def test_forward_equals_parallel_drafter_with_zlab_labels(zlab_export):
    out, _, drafter = zlab_export
    model = AutoModel.from_pretrained(str(out), trust_remote_code=True, dtype=torch.float32).eval()
    batch = random_batch("dflash", seed=4, labels="zlab")
    with torch.no_grad():
        ours = drafter.backbone(batch)
        our_logits = slot_logits(drafter, batch)
        for b in range(batch.num_blocks):
            seq, anchor = int(batch.block_seq[b]), int(batch.block_anchor[b])
            rows = (batch.ctx_seq == seq) & (batch.ctx_pos < anchor)
            positions = torch.cat([batch.ctx_pos[rows], anchor + torch.arange(batch.block_size)]).unsqueeze(0)
            noise = drafter.embed_tokens(batch.block_input[b]).unsqueeze(0)
            states = model(batch.ctx_features[rows].unsqueeze(0), noise, positions)
            torch.testing.assert_close(states[0], ours[b], rtol=1e-5, atol=1e-5)
            logits = model.compute_logits(states, drafter.lm_head)
            torch.testing.assert_close(logits[0], our_logits[b], rtol=1e-5, atol=1e-5)


def test_greedy_spec_generate_is_the_target_greedy_output(zlab_export):
    out, target_dir, _ = zlab_export
    model = AutoModel.from_pretrained(str(out), trust_remote_code=True, dtype=torch.float32).eval()
    target = AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.float32).eval()
    prompt = torch.tensor([[5, 17, 3, 44, 8, 61, 2]])
    want = target.generate(prompt, max_new_tokens=24, do_sample=False, pad_token_id=0)
    got = model.spec_generate(input_ids=prompt, max_new_tokens=24, target=target)
    assert torch.equal(got, want)
    stop = int(want[0, prompt.shape[1] + 5])
    stopped = model.spec_generate(input_ids=prompt, max_new_tokens=24, target=target, stop_token_ids=[stop])
    first = prompt.shape[1] + want[0, prompt.shape[1]:].tolist().index(stop)
    assert torch.equal(stopped, want[:, : first + 1])
    with pytest.raises(ValueError, match="greedily only"):
        model.spec_generate(input_ids=prompt, max_new_tokens=4, target=target, temperature=0.7)


@pytest.mark.parametrize("correct", [6, 2])
def test_spec_generate_keeps_exactly_the_accepted_drafts(zlab_export, correct):
    """An oracle drafter (its first ``correct`` drafts of a block are the target's greedy tokens, the rest wrong)
    exercises acceptance, cache rollback and context growth: the output is still the target's greedy output, in
    as many verification rounds as ``correct + 1`` tokens a round implies."""
    out, target_dir, _ = zlab_export
    model = AutoModel.from_pretrained(str(out), trust_remote_code=True, dtype=torch.float32).eval()
    target = AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.float32).eval()
    prompt, new = torch.tensor([[5, 17, 3, 44, 8, 61, 2]]), 30
    want = target.generate(prompt, max_new_tokens=new, do_sample=False, pad_token_id=0)[0]
    anchors, vocab = [], target.config.vocab_size
    forward = model.forward

    def remember_anchor(target_hidden, noise_embedding, position_ids):
        anchors.append(int(position_ids[0, -model.block_size]))
        return forward(target_hidden, noise_embedding, position_ids)

    def oracle_logits(hidden, lm_head):
        anchor, logits = anchors[-1], torch.zeros(1, hidden.shape[1], vocab)
        for j in range(hidden.shape[1]):
            position = anchor + 1 + j
            right = int(want[position]) if position < len(want) else 0
            logits[0, j, right if j < correct else (right + 1) % vocab] = 1.0
        return logits

    model.forward, model.compute_logits = remember_anchor, oracle_logits
    calls = []
    handle = target.register_forward_hook(lambda *_: calls.append(1))
    try:
        got = model.spec_generate(input_ids=prompt, max_new_tokens=new, target=target)
    finally:
        handle.remove()
    assert torch.equal(got[0], want)
    per_round = min(correct, model.block_size - 1) + 1
    assert len(calls) == 1 + -(-(new - 1) // per_round)
