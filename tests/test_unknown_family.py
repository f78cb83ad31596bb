"""A target the project knows by no family record still trains: any causal LM whose decoder transformers exposes
(``model.layers`` and ``model.norm``) trains DSpark with ``target.layer_ids`` given explicitly, exports, and
``deepspec export`` names each engine as not stating a capture rule for it while still writing the checkpoint.
A model without that structure, or whose config lacks a field the drafter copies, fails in one line naming
what is missing (no traceback).

The targets are random Mistral, Phi-3 and OLMo-2 models (transformers' own classes) on the tiny world's
tokenizer and the scale tier's short conversations, trained colocated for 2 steps; the refusal is a random GPT-2.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import (AutoModelForCausalLM, GPT2Config, MistralConfig, Olmo2Config, Phi3Config)

from deepspec_train.common.errors import UserError
from deepspec_train.commands.dispatch import main as deepspec
from deepspec_train.jobs.run import run_training
from deepspec_train.models.geometry import geometry_from_target_config
from deepspec_train.kinds.recipe_validation import load_recipe
from tests.helpers.scale_world import TRAIN_CONVERSATIONS, VALIDATION_CONVERSATIONS, write_conversations

REPO = Path(__file__).resolve().parents[1]
pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_torch_thread")]

_SHAPE = dict(vocab_size=4096, hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=1024,
              # The tiny world's <|endoftext|>, <|im_start|>, <|im_end|> (Phi-3's defaults lie past 4,096 rows).
              pad_token_id=0, bos_token_id=1, eos_token_id=2)
UNKNOWN = {"MistralForCausalLM": MistralConfig, "Phi3ForCausalLM": Phi3Config, "Olmo2ForCausalLM": Olmo2Config}
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")


def _save_target(directory: Path, config, tiny_world: Path) -> Path:
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config).save_pretrained(str(directory))
    for name in TOKENIZER_FILES:
        shutil.copy(tiny_world / "target" / name, directory / name)
    return directory


def _few_conversations(tiny_world: Path, root: Path) -> dict[str, Path]:
    """The scale tier's short conversations (a dozen-token answers), rendered with the tiny world's template."""
    files = {"train": root / "train.jsonl", "validation": root / "validation.jsonl"}
    write_conversations(files["train"], TRAIN_CONVERSATIONS, seed=1)
    write_conversations(files["validation"], VALIDATION_CONVERSATIONS, seed=2)
    return files


def _overrides(target: Path, data: dict[str, Path], out: Path) -> list[str]:
    return [f"target.path={target}", "target.layer_ids=[1,2]", f"data.train=[{data['train']}]",
            f"data.validation=[{data['validation']}]", f"data.cache_dir={out / 'cache'}", "data.max_length=128",
            "train.max_steps=2", "train.global_batch_sequences=2", "train.micro_batch_sequences=2",
            "train.eval_every=2", "train.eval_sequences=2", "logging.wandb=false", "logging.progress=false",
            f"run.output_dir={out / 'run'}"]


@pytest.mark.parametrize("architecture", sorted(UNKNOWN))
def test_unknown_family_trains_dspark_and_exports_with_engines_named(architecture: str, tiny_world: Path,
                                                                    tmp_path: Path, capsys) -> None:
    config = UNKNOWN[architecture](**_SHAPE, architectures=[architecture])
    target = _save_target(tmp_path / "target", config, tiny_world)
    cfg = load_recipe("tiny-dspark", _overrides(target, _few_conversations(tiny_world, tmp_path), tmp_path))
    assert run_training(cfg).steps == 2
    export = tmp_path / "export"
    argv = ["export", "--drafter", str(tmp_path / "run" / "drafter"), "--target", str(target), "--out", str(export)]
    assert deepspec(argv) == 0
    printed = capsys.readouterr().out
    for engine in ("vllm", "sglang"):
        assert f"{engine}: not served: its capture rule for a {architecture} target is not known here" in printed
    written = json.loads((export / "config.json").read_text())
    assert written["target_layer_ids"] == [1, 2] and written["num_target_layers"] == 4


def _train_py(target: Path, data: dict[str, Path], out: Path, *extra: str) -> list[str]:
    proc = subprocess.run([sys.executable, "train.py", "recipe=tiny-dspark", *_overrides(target, data, out), *extra],
                          cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stderr[-3000:]
    lines = [line for line in proc.stderr.splitlines() if line.startswith("error:") or "Traceback" in line]
    assert len(lines) == 1, proc.stderr[-3000:]
    return lines


def test_a_target_without_what_the_drafter_reads_fails_in_one_line(tiny_world: Path, tmp_path: Path) -> None:
    gpt2 = GPT2Config(vocab_size=4096, n_embd=64, n_layer=4, n_head=4, n_positions=1024,
                      architectures=["GPT2LMHeadModel"])
    target = _save_target(tmp_path / "gpt2", gpt2, tiny_world)
    (line,) = _train_py(target, _few_conversations(tiny_world, tmp_path), tmp_path / "run")
    assert "GPT2LMHeadModel: no model: the drafter's taps need transformers' decoder-layer list" in line
    # A config without the fields a drafter copies is named the same way (a streamed drafter worker reads only it).
    with pytest.raises(UserError, match=r"target config \(GPT2Config\) has no intermediate_size, "
                                        r"num_key_value_heads, rms_norm_eps"):
        geometry_from_target_config(gpt2)
