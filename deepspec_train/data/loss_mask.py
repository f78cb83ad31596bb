"""Render a conversation with the target's chat template and mark the tokens the drafter learns to predict.

The loss mask covers exactly what the target generates in each assistant turn: the content (including any
``<think>...</think>`` block written in it) and the end-of-turn token, but not the assistant header that
the prompt already contains, nor system or user tokens. It is built from message boundaries, never by
searching the text: for each assistant message ``i``, the rendering of ``messages[:i]`` with a generation
prompt and the rendering of ``messages[:i+1]`` bound the characters the model generated. The full text is
tokenised once with offsets, and a token is supervised when its first character lies inside such a span.

Everything after the turn's last non-whitespace character (the newline ChatML puts after ``<|im_end|>``) is
template glue between turns, not generated, so it is left out of the span.

Reasoning (``data.supervise_reasoning``). An assistant message with a ``reasoning_content`` field (the
normalised form, ``conversations.REASONING_FIELD``) is rendered by the template in the target's own format. By
default its reasoning is supervised like the rest of the turn: a drafter has to draft whatever the target
generates, and a thinking target generates its reasoning first. With ``supervise_reasoning=False`` the turn's
reasoning segment, from the end of the generation prompt to the first character of the answer, is left out of
the mask (it stays in the input as context) and only the answer and the end-of-turn token are supervised. The
segment holds the reasoning's delimiters too (ChatML: ``<think>\\n...\\n</think>\\n\\n``; harmony: the
analysis message and the final channel's header after it): they exist only because of the reasoning, and
``</think>`` is predicted from reasoning context, which such a drafter is not trained on. The first character of
the answer is found by rendering too: the turn is rendered with two one-character answers that differ, and the
first character where those renderings differ is where the template writes the answer; everything before it
must render as in the real turn, or the row is a template mismatch. A template that ignores the reasoning field
would drop the reasoning from the text; such a row is ``BadRow("reasoning_not_rendered")``. Templates read the
reasoning under different names (Qwen3's ``reasoning_content``, GPT-OSS's ``thinking``); transformers'
``apply_chat_template`` hands a message's ``reasoning_content`` to the template under each of them.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from deepspec_train.data.conversations import REASONING_FIELD, BadRow, Message

# Two one-character answers whose renderings differ first where the template writes an answer's first character.
_ANSWER_PROBES = ("A", "B")


class TemplateNotPrefixStableError(ValueError):
    """The chat template renders a conversation prefix differently from the start of the whole conversation."""


def render_text(
    tokenizer: Any, messages: list[Message], add_generation_prompt: bool, chat_template_kwargs: dict | None = None
) -> str:
    """The chat template's text for ``messages`` (no tokenisation)."""
    return tokenizer.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=add_generation_prompt, **(chat_template_kwargs or {})
    )


def assistant_char_spans(
    tokenizer: Any,
    messages: list[Message],
    chat_template_kwargs: dict | None = None,
    supervise_reasoning: bool = True,
) -> tuple[str, list[tuple[int, int]]]:
    """The full rendered text and the ``[start, end)`` character span supervised in each assistant turn: all
    the turn generates, or with ``supervise_reasoning=False`` only what follows its reasoning segment.

    Raises ``TemplateNotPrefixStableError`` when the rendering of a prefix (with or without the generation
    prompt) is not a prefix of the next rendering, since then no span can be read off the boundaries, and
    ``BadRow("reasoning_not_rendered")`` when the template leaves a turn's reasoning out.
    """
    full_text = render_text(tokenizer, messages, False, chat_template_kwargs)
    spans = []
    for index, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        prompt = render_text(tokenizer, messages[:index], True, chat_template_kwargs)
        through_turn = render_text(tokenizer, messages[: index + 1], False, chat_template_kwargs)
        _require_prefix(
            prompt, through_turn, f"messages[:{index}] with the generation prompt", f"messages[:{index + 1}]"
        )
        _require_prefix(through_turn, full_text, f"messages[:{index + 1}]", "the whole conversation")
        start, end = len(prompt), len(through_turn.rstrip())
        if message.get(REASONING_FIELD):
            _require_reasoning_rendered(tokenizer, messages[:index], message, through_turn, chat_template_kwargs)
        if REASONING_FIELD in message and not supervise_reasoning:
            start = max(start, _answer_start(tokenizer, messages, index, through_turn, chat_template_kwargs))
        if end > start:
            spans.append((start, end))
    return full_text, spans


def _require_reasoning_rendered(
    tokenizer: Any, earlier: list[Message], message: Message, through_turn: str, chat_template_kwargs: dict | None
) -> None:
    """Raise ``BadRow("reasoning_not_rendered")`` when ``earlier`` + ``message`` without its reasoning renders as
    ``through_turn`` does with it."""
    without = {key: value for key, value in message.items() if key != REASONING_FIELD}
    if render_text(tokenizer, [*earlier, without], False, chat_template_kwargs) == through_turn:
        raise BadRow(
            "reasoning_not_rendered",
            detail=f"the chat template renders messages[{len(earlier)}] the same without its reasoning",
        )


def _answer_start(
    tokenizer: Any, messages: list[Message], index: int, through_turn: str, chat_template_kwargs: dict | None
) -> int:
    """Where the template writes the answer of assistant ``messages[index]`` (see the module docstring)."""
    first, second = (
        render_text(tokenizer, [*messages[:index], {**messages[index], "content": probe}], False, chat_template_kwargs)
        for probe in _ANSWER_PROBES
    )
    start = next((i for i, (a, b) in enumerate(zip(first, second)) if a != b), None)
    if start is None:
        raise TemplateNotPrefixStableError(
            f"the chat template renders messages[{index}] the same whatever its content, so its answer cannot be "
            f"told from its reasoning"
        )
    _require_prefix(
        first[:start], through_turn, f"messages[:{index + 1}] up to its answer", f"messages[:{index + 1}]"
    )
    return start


def _require_prefix(prefix: str, text: str, prefix_name: str, text_name: str) -> None:
    if text.startswith(prefix):
        return
    mismatch = next((i for i, (a, b) in enumerate(zip(prefix, text)) if a != b), min(len(prefix), len(text)))
    raise TemplateNotPrefixStableError(
        f"the chat template is not prefix-stable: the rendering of {prefix_name} is not a prefix of the rendering "
        f"of {text_name} (they differ at character {mismatch}: {prefix[mismatch : mismatch + 40]!r} vs "
        f"{text[mismatch : mismatch + 40]!r}). Assistant spans cannot be read off message boundaries; use a "
        f"template that renders earlier turns verbatim (e.g. deepspec_train.data.chatml_template), or check "
        f"that chat_template_kwargs (such as enable_thinking) match the data."
    )


def render_with_loss_mask(
    tokenizer: Any,
    messages: list[Message],
    max_length: int | None = None,
    chat_template_kwargs: dict | None = None,
    supervise_reasoning: bool = True,
) -> tuple[list[int], list[int]]:
    """Token ids of the rendered conversation and a 0/1 mask that is 1 on assistant-generated tokens (without
    the reasoning segments when ``supervise_reasoning`` is false; see the module docstring).

    Raises ``BadRow("too_long")`` when the ids exceed ``max_length`` (never truncates) and
    ``BadRow("nothing_to_supervise")`` when no token is supervised; the caller adds the row's location.
    """
    full_text, spans = assistant_char_spans(tokenizer, messages, chat_template_kwargs, supervise_reasoning)
    return tokens_with_span_mask(tokenizer, full_text, spans, max_length, "no assistant token")


def tokens_with_span_mask(
    tokenizer: Any, text: str, spans: list[tuple[int, int]], max_length: int | None, empty_detail: str
) -> tuple[list[int], list[int]]:
    """Token ids of ``text`` (no special tokens added) and a 0/1 mask that is 1 on tokens whose first character
    lies in ``spans``; ``BadRow("too_long")`` past ``max_length`` (never truncated), ``BadRow("nothing_to_supervise",
    empty_detail)`` when no token is supervised."""
    encoding = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    input_ids = list(encoding["input_ids"])
    if max_length is not None and len(input_ids) > max_length:
        raise BadRow("too_long", detail=f"{len(input_ids)} tokens > max_length {max_length}")
    loss_mask = mask_from_offsets(encoding["offset_mapping"], spans)
    if not any(loss_mask):
        raise BadRow("nothing_to_supervise", detail=empty_detail)
    return input_ids, loss_mask


def mask_from_offsets(offsets: list[tuple[int, int]], spans: list[tuple[int, int]]) -> list[int]:
    """0/1 per token: 1 when the token's first character lies inside one of the ``[start, end)`` ``spans``."""
    starts = np.fromiter((start for start, _ in offsets), dtype=np.int64, count=len(offsets))
    mask = np.zeros(len(offsets), dtype=bool)
    for span_start, span_end in spans:
        mask |= (starts >= span_start) & (starts < span_end)
    return mask.astype(np.int64).tolist()
