"""Train the tiny world's byte-level BPE tokenizer and wrap it as a transformers tokenizer with ChatML.

The vocabulary is learned from the corpus' message texts with HF ``tokenizers``. Digits are split one per
token before the byte-level step: whole-number tokens would make every arithmetic result a single rare token
and the math domain unlearnable at this scale. Special tokens follow Qwen3's names: ``<|endoftext|>`` (padding
and document end), ``<|im_start|>`` / ``<|im_end|>`` (ChatML turns; ``<|im_end|>`` ends an answer),
``<|mask|>`` (reserved for the drafters' masked block slots), and ``<think>`` / ``</think>`` registered like
Qwen3 does, as non-special added tokens, so that decoding with ``skip_special_tokens`` keeps reasoning text.
"""

from __future__ import annotations

from collections.abc import Iterable

from tokenizers import (
    AddedToken,
    Tokenizer,
    decoders,
    models,
    pre_tokenizers,
    processors,
    trainers,
)
from transformers import PreTrainedTokenizerFast

from deepspec_train.data.chatml_template import CHATML_TEMPLATE

END_OF_TEXT = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
MASK_TOKEN = "<|mask|>"
SPECIAL_TOKENS: tuple[str, ...] = (END_OF_TEXT, IM_START, IM_END, MASK_TOKEN)
THINK_TOKENS: tuple[str, ...] = ("<think>", "</think>")


def train_bpe(texts: Iterable[str], vocab_size: int, progress: bool = True) -> Tokenizer:
    """A byte-level BPE ``Tokenizer`` of exactly ``vocab_size`` entries (specials and think tokens included)."""
    learned_size = vocab_size - len(THINK_TOKENS)
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)]
    )
    tokenizer.decoder = decoders.ByteLevel()
    # trim_offsets=False keeps character offsets covering the leading space a byte-level token carries, so loss
    # masks read from offsets assign every character to exactly one token.
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=learned_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=progress,
    )
    tokenizer.train_from_iterator(texts, trainer=trainer)
    tokenizer.add_tokens([AddedToken(t, special=False, normalized=False) for t in THINK_TOKENS])
    if tokenizer.get_vocab_size() != vocab_size:
        raise ValueError(
            f"corpus too small for a {vocab_size}-entry vocabulary: BPE stopped at {tokenizer.get_vocab_size()}"
        )
    return tokenizer


def to_transformers(tokenizer: Tokenizer) -> PreTrainedTokenizerFast:
    """Wrap a trained ``Tokenizer`` with its special-token roles and the ChatML chat template."""
    wrapped = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        eos_token=IM_END,
        pad_token=END_OF_TEXT,
        mask_token=MASK_TOKEN,
        additional_special_tokens=[IM_START],
        model_max_length=1 << 20,
    )
    wrapped.chat_template = CHATML_TEMPLATE
    return wrapped


def message_texts(conversations: Iterable[dict]) -> Iterable[str]:
    """Role names and message contents of conversations: the tokenizer learns from text, not from the
    template's special tokens."""
    for row in conversations:
        for message in row["messages"]:
            yield message["role"]
            yield message["content"]


def build_tokenizer(conversations: list[dict], vocab_size: int, progress: bool = True) -> PreTrainedTokenizerFast:
    """Train on the conversations' texts and return the transformers tokenizer the target is saved with."""
    return to_transformers(train_bpe(message_texts(conversations), vocab_size, progress=progress))
