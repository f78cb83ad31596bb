"""Shared helper of the mixture-of-experts tests (the ``moe_world`` fixture in ``conftest.py``): a random-weight
scale model of Qwen3-30B-A3B (``models.scale_targets``: 48 decoder layers, the 151,936-token vocabulary, 128
experts routing 8 per token, hidden size 32) with the test chat tokenizer, and a few JSONL conversations; the
``shallow_moe_world`` fixture has the same target with 4 decoder layers, for the multi-process tests."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

from deepspec_train.models.reference_configs import qwen3_moe_reference_configs
from deepspec_train.models.scale_targets import save_scale_moe_target
from tests.chat_tokenizer import build_chat_tokenizer
from tests.streaming_helpers import write_conversations

MOE_REFERENCE = "Qwen3-30B-A3B"


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
