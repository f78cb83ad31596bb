"""DSpark over a reduced draft vocabulary (``drafter.draft_vocab_size``), as vLLM serves it: the LM head (frozen
rows of the target's) and the Markov factor ``W2`` have one row per draft token, the Markov input ``W1`` and the
token embedding keep the target vocabulary, and ``d2t`` / ``t2d`` map draft ids to target ids.

Checked here: the module's heads and maps, the training loss against a brute-force computation from the full
draft distribution (target mass outside the draft vocabulary counts as uncovered), the kind's rules, a full
vocabulary leaving the module exactly as before, and training on the tiny world (colocated and streamed equal)
with an export in the speculators layout (``deepspec export``: vLLM serves it, SGLang is named as not serving it,
the DeepSpec layout refuses it) that reloads into the same module. Losslessness of decoding with a reduced vocabulary is
in ``tests/test_losslessness.py``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from deepspec_train.config.schema import LossConfig, RecipeConfig, TargetConfig
from deepspec_train.formats.drafter_loader import load_exported_drafter
from deepspec_train.commands.dispatch import main as deepspec
from deepspec_train.kinds.registry import kind_spec
from deepspec_train.models.draft_vocab import build_draft_vocab
from deepspec_train.models.parallel_drafter import ParallelDrafter
from deepspec_train.packing.anchors import sample_anchors
from deepspec_train.target.head_weights import load_head_weights
from deepspec_train.training.batch_loss import DrafterLoss
from deepspec_train.packing.packer import pack_sequences
from tests.helpers.tiny_drafter import LAYER_IDS, drafter_config, random_item
from tests.helpers.tiny_geometry import BLOCK, MASK_ID, TINY_GEOMETRY, VOCAB
from tests.helpers.streaming_world import free_port
from tests.helpers.tiny_world_overrides import training_overrides
from tests.helpers.slot_logits import slot_logits

REPO = Path(__file__).resolve().parents[1]
DRAFT = 40


def _reduced_drafter(seed: int = 0, head_type: str = "vanilla") -> ParallelDrafter:
    torch.manual_seed(seed)
    counts = torch.randint(0, 1000, (VOCAB,))
    cfg = drafter_config("dspark", draft_vocab_size=DRAFT, markov_head_type=head_type)
    module = kind_spec("dspark").build(cfg, TINY_GEOMETRY, LAYER_IDS, counts)
    embed, head = torch.randn(VOCAB, TINY_GEOMETRY.hidden_size), torch.randn(VOCAB, TINY_GEOMETRY.hidden_size)
    kind_spec("dspark").load_frozen_heads(module, embed, head)
    with torch.no_grad():
        module.markov_head.markov_w2.weight.normal_(std=0.3)
    return module


def test_heads_and_maps_follow_the_draft_vocabulary() -> None:
    torch.manual_seed(0)
    counts = torch.randint(0, 1000, (VOCAB,))
    vocab = build_draft_vocab(counts, DRAFT)
    module = kind_spec("dspark").build(drafter_config("dspark", draft_vocab_size=DRAFT), TINY_GEOMETRY, LAYER_IDS, counts)
    embed, head = torch.randn(VOCAB, TINY_GEOMETRY.hidden_size), torch.randn(VOCAB, TINY_GEOMETRY.hidden_size)
    kind_spec("dspark").load_frozen_heads(module, embed, head)
    assert torch.equal(module.d2t, vocab.d2t) and torch.equal(module.t2d, vocab.t2d)
    # The draft tokens are the most frequent ones; the LM head holds exactly their rows of the target's head.
    kept = set(vocab.target_ids().tolist())
    assert min(int(counts[i]) for i in kept) >= max(int(counts[i]) for i in range(VOCAB) if i not in kept)
    assert torch.equal(module.lm_head.weight, head[vocab.target_ids()])
    assert torch.equal(module.embed_tokens.weight, embed)
    assert module.markov_head.markov_w1.weight.shape == (VOCAB, 8)
    assert module.markov_head.markov_w2.weight.shape == (DRAFT, 8)
    assert not module.lm_head.weight.requires_grad


def test_a_full_vocabulary_leaves_the_module_as_before() -> None:
    torch.manual_seed(1)
    reference = ParallelDrafter(TINY_GEOMETRY, drafter_config("dspark"), LAYER_IDS)
    torch.manual_seed(1)
    full = ParallelDrafter(TINY_GEOMETRY, drafter_config("dspark"), LAYER_IDS,
                           build_draft_vocab(torch.ones(VOCAB, dtype=torch.long), None))
    assert full.draft_vocab is None and "d2t" not in full.state_dict()
    assert all(torch.equal(a, b) for a, b in zip(reference.state_dict().values(), full.state_dict().values()))
    assert list(reference.state_dict()) == list(full.state_dict())


def _brute_force_loss(module, target_head, batch, output, cfg) -> tuple[torch.Tensor, torch.Tensor]:
    """Loss and ``c*`` from the full tempered distributions: p_d on draft ids scattered to target ids (zero
    elsewhere), p_t over the target vocabulary; TV over the target vocabulary covers the uncovered mass."""
    supervised = batch.supervised_mask
    logits = slot_logits(module, batch)[supervised]
    p_draft = torch.zeros(logits.shape[0], VOCAB).index_copy_(1, module.draft_vocab.target_ids(), logits.softmax(-1))
    p_target = (batch.target_hidden @ target_head.T).softmax(-1)
    labels = batch.labels[supervised]
    tv = 0.5 * (p_draft - p_target).abs().sum(-1)
    c_star = torch.minimum(p_draft, p_target).sum(-1)
    in_vocab = module.t2d[labels]
    ce = torch.where(in_vocab, -torch.log(p_draft.gather(1, labels[:, None]).squeeze(1).clamp_min(1e-30)), 0.0)
    weights = kind_spec("dspark").slot_weights(module, cfg)[output.slot_index]
    bce = torch.nn.functional.binary_cross_entropy_with_logits(output.conf_logits, c_star, reduction="none")
    loss = (weights * (cfg.loss.alpha_ce * ce + cfg.loss.alpha_tv * tv + cfg.loss.alpha_conf * bce)).sum()
    return loss / supervised.sum(), c_star


@pytest.mark.parametrize("head_type", ["vanilla", "rnn"])
def test_training_loss_equals_the_brute_force_one(head_type: str) -> None:
    module = _reduced_drafter(seed=2, head_type=head_type)
    target_head = torch.randn(VOCAB, TINY_GEOMETRY.hidden_size)
    g = torch.Generator().manual_seed(3)
    items = [random_item(length, i, g) for i, length in enumerate((29, 23, 31))]
    anchors = [sample_anchors(item.loss_mask, 6, g) for item in items]
    (batch,) = pack_sequences(items, anchors, BLOCK, 10_000, MASK_ID)
    # Chunks of 7 rows: the chunked loss crosses chunk boundaries with the draft-vocabulary map and the Markov rows.
    cfg = RecipeConfig(drafter=drafter_config("dspark", draft_vocab_size=DRAFT, markov_head_type=head_type),
                       target=TargetConfig(layer_ids=LAYER_IDS), loss=LossConfig(chunk_size=7))
    loss = DrafterLoss.for_recipe(cfg, target_head, "sdpa")
    got = loss(module, batch, float(batch.supervised_mask.sum())).loss
    output = module(batch)
    expected, c_star = _brute_force_loss(module, target_head, batch, output, cfg)
    torch.testing.assert_close(got.loss, expected, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(got.c_star, c_star, rtol=1e-5, atol=1e-6)


def test_the_kinds_rules_for_a_draft_vocabulary() -> None:
    def problems(kind: str, size: int) -> list[str]:
        overrides = {"draft_vocab_size": size}
        return kind_spec(kind).recipe_problems(RecipeConfig(drafter=drafter_config(kind, **overrides),
                                                           target=TargetConfig(layer_ids=LAYER_IDS)))

    assert problems("dspark", DRAFT) == []
    assert problems("dspark", 0) == ["drafter.draft_vocab_size = 0 must be >= 1 (or unset: full vocabulary)"]
    assert problems("dflash", DRAFT) == [
        f"drafter.draft_vocab_size = {DRAFT} is not used by drafter.kind=dflash (leave it unset)"
    ]


def test_a_checkpoint_without_its_maps_is_refused() -> None:
    module = _reduced_drafter()
    state = {k: v for k, v in module.state_dict().items() if k not in ("d2t", "t2d")}
    with pytest.raises(ValueError, match="no d2t/t2d maps for its 40-token draft vocabulary"):
        kind_spec("dspark").complete_state(drafter_config("dspark", draft_vocab_size=DRAFT), TINY_GEOMETRY, state)


@pytest.mark.slow
def test_reduced_vocab_dspark_trains_colocated_and_streamed_and_reloads(tiny_world: Path, tmp_path: Path) -> None:
    """Colocated and streamed (1 target + 1 drafter) runs of the same recipe give the same losses and weights;
    the target worker counts the tokens that choose the draft vocabulary for the drafter worker."""
    draft = 128
    runs = {}
    # torchrun gives each worker one intra-op thread; the colocated run gets the same, since a CPU reduction split
    # over two threads sums in another order and the runs would then differ in the last bits.
    env = dict(os.environ, OMP_NUM_THREADS="1")
    for mode, launch in {"colocated": [sys.executable], "streamed": [
        sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port", str(free_port()),
    ]}.items():
        out = tmp_path / mode
        args = ["recipe=tiny-dspark-v1k", f"drafter.draft_vocab_size={draft}", *training_overrides(tiny_world, "tiny-dspark", out, 3),
                "logging.wandb=false"]
        if mode == "streamed":
            args.append("topology.target_workers=1")
        proc = subprocess.run([*launch, "train.py", *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
        assert proc.returncode == 0, proc.stderr[-3000:]
        records = [json.loads(line) for line in (out / "run" / "metrics.jsonl").read_text().splitlines()]
        runs[mode] = (out / "run", [r["train/loss"] for r in records if "train/loss" in r])
    (colocated, losses), (streamed, streamed_losses) = runs["colocated"], runs["streamed"]
    assert len(losses) == 3 and losses == streamed_losses
    weights = load_file(str(colocated / "drafter" / "drafter.safetensors"))
    other = load_file(str(streamed / "drafter" / "drafter.safetensors"))
    assert weights.keys() == other.keys() and all(torch.equal(weights[k], other[k]) for k in weights)
    assert weights["markov_head.markov_w2.weight"].shape[0] == draft and weights["d2t"].shape == (draft,)
    loaded = load_exported_drafter(colocated / "drafter")
    assert loaded.module.lm_head.weight.shape[0] == draft
    assert int(loaded.module.t2d.sum()) == draft
    _exports_in_the_speculators_layout_and_reloads_equal(tiny_world, colocated / "drafter", tmp_path / "export", draft)


def _exports_in_the_speculators_layout_and_reloads_equal(tiny_world: Path, drafter: Path, out: Path, draft: int) -> None:
    target = tiny_world / "target"
    args = ["export", "--drafter", str(drafter), "--target", str(target), "--dtype", "fp32"]
    assert deepspec(args + ["--out", str(out.with_name("refused")), "--layout", "dspark"]) == 2
    assert not out.with_name("refused").exists()
    assert deepspec(args + ["--out", str(out)]) == 0
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == ["DSparkSpeculator"] and config["speculators_model_type"] == "dspark"
    assert config["draft_vocab_size"] == draft and config["sample_from_anchor"] is True
    assert config["aux_hidden_state_layer_ids"] == [k + 1 for k in config["target_layer_ids"]]
    assert config["speculators_config"]["proposal_methods"][0]["speculative_tokens"] == config["block_size"]
    assert config["transformer_layer_config"]["num_hidden_layers"] == config["num_hidden_layers"]
    tensors = load_file(str(out / "model.safetensors"))
    assert tensors["lm_head.weight"].shape[0] == draft and tensors["d2t"].dtype == torch.int64
    head = load_head_weights(str(target))[1]
    ids = torch.arange(draft) + tensors["d2t"]
    assert torch.equal(tensors["lm_head.weight"], head[ids].float())
    readme = (out / "README.md").read_text()
    assert "vllm serve" in readme and "SGLang 0.5.23 does not read the speculators format" in readme
    exported, trained = load_exported_drafter(out, str(target)), load_exported_drafter(drafter, str(target))
    assert exported.source == "speculators-dspark" and exported.kind == "dspark"
    state, reference = exported.module.state_dict(), trained.module.state_dict()
    assert state.keys() == reference.keys() and all(torch.equal(state[k], reference[k]) for k in state)
