"""Test helper: a fast tokenizer laid out like Qwen3's, for the scale-model tier.

Qwen3's tokenizer has 151,643 byte-level BPE entries followed by 26 added tokens at fixed ids (``<|endoftext|>``
151643, ``<|im_start|>`` 151644, ``<|im_end|>`` 151645, ..., ``<think>`` 151667, ``</think>`` 151668), so
``len(tokenizer)`` is 151,669 while the model's embedding has 151,936 rows; the drafters' mask token 151669 is the
first of those unused rows. This copy learns a few hundred BPE merges from the test conversations and fills the
rest of the 151,643 entries with tokens no merge produces, so every id above lands where Qwen3 puts it and any
text round-trips. The chat template is the project's ChatML template (``data/chatml_template.py``: Qwen3's
turns, and the empty ``<think>`` block when thinking is off). Saved with ``save_pretrained`` and reloaded through
``AutoTokenizer``, as a real target's tokenizer is.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import AutoTokenizer, PreTrainedTokenizerBase, PreTrainedTokenizerFast

from deepspec_train.data.chatml_template import CHATML_TEMPLATE

QWEN3_BPE_ENTRIES = 151643
# Qwen3's added tokens in id order from 151643, with whether each is special (skipped when decoding).
QWEN3_ADDED_TOKENS: tuple[tuple[str, bool], ...] = (
    ("<|endoftext|>", True), ("<|im_start|>", True), ("<|im_end|>", True),
    ("<|object_ref_start|>", True), ("<|object_ref_end|>", True), ("<|box_start|>", True), ("<|box_end|>", True),
    ("<|quad_start|>", True), ("<|quad_end|>", True), ("<|vision_start|>", True), ("<|vision_end|>", True),
    ("<|vision_pad|>", True), ("<|image_pad|>", True), ("<|video_pad|>", True),
    ("<tool_call>", False), ("</tool_call>", False),
    ("<|fim_prefix|>", False), ("<|fim_middle|>", False), ("<|fim_suffix|>", False), ("<|fim_pad|>", False),
    ("<|repo_name|>", False), ("<|file_sep|>", False),
    ("<tool_response>", False), ("</tool_response>", False), ("<think>", False), ("</think>", False),
)
QWEN3_TOKEN_IDS = {token: QWEN3_BPE_ENTRIES + i for i, (token, _) in enumerate(QWEN3_ADDED_TOKENS)}
LEARNED_MERGES_VOCAB = 1024


def _bpe_entries(texts: Iterable[str]) -> tuple[dict[str, int], list[tuple[str, str]]]:
    """A byte-level BPE vocabulary of exactly ``QWEN3_BPE_ENTRIES`` entries and its merges."""
    learner = Tokenizer(models.BPE())
    learner.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(
        vocab_size=LEARNED_MERGES_VOCAB, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False
    )
    learner.train_from_iterator(texts, trainer=trainer)
    model = json.loads(learner.to_str())["model"]
    vocab = dict(model["vocab"])
    merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in model["merges"]]
    # Entries no merge can produce: they only hold the ids of Qwen3's learned tokens.
    for index in range(len(vocab), QWEN3_BPE_ENTRIES):
        vocab[f"<unused_{index}>"] = index
    return vocab, merges


def build_qwen3_tokenizer(directory: str | Path, texts: Iterable[str]) -> PreTrainedTokenizerBase:
    """Build, save to ``directory`` and reload (``AutoTokenizer``) a Qwen3-layout tokenizer learned on ``texts``."""
    vocab, merges = _bpe_entries(texts)
    backend = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    # Offsets keep the leading space of a byte-level token, so the loss mask assigns every character once.
    backend.post_processor = processors.ByteLevel(trim_offsets=False)
    for token, special in QWEN3_ADDED_TOKENS:
        added = AddedToken(token, special=special, normalized=False)
        (backend.add_special_tokens if special else backend.add_tokens)([added])
    wrapped = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=[token for token, special in QWEN3_ADDED_TOKENS[1:] if special],
        model_max_length=131072,
    )
    wrapped.chat_template = CHATML_TEMPLATE
    wrapped.save_pretrained(str(directory))
    tokenizer = AutoTokenizer.from_pretrained(str(directory))
    wrong = {t: tokenizer.convert_tokens_to_ids(t) for t, i in QWEN3_TOKEN_IDS.items()
             if tokenizer.convert_tokens_to_ids(t) != i}
    if wrong or len(tokenizer) != QWEN3_BPE_ENTRIES + len(QWEN3_ADDED_TOKENS):
        raise AssertionError(f"tokenizer ids differ from Qwen3's: {wrong}, {len(tokenizer)} entries")
    return tokenizer
