"""EAGLE-3 with a reduced draft vocabulary trains on the tiny world (``python train.py``, validation included),
exports with its maps and a draft-vocabulary LM head, and reloads through the loader; a full-vocabulary one
exports with no maps and reloads with identity maps. Both exports pass the engines' rules.

The tiny world's `test`-preset target has 2 decoder layers, and no engine can feed an EAGLE-3 drafter three
distinct layers from it (they capture outputs of layers 0..L-2, each once), so the drafters here draft for a
4-layer random-weight target with the tiny world's tokenizer and vocabulary, trained on the tiny world's
conversations.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import Qwen3Config, Qwen3ForCausalLM

from deepspec_train.commands.dispatch import main
from deepspec_train.kinds.recipe_validation import load_recipe
from deepspec_train.formats.drafter_loader import load_exported_drafter
from deepspec_train.jobs.run import run_training
from tests.helpers.tiny_world_overrides import training_overrides
from tests.helpers.slot_logits import slot_logits

REPO = Path(__file__).resolve().parents[1]
DRAFT_VOCAB, TAPS = 128, "[0,1,2]"
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def deeper_target(tiny_world: Path, tmp_path_factory) -> Path:
    """The tiny world's target architecture with 4 decoder layers (random weights) and its tokenizer files."""
    source = tiny_world / "target"
    out = tmp_path_factory.mktemp("target4")
    config = Qwen3Config.from_pretrained(str(source))
    config.num_hidden_layers = 4
    config.layer_types = ["full_attention"] * 4
    torch.manual_seed(0)
    Qwen3ForCausalLM(config).save_pretrained(str(out))
    for path in source.iterdir():
        if path.name not in ("config.json", "model.safetensors"):
            shutil.copy(path, out / path.name)
    return out


def _overrides(tiny_world: Path, target: Path, out: Path, steps: int) -> list[str]:
    args = [a for a in training_overrides(tiny_world, "tiny-eagle3", out, steps) if not a.startswith("target.")]
    return args + [f"target.path={target}", f"target.layer_ids={TAPS}"]


def _same_logits(export: Path, run_drafter: Path, target: Path) -> None:
    from tests.helpers.trained_drafters import random_batch

    exported = load_exported_drafter(export, str(target))
    trained = load_exported_drafter(run_drafter, str(target))
    assert torch.equal(exported.module.d2t, trained.module.d2t) and torch.equal(exported.module.t2d, trained.module.t2d)
    hidden = exported.module.geometry.hidden_size
    batch = random_batch("eagle3", seed=0)
    batch.ctx_features = torch.randn(batch.ctx_features.shape[0], 3 * hidden)
    batch.target_hidden = torch.randn(batch.target_hidden.shape[0], hidden)
    with torch.no_grad():
        torch.testing.assert_close(slot_logits(exported.module, batch), slot_logits(trained.module, batch),
                                   rtol=0, atol=0)


def test_reduced_vocab_eagle3_trains_validates_exports_and_reloads(tiny_world, deeper_target, tmp_path, capsys):
    command = [sys.executable, "train.py", "recipe=tiny-eagle3", f"drafter.draft_vocab_size={DRAFT_VOCAB}",
               *_overrides(tiny_world, deeper_target, tmp_path, steps=3)]
    proc = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    val = [r for r in records if "val/loss" in r][-1]
    assert val["step"] == 3 and val["val/loss"] > 0 and val["val/expected_len"] > 0
    weights = load_file(str(tmp_path / "run" / "drafter" / "drafter.safetensors"))
    assert weights["lm_head.weight"].shape[0] == DRAFT_VOCAB and weights["d2t"].shape == (DRAFT_VOCAB,)

    export = tmp_path / "export"
    assert main(["export", "--drafter", str(tmp_path / "run" / "drafter"), "--target", str(deeper_target),
                 "--out", str(export), "--dtype", "fp32"]) == 0
    printed = capsys.readouterr().out
    assert "vllm: captures the outputs of target decoder layers 0 1 2" in printed
    assert "sglang: captures the outputs of target decoder layers 0 1 2" in printed
    config = json.loads((export / "config.json").read_text())
    assert config["draft_vocab_size"] == DRAFT_VOCAB
    assert config["eagle_aux_hidden_state_layer_ids"] == [1, 2, 3]
    assert config["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [0, 1, 2]
    tensors = load_file(str(export / "model.safetensors"))
    assert tensors["lm_head.weight"].shape == (DRAFT_VOCAB, config["hidden_size"])
    assert tensors["d2t"].dtype == torch.int64 and tensors["t2d"].shape == (config["vocab_size"],)
    assert int(tensors["t2d"].sum()) == DRAFT_VOCAB
    _same_logits(export, tmp_path / "run" / "drafter", deeper_target)


def test_full_vocab_eagle3_exports_without_maps(tiny_world, deeper_target, tmp_path):
    cfg = load_recipe("tiny-eagle3", _overrides(tiny_world, deeper_target, tmp_path, steps=2))
    assert cfg.drafter.draft_vocab_size is None
    assert run_training(cfg).steps == 2
    export = tmp_path / "export"
    assert main(["export", "--drafter", str(tmp_path / "run" / "drafter"), "--target", str(deeper_target),
                 "--out", str(export), "--dtype", "fp32"]) == 0
    tensors = load_file(str(export / "model.safetensors"))
    vocab = json.loads((export / "config.json").read_text())["vocab_size"]
    assert "d2t" not in tensors and "t2d" not in tensors and tensors["lm_head.weight"].shape[0] == vocab
    loaded = load_exported_drafter(export, str(deeper_target))
    assert not bool(loaded.module.d2t.any()) and bool(loaded.module.t2d.all())
    _same_logits(export, tmp_path / "run" / "drafter", deeper_target)
