"""Pre-rendered chat text (``data.format=preformatted``): ``text`` rows that already hold the target's own turn
markers, supervised on their assistant spans with the mask a rendered conversation gets.

The markers are read off the chat template, never written down per family: rendering one user turn with and
without the generation prompt gives the text that opens every assistant answer (``<|im_start|>assistant\\n``,
with Qwen3's thinking off also the empty ``<think>`` block), and rendering that turn answered with one character
gives what closes it (``<|im_end|>``; the whitespace after it is template glue, as in ``loss_mask``). A span runs
from the end of an opening to the end of the next closing (or to the text's last non-whitespace character when
the turn is not closed), which are exactly the bounds ``loss_mask`` reads off message boundaries for a rendered
conversation. Reasoning inside a turn is supervised with it, as ``data.supervise_reasoning=true`` does.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from deepspec_train.data.loss_mask import TemplateNotPrefixStableError, render_text, tokens_with_span_mask

_PROBE_USER = [{"role": "user", "content": "U"}]
_PROBE_ANSWER = "A"


@dataclass(frozen=True)
class TurnMarkers:
    """The text that opens every assistant answer, and the text that closes it."""

    opening: str
    closing: str


def turn_markers(tokenizer: Any, chat_template_kwargs: dict | None = None) -> TurnMarkers:
    """The chat template's assistant markers (see the module docstring); ``TemplateNotPrefixStableError`` when
    the renderings do not extend each other, as then no marker can be read off them."""
    bare = render_text(tokenizer, _PROBE_USER, False, chat_template_kwargs)
    prompt = render_text(tokenizer, _PROBE_USER, True, chat_template_kwargs)
    answered = render_text(
        tokenizer, [*_PROBE_USER, {"role": "assistant", "content": _PROBE_ANSWER}], False, chat_template_kwargs
    )
    if not (prompt.startswith(bare) and answered.startswith(prompt + _PROBE_ANSWER)):
        raise TemplateNotPrefixStableError("the chat template's assistant turn does not extend its generation prompt")
    return TurnMarkers(prompt[len(bare) :], answered[len(prompt) + len(_PROBE_ANSWER) :].rstrip())


def marked_spans(text: str, markers: TurnMarkers) -> list[tuple[int, int]]:
    """The ``[start, end)`` character spans of ``text``'s assistant answers, closings included."""
    spans = []
    position = 0
    while (opening := text.find(markers.opening, position)) >= 0:
        start = opening + len(markers.opening)
        closing = text.find(markers.closing, start) if markers.closing else -1
        end = closing + len(markers.closing) if closing >= 0 else len(text.rstrip())
        if end > start:
            spans.append((start, end))
        position = max(start, end)
    return spans


def preformatted_with_loss_mask(
    tokenizer: Any, text: str, max_length: int | None = None, chat_template_kwargs: dict | None = None
) -> tuple[list[int], list[int]]:
    """Token ids of ``text`` and a mask that is 1 on its assistant spans (a token is in a span when its first
    character is, as in ``loss_mask``); ``BadRow("too_long")`` and ``BadRow("nothing_to_supervise")`` as there."""
    spans = marked_spans(text, turn_markers(tokenizer, chat_template_kwargs))
    return tokens_with_span_mask(tokenizer, text, spans, max_length, "no assistant turn marker found")
