"""Test helper: the on-disk worlds of the long-context tier (``tests/test_long_context_tier.py``).

``build_long_world(root, length, num_layers)`` writes a scale copy of Qwen3-8B (``models.scale_targets``: all 36
decoder layers, or only ``num_layers`` of them with the same heads and vocabulary), a Qwen3-layout tokenizer
(``tests/helpers/qwen3_tokenizer.py``) and the conversations, tokenised by that tokenizer through the real data
path: one long thinking conversation (a short prompt, then a ``<think>`` trace and an answer that fill the
sequence to nearly ``length`` tokens, so the supervised span reaches the far end) and one short conversation for
training, one short one for validation. ``long_overrides`` points a 32K recipe at such a world.

Why one long sequence and short ones beside it: a CPU's cost at length is the target's causal attention (32
query heads x L^2 / 2 scores per layer: ~1.6 CPU-s per layer at 8,192 tokens, ~26 at 32,768), and one sequence per
step (``train.global_batch_sequences`` 1) puts the long one in one of the two steps and the short one in the
other, so each mode pays one long target forward. The recipes' anchor rule (a floor of 512, 128 per 1,024 valid
positions) is kept in form and scaled down as a size, a floor of ``LONG_ANCHORS`` and ``LONG_ANCHOR_RATE`` per 1K
(5 blocks at 8,192 tokens, 19 at 32,768: the rate, not the floor, decides both), for the same reason on the
drafter's side: 4,096 blocks at 32K context would be 28,672 query slots x 61K keys x 32 heads of dense-mask
attention scores per layer.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

from deepspec_train.models.scale_targets import save_scale_target
from tests.helpers.qwen3_tokenizer import build_qwen3_tokenizer
from tests.helpers.scale_world import WORDS, scale_overrides

# The long-context production recipes and the scale target each trains on.
LONG_CONTEXT_TIER = {"qwen3-8b-32k": "Qwen3-8B", "qwen3-8b-eagle3-32k": "Qwen3-8B"}
LONG_ANCHORS = 4
LONG_ANCHOR_RATE = 0.6
# Tokens the long conversation leaves free under ``data.max_length`` (its chat-template turns and the end).
HEADROOM = 64
SHORT_COPY_LAYERS = 4
# A 4-layer copy cannot hold the recipes' taps [1, 9, 17, 25, 33]: three taps below its last layer.
SHORT_COPY_TAPS = "[0,1,2]"
# The minimal-width copy of the default run: Qwen3-8B's vocabulary and widths, grouped-query attention with the
# fewest heads that still group (2 query heads on 1 key-value head), so a 32,768-token forward costs 1/16 of the
# 32-head copy's attention.
MINIMAL_HEADS = (2, 1)


def _sentence(rng: random.Random) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(6, 14))).capitalize() + "."


def _long_answer(rng: random.Random, tokenizer, budget: int) -> str:
    """A ``<think>`` trace and a final answer of about ``budget`` tokens (counted with ``tokenizer``)."""
    sentences, used = [], 0
    while used < budget:
        sentence = _sentence(rng)
        sentences.append(sentence)
        used += len(tokenizer(" " + sentence, add_special_tokens=False)["input_ids"])
    cut = len(sentences) * 9 // 10
    return "<think>\n" + " ".join(sentences[:cut]) + "\n</think>\n\n" + " ".join(sentences[cut:])


def _write(path: Path, conversations: list[list[dict[str, str]]]) -> str:
    with path.open("w") as f:
        for i, messages in enumerate(conversations):
            f.write(json.dumps({"id": f"{path.stem}-{i}", "messages": messages}) + "\n")
    return str(path)


def _short(rng: random.Random) -> list[dict[str, str]]:
    answer = "<think>\n" + _sentence(rng) + "\n</think>\n\n" + _sentence(rng)
    return [{"role": "user", "content": _sentence(rng)}, {"role": "assistant", "content": answer}]


def build_long_world(root: Path, length: int, num_layers: int = 0, seed: int = 0,
                     heads: tuple[int, int] | None = None) -> dict[str, str]:
    """Target directory, train / validation JSONL and a shard cache directory under ``root`` (``num_layers`` and
    ``heads``: ``save_scale_target``'s)."""
    root.mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)
    target = save_scale_target("Qwen3-8B", root / "target", seed=seed, num_hidden_layers=num_layers, heads=heads)
    samples = [_sentence(rng) for _ in range(200)]
    tokenizer = build_qwen3_tokenizer(target, samples + ["<think>", "</think>", "system", "user", "assistant"])
    long = [{"role": "user", "content": _sentence(rng)},
            {"role": "assistant", "content": _long_answer(rng, tokenizer, length - HEADROOM)}]
    return {
        "target": str(target),
        "train": _write(root / "train.jsonl", [long, _short(rng)]),
        "validation": _write(root / "validation.jsonl", [_short(rng)]),
        "cache": str(root / "cache"),
    }


def long_overrides(world: dict[str, str], output_dir: Path, length: int, **extra: object) -> list[str]:
    """A long-context recipe pointed at ``world``: one sequence a step, the scaled-down anchor rule, ``length``."""
    values = {"data.max_length": length, "train.global_batch_sequences": 1, "train.eval_sequences": 1,
              "anchors.num_per_sequence": LONG_ANCHORS,
              "anchors.per_1k_tokens": LONG_ANCHOR_RATE, **extra}
    return scale_overrides(world, output_dir, **values)
