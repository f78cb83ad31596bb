"""Test helper: the on-disk world of the scale-model tier, one per production target.

``build_scale_world(root, "Qwen3-8B")`` writes ``root/target`` (the random-weight scale copy of the target from
``deepspec_train.models.scale_targets`` plus a Qwen3-layout tokenizer from ``tests/helpers/qwen3_tokenizer.py``) and a
few training / validation conversations as JSONL, in the OpenAI messages form the data path reads (system
prompts, multi-turn chats; no reasoning in the answers, since the recipes render data with thinking off).
``scale_overrides`` points a production recipe at that world and shrinks only its sizes and step count.

``SCALE_TIER`` is the tier's table: production recipe -> the scale target it trains on (a key of
``scale_targets.SCALE_TARGETS``). Adding a recipe to the tier is one row there (and, for a new target family, a
``ScaleTarget``).
"""

from __future__ import annotations

import json
import random
from pathlib import Path

from deepspec_train.models.scale_targets import save_scale_target
from tests.helpers.qwen3_tokenizer import build_qwen3_tokenizer

WORDS = (
    "the a model drafts tokens block target verifies accepted every step cache layer hidden state python "
    "function returns value list sum of two numbers is five seven answer question explain briefly why how "
    "speculative decoding faster output same distribution"
).split()
SYSTEM_PROMPTS = ("You are a helpful assistant.", "Answer in one short paragraph.")
# Sequence length and sequences per step of the tier: answers of about a dozen tokens give every sequence 10-20
# anchors (each a fully supervised block of 7 for most of them) and a step about 150 supervised slots, so a DSpark
# step's V x r Markov logits (151,936 x 256) take about a second on 2 cores.
MAX_LENGTH = 96
GLOBAL_BATCH = 2
TRAIN_CONVERSATIONS = 6
VALIDATION_CONVERSATIONS = 2

SCALE_TIER: dict[str, str] = {
    **{
        f"qwen3-{size}{variant}": target
        for size, target in (("4b", "Qwen3-4B"), ("8b", "Qwen3-8B"), ("14b", "Qwen3-14B"))
        for variant in ("", "-dflash", "-eagle3")
    },
    "qwen3-8b-dflash2": "Qwen3-8B",
    "qwen3-8b-v32k": "Qwen3-8B",
    "qwen3-30b-a3b": "Qwen3-30B-A3B",
    "qwen3-235b-a22b": "Qwen3-235B-A22B",
}


def _sentence(rng: random.Random, low: int, high: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(low, high))).capitalize() + "."


def _conversation(rng: random.Random, index: int) -> list[dict[str, str]]:
    messages = []
    if index % 2 == 0:
        messages.append({"role": "system", "content": SYSTEM_PROMPTS[index % len(SYSTEM_PROMPTS)]})
    for turn in range(1 + index % 3 // 2):
        messages.append({"role": "user", "content": _sentence(rng, 4, 10)})
        answer = _sentence(rng, 7, 11)
        messages.append({"role": "assistant", "content": answer})
    return messages


def write_conversations(path: Path, count: int, seed: int) -> list[list[dict[str, str]]]:
    rng = random.Random(seed)
    conversations = [_conversation(rng, i) for i in range(count)]
    with path.open("w") as f:
        for i, messages in enumerate(conversations):
            f.write(json.dumps({"id": f"{path.stem}-{i}", "messages": messages}) + "\n")
    return conversations


def build_scale_world(root: Path, target_name: str, seed: int = 0) -> dict[str, str]:
    """Target directory, train / validation JSONL and a shard cache directory under ``root``."""
    root.mkdir(parents=True, exist_ok=True)
    train = write_conversations(root / "train.jsonl", TRAIN_CONVERSATIONS, seed=1)
    validation = write_conversations(root / "validation.jsonl", VALIDATION_CONVERSATIONS, seed=2)
    texts = [m["content"] for c in train + validation for m in c] + ["system", "user", "assistant"]
    target = save_scale_target(target_name, root / "target", seed=seed)
    build_qwen3_tokenizer(target, texts)
    return {
        "target": str(target),
        "train": str(root / "train.jsonl"),
        "validation": str(root / "validation.jsonl"),
        "cache": str(root / "cache"),
    }


def scale_overrides(world: dict[str, str], output_dir: Path, steps: int = 2, **extra: object) -> list[str]:
    """Overrides that point a production recipe at ``world``: paths, sizes and step count, nothing else."""
    values: dict[str, object] = {
        "target.path": world["target"],
        "data.train": f"[{world['train']}]",
        "data.validation": f"[{world['validation']}]",
        "data.cache_dir": world["cache"],
        "data.max_length": MAX_LENGTH,
        "data.num_workers": 0,
        "train.max_steps": steps,
        "train.global_batch_sequences": GLOBAL_BATCH,
        "train.eval_every": steps,
        "train.eval_sequences": GLOBAL_BATCH,
        "logging.wandb": "false",
        "logging.progress": "false",
        "logging.log_every": 1,
        "run.output_dir": str(output_dir),
    }
    values.update(extra)
    return [f"{key}={value}" for key, value in values.items()]
