"""The stated rules for a target no family record identifies (SmolLM2, or any causal LM): its special tokens
are read from its own tokenizer, never borrowed from a family whose class name it shares.

- Mask token: the last special token the tokenizer adds that is not its bos / eos / pad / unk (nor the config's)
  and that its chat template never writes; the tokenizer never produces it from text, so a block of them reads
  as "not yet drafted". SmolLM2: ``<empty_output>`` (16), the last of its 17 added tokens.
- Turn end: the first special token the chat template writes after an assistant message's content (ChatML:
  ``<|im_end|>``), found by rendering a conversation rather than by parsing the template's text.
- Taps: the rule every family shares (``records.dspark_layer_ids`` / ``records.eagle3_layer_ids``).

Each function takes a transformers tokenizer (duck-typed: this package imports nothing else of the project) and
returns None when the rule finds nothing; the caller then names the setting the user must give.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Optional

_SENTINEL = "DEEPSPEC_ASSISTANT_CONTENT"


def _special_tokens(tokenizer: Any) -> dict[int, str]:
    """Every special token of ``tokenizer`` by id: the added tokens marked special and the named ones."""
    tokens = {int(i): str(t.content) for i, t in getattr(tokenizer, "added_tokens_decoder", {}).items() if t.special}
    for token in getattr(tokenizer, "all_special_tokens", []):
        token_id = tokenizer.convert_tokens_to_ids(token)
        if isinstance(token_id, int):
            tokens.setdefault(token_id, str(token))
    return tokens


def _template_text(tokenizer: Any) -> str:
    template = getattr(tokenizer, "chat_template", None)
    if isinstance(template, dict):
        return "".join(str(t) for t in template.values())
    return str(template or "")


def _ids_of(value: Any) -> set[int]:
    if value is None:
        return set()
    return {int(v) for v in value} if isinstance(value, (list, tuple)) else {int(value)}


def unused_special_token(tokenizer: Any, target_config: Mapping[str, Any]) -> Optional[tuple[int, str]]:
    """(id, token) of the mask token the rule picks (see the module docstring), or None when every special token
    is in use or lies outside the target's ``vocab_size`` rows."""
    in_use = set()
    for name in ("bos_token_id", "eos_token_id", "pad_token_id", "unk_token_id"):
        in_use |= _ids_of(getattr(tokenizer, name, None)) | _ids_of(target_config.get(name))
    template = _template_text(tokenizer)
    vocab = int(target_config.get("vocab_size") or 0)
    candidates = [(token_id, token) for token_id, token in _special_tokens(tokenizer).items()
                  if token_id not in in_use and token not in template and 0 <= token_id < vocab]
    return max(candidates) if candidates else None


def chat_turn_end(tokenizer: Any) -> Optional[str]:
    """The special token the chat template writes right after an assistant message (None without a template, or
    when no special token follows the content)."""
    if not _template_text(tokenizer):
        return None
    conversation = [{"role": "user", "content": "u"}, {"role": "assistant", "content": _SENTINEL}]
    try:
        text = tokenizer.apply_chat_template(conversation, tokenize=False)
    except Exception:  # a template that cannot render a plain two-turn chat states no turn end
        return None
    after = text[text.find(_SENTINEL) + len(_SENTINEL):] if _SENTINEL in text else ""
    found = [(after.find(token), token) for token in _special_tokens(tokenizer).values() if token and token in after]
    return min(found)[1] if found else None
