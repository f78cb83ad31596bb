"""What reasoning rows cost the tokenising pass, and how much of them ``data.supervise_reasoning`` supervises.

Run: ``PYTHONPATH=. python bench/reasoning_mask_cost.py [--tokenizer artifacts/tinyworld/target] [--rows 2000]``

Renders ``--rows`` synthetic single-turn conversations with ``render_with_loss_mask`` (the work a cache miss does
per row) three ways: answers without reasoning; answers opening with a ``<think>`` block, reasoning supervised
(one extra rendering per reasoning turn: the check that the template writes the reasoning); the same rows with
reasoning left out of the loss (two more: the answer-start probes). The tokenizer's chat template is replaced by
the project's ChatML template (a tiny world built before reasoning fields existed ships an older one). Prints rows
per second and the share of tokens supervised for each.
"""

from __future__ import annotations

import argparse
import random
import time

from transformers import AutoTokenizer

from deepspec_train.data.chatml_template import CHATML_TEMPLATE
from deepspec_train.data.conversations import normalize_conversation
from deepspec_train.data.loss_mask import render_with_loss_mask

WORDS = ("the", "sum", "of", "two", "and", "three", "is", "five", "so", "we", "add", "them", "first", "then")


def synthetic_rows(count: int, reasoning: bool, seed: int = 0) -> list[dict]:
    """Conversations of a ~20-word question, a ~120-word reasoning trace (when asked) and a ~40-word answer."""
    rng = random.Random(seed)

    def text(words: int) -> str:
        return " ".join(rng.choice(WORDS) for _ in range(words))

    rows = []
    for _ in range(count):
        answer = text(40)
        content = f"<think>\n{text(120)}\n</think>\n\n{answer}" if reasoning else answer
        rows.append({"messages": [{"role": "user", "content": text(20)}, {"role": "assistant", "content": content}]})
    return rows


def measure(tokenizer, rows: list[dict], supervise_reasoning: bool) -> tuple[float, float]:
    """(rows per second, supervised share of tokens) of rendering ``rows``."""
    supervised = total = 0
    start = time.perf_counter()
    for index, row in enumerate(rows):
        messages = normalize_conversation(row, f"synthetic:{index}")
        _, mask = render_with_loss_mask(tokenizer, messages, supervise_reasoning=supervise_reasoning)
        supervised += sum(mask)
        total += len(mask)
    return len(rows) / (time.perf_counter() - start), supervised / total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokenizer", default="artifacts/tinyworld/target")
    parser.add_argument("--rows", type=int, default=2000)
    args = parser.parse_args()
    tokenizer = AutoTokenizer.from_pretrained(args.tokenizer)
    tokenizer.chat_template = CHATML_TEMPLATE
    cases = (
        ("no reasoning", synthetic_rows(args.rows, False), True),
        ("reasoning, supervised", synthetic_rows(args.rows, True), True),
        ("reasoning, not supervised", synthetic_rows(args.rows, True), False),
    )
    for name, rows, supervise_reasoning in cases:
        rate, share = measure(tokenizer, rows, supervise_reasoning)
        print(f"{name:28s} {rate:8.0f} rows/s  supervised {share:.3f} of tokens")


if __name__ == "__main__":
    main()
