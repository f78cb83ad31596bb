"""How a row's content becomes token ids and a loss mask: one record per way of supervising.

- ``ASSISTANT_TURNS``: a conversation rendered with the chat template, its assistant turns supervised
  (``loss_mask.render_with_loss_mask``);
- ``EVERY_TOKEN``: plain text tokenised without a template, every token but the first supervised
  (``plain_text``);
- ``MARKED_TURNS``: chat text already rendered, its assistant spans found by the target's turn markers
  (``turn_markers``), masked as a rendered conversation is.

A row shape (``row_shapes``) names its record; the renderer of the token shards calls ``tokenise`` with itself
as the settings.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from deepspec_train.data.loss_mask import render_with_loss_mask
from deepspec_train.data.plain_text import text_with_loss_mask
from deepspec_train.data.turn_markers import preformatted_with_loss_mask

Sample = tuple[list[int], list[int]]


class RenderSettings(Protocol):
    """What tokenising needs: the target's tokenizer, the longest sample, the chat template's keyword arguments
    and whether reasoning is supervised (``token_shards.ConversationRenderer`` is one)."""

    tokenizer: Any
    max_length: int
    chat_template_kwargs: dict | None
    supervise_reasoning: bool


@dataclass(frozen=True)
class Supervision:
    """One way of supervising content: what it supervises (in words, for reports), whether it renders with the
    tokenizer's chat template, and the function giving ``(input_ids, loss_mask)`` or raising ``BadRow``."""

    name: str
    supervises: str
    needs_chat_template: bool
    tokenise: Callable[[RenderSettings, Any], Sample]


ASSISTANT_TURNS = Supervision(
    "assistant_turns", "the assistant turns, rendered with the chat template", True,
    lambda s, messages: render_with_loss_mask(
        s.tokenizer, messages, s.max_length, s.chat_template_kwargs, s.supervise_reasoning
    ),
)
EVERY_TOKEN = Supervision(
    "every_token", "every token after the first, no chat template", False,
    lambda s, text: text_with_loss_mask(s.tokenizer, text, s.max_length),
)
MARKED_TURNS = Supervision(
    "marked_turns", "the assistant spans found by the chat template's turn markers", True,
    lambda s, text: preformatted_with_loss_mask(s.tokenizer, text, s.max_length, s.chat_template_kwargs),
)
