"""Shared helper of the mixture-of-experts tests (the ``moe_world`` fixture in ``conftest.py``): a random-weight
model with Qwen3-30B-A3B's structure (48 decoder layers, the 151,936-token vocabulary, 128 experts routing 8 per
token) at hidden size 32 with 4 / 2 heads, so that tensor-parallel groups of 2 split them, with the test chat
tokenizer, and a few JSONL conversations; the ``shallow_moe_world`` fixture has the same target with 4 decoder
layers, for the multi-process tests. (The scale-model tier's MoE copies, which keep the published head counts,
come from ``models.scale_targets``.) ``moe_overrides`` points the ``qwen3-30b-a3b`` recipe at such a world."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Optional

import torch
from transformers import AutoTokenizer, Qwen3MoeConfig, Qwen3MoeForCausalLM

from deepspec_train.models.reference_configs import qwen3_moe_reference_configs
from tests.helpers.chat_tokenizer import build_chat_tokenizer
from tests.helpers.streaming_world import write_conversations

MOE_REFERENCE = "Qwen3-30B-A3B"

# Files of a tokenizer directory copied next to a scale target, so the directory is a complete target.path.
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja",
                   "vocab.json", "merges.txt")


def scale_moe_config(
    reference: Qwen3MoeConfig,
    hidden_size: int = 32,
    num_attention_heads: int = 4,
    num_key_value_heads: int = 2,
    head_dim: int = 8,
    moe_intermediate_size: int = 16,
    intermediate_size: int = 64,
    initializer_range: float = 0.02,
    num_hidden_layers: Optional[int] = None,
) -> Qwen3MoeConfig:
    """``reference``'s structure at the given widths (see the module docstring). ``num_hidden_layers`` (default:
    the reference's) is for tests of the transport rather than of shapes, where 48 layers only cost time."""
    config = Qwen3MoeConfig(**reference.to_dict())
    if num_hidden_layers is not None:
        config.num_hidden_layers = num_hidden_layers
    config.hidden_size = hidden_size
    config.num_attention_heads = num_attention_heads
    config.num_key_value_heads = num_key_value_heads
    config.head_dim = head_dim
    config.moe_intermediate_size = moe_intermediate_size
    config.intermediate_size = intermediate_size
    config.initializer_range = initializer_range
    config.architectures = ["Qwen3MoeForCausalLM"]
    return config


def save_scale_moe_target(
    reference: Qwen3MoeConfig,
    directory: str | Path,
    seed: int = 0,
    tokenizer_dir: Optional[str | Path] = None,
    **widths: int,
) -> str:
    """Write a random-weight ``Qwen3MoeForCausalLM`` of ``scale_moe_config(reference, **widths)`` (fp32
    safetensors) to ``directory``; with ``tokenizer_dir``, its tokenizer files too and its end / padding tokens
    in the model's config (what generation stops on). Returns the path."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    config = scale_moe_config(reference, **widths)
    tokenizer = None
    if tokenizer_dir is not None:
        tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_dir))
        config.eos_token_id, config.pad_token_id, config.bos_token_id = tokenizer.eos_token_id, tokenizer.pad_token_id, None
    torch.manual_seed(seed)
    model = Qwen3MoeForCausalLM(config)
    if tokenizer is not None:
        model.generation_config.eos_token_id = tokenizer.eos_token_id
        model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.save_pretrained(str(directory))
    if tokenizer_dir is not None:
        for name in TOKENIZER_FILES:
            source = Path(tokenizer_dir) / name
            if source.is_file():
                shutil.copy(source, directory / name)
    return str(directory)


def build_moe_world(root: Path, num_hidden_layers: Optional[int] = None) -> dict[str, str]:
    """Target directory, train / validation JSONL and a shard cache directory under ``root`` (a target with
    ``num_hidden_layers`` decoder layers instead of 48 when given: same experts, heads and vocabulary)."""
    root.mkdir(parents=True, exist_ok=True)
    build_chat_tokenizer(root / "tokenizer")
    # Weights far larger than the usual 0.02, so that the random target's next-token distributions are peaked
    # and a drafter that does not follow them is visibly rejected.
    target = save_scale_moe_target(qwen3_moe_reference_configs()[MOE_REFERENCE], root / "target",
                                   tokenizer_dir=root / "tokenizer", initializer_range=0.5,
                                   num_hidden_layers=num_hidden_layers)
    return {
        "target": target,
        "train": write_conversations(root / "train.jsonl", 8, seed=3),
        "validation": write_conversations(root / "validation.jsonl", 4, seed=4),
        "cache": str(root / "cache"),
    }


def moe_overrides(world: dict[str, str], out: Path, **extra: object) -> list[str]:
    """``qwen3-30b-a3b`` overrides: the scale target and the test conversations, a few fast colocated steps."""
    values = {
        "target.path": world["target"], "target.dtype": "float32",
        "data.train": f"[{world['train']}]", "data.validation": f"[{world['validation']}]",
        "data.cache_dir": world["cache"], "data.max_length": 96, "data.num_workers": 0,
        "train.max_steps": 1, "train.global_batch_sequences": 2, "train.micro_batch_sequences": 2,
        "train.eval_every": 1, "train.eval_sequences": 2, "train.checkpoint_every": 1000,
        "train.mixed_precision": "'no'", "loss.chunk_size": 256, "topology.target_workers": 0,
        "logging.wandb": "false", "logging.progress": "false", "logging.log_every": 1, "run.output_dir": str(out),
    }
    values.update(extra)
    return [f"{k}={v}" for k, v in values.items()]
