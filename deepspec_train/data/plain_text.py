"""Plain ``text`` rows (base models, pretraining-style data): tokenised without a chat template, every token
supervised but the first, which nothing in the row precedes.

The tokenizer adds what it adds to any text (``add_special_tokens``): a base model's beginning-of-sequence token,
which it saw before every document in pretraining, comes first and is then the unsupervised token. The sample
is packed and anchored like a conversation's.
"""

from __future__ import annotations

from typing import Any

from deepspec_train.data.conversations import BadRow


def text_with_loss_mask(tokenizer: Any, text: str, max_length: int | None = None) -> tuple[list[int], list[int]]:
    """Token ids of ``text`` and a mask that is 1 on every token but the first.

    Raises ``BadRow("too_long")`` beyond ``max_length`` (never truncates) and ``BadRow("nothing_to_supervise")``
    for a text of one token; the caller adds the row's location.
    """
    input_ids = list(tokenizer(text)["input_ids"])
    if max_length is not None and len(input_ids) > max_length:
        raise BadRow("too_long", detail=f"{len(input_ids)} tokens > max_length {max_length}")
    if len(input_ids) < 2:
        raise BadRow("nothing_to_supervise", detail=f"{len(input_ids)} token(s): nothing follows the first")
    return input_ids, [0] + [1] * (len(input_ids) - 1)
