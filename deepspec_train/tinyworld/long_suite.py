"""The tiny world's long-context suite (``suites/long.jsonl``): multi-turn conversations that fill most of the
target's positions, so ``deepspec eval`` measures acceptance deep into a context.

The tiny target answers briefly (it was trained on short conversations in ``seq_len``-token windows, and ends a
turn with ``<|im_end|>`` after at most a few hundred tokens), so one answer never reaches 1K tokens; decoding
past its end-of-turn token would change what is measured (the evaluator stays exact: it stops where the target
stops). What a long context needs is many turns: each conversation chains held-out prompts of the evaluation
suites (never trained on, by the target or a drafter) as the user turns of one conversation, and the evaluator
decodes every answer with the target itself, on one cache, turn after turn. Turns are added until the
conversation's expected length reaches ``LONG_CONTEXT_TOKENS``: the rendered prompt and original corpus answer of
each turn, as the target's own answers are not known before decoding. Turns that would not fit within the
target's positions are not started (``SpeculativeDecoder.decode_conversation``).

Each conversation draws its turns from its own seeded shuffle of the pool, so a prompt appears at most once per
conversation but may recur across conversations (a small world's pool holds only a few conversations' worth).
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from transformers import PreTrainedTokenizerBase

from deepspec_train.tinyworld.target_training import CHAT_KWARGS, MAX_POSITION_EMBEDDINGS

# Three quarters of the target's positions: the target's answers may run longer than the corpus answers the
# estimate counts, and the last turns must still fit.
LONG_CONTEXT_TOKENS = 3 * MAX_POSITION_EMBEDDINGS // 4
LONG_SUITE_CATEGORY = "long"


def conversation_tokens(tokenizer: PreTrainedTokenizerBase, row: dict) -> int:
    """Tokens of one corpus conversation rendered with the chat template (prompt and original answer)."""
    text = tokenizer.apply_chat_template(row["messages"], tokenize=False, **CHAT_KWARGS)
    return len(tokenizer(text, add_special_tokens=False)["input_ids"])


def long_suite_rows(
    pool: Sequence[dict], tokenizer: PreTrainedTokenizerBase, count: int, seed: int
) -> list[dict]:
    """``count`` suite rows (``id``, ``category``, ``turns``), each the user turns of pool conversations chained
    until their expected length reaches ``LONG_CONTEXT_TOKENS``."""
    if not pool:
        raise ValueError("no held-out conversation to build the long suite from")
    lengths = [conversation_tokens(tokenizer, row) for row in pool]
    rows = []
    for index in range(count):
        order = list(range(len(pool)))
        random.Random(f"{seed}-long-{index}").shuffle(order)
        turns, expected = [], 0
        for i in order:
            if expected >= LONG_CONTEXT_TOKENS:
                break
            turns.append(next(m["content"] for m in pool[i]["messages"] if m["role"] == "user"))
            expected += lengths[i]
        rows.append({"id": f"long-{index:03d}", "category": LONG_SUITE_CATEGORY, "turns": turns})
    return rows
