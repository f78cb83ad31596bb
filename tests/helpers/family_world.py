"""Test helper: the on-disk world of a non-Qwen3 scale target (Llama 3, Gemma 3, GPT-OSS, DeepSeek-V3, Kimi-K2).

``build_family_world(root, "gemma-3-12b-it")`` writes the random-weight scale copy (``models.scale_targets``),
a tokenizer laid out like the family's real one (``tests/family_tokenizers.py``) and the scale tier's training /
validation conversations (``tests/scale_world.py``). ``FAMILY_TIER`` maps each family production recipe to the
scale target it trains on.
"""

from __future__ import annotations

from pathlib import Path

from deepspec_train.models.scale_targets import save_scale_target
from tests.helpers.family_tokenizers import TOKENIZER_LAYOUTS, build_layout_tokenizer
from tests.helpers.scale_world import TRAIN_CONVERSATIONS, VALIDATION_CONVERSATIONS, write_conversations

FAMILY_TIER: dict[str, str] = {
    "llama-3.1-8b": "Llama-3.1-8B-Instruct",
    "llama-3.1-8b-dflash": "Llama-3.1-8B-Instruct",
    "llama-3.1-8b-eagle3": "Llama-3.1-8B-Instruct",
    "llama-3.3-70b": "Llama-3.3-70B-Instruct",
    "gemma-3-12b": "gemma-3-12b-it",
    "gpt-oss-20b": "gpt-oss-20b",
    "gpt-oss-120b": "gpt-oss-120b",
    "deepseek-v3": "DeepSeek-V3",
    "kimi-k2": "Kimi-K2-Instruct",
}


def build_family_world(root: Path, target_name: str, seed: int = 0) -> dict[str, str]:
    """Target directory (weights + tokenizer), train / validation JSONL and a shard cache directory under ``root``."""
    root.mkdir(parents=True, exist_ok=True)
    train = write_conversations(root / "train.jsonl", TRAIN_CONVERSATIONS, seed=1)
    validation = write_conversations(root / "validation.jsonl", VALIDATION_CONVERSATIONS, seed=2)
    texts = [m["content"] for c in train + validation for m in c] + ["system", "user", "assistant", "model"]
    target = save_scale_target(target_name, root / "target", seed=seed)
    build_layout_tokenizer(target, TOKENIZER_LAYOUTS[target_name], texts)
    return {"target": str(target), "train": str(root / "train.jsonl"), "validation": str(root / "validation.jsonl"),
            "cache": str(root / "cache")}
