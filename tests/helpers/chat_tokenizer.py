"""Test helper: a small fast Hugging Face tokenizer with the Qwen3 ChatML specials and CHATML_TEMPLATE.

Built offline with the ``tokenizers`` library (byte-level BPE trained on a few sentences, so any text
round-trips), saved with ``save_pretrained`` and reloaded through ``AutoTokenizer`` so tests exercise the same
loading path as a real target's tokenizer. Like Qwen3's, ``<think>`` and ``</think>`` are added tokens that
are not special (they survive decoding), and the end-of-sequence token is ``<|im_end|>``.
"""

from __future__ import annotations

from pathlib import Path

from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import AutoTokenizer, PreTrainedTokenizerBase, PreTrainedTokenizerFast

from deepspec_train.data.chatml_template import CHATML_TEMPLATE

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|mask|>"]
THINK_TOKENS = ["<think>", "</think>"]

_TRAINING_TEXT = [
    "You are a helpful assistant. Answer the question briefly.",
    "What is two plus three? Two plus three is five, so the answer is 5.",
    "Write a Python function that adds two numbers: def add(a, b): return a + b",
    "Hello! How can I help you today? Let me think about it step by step.",
    "The quick brown fox jumps over the lazy dog 0123456789 times.",
]


def build_chat_tokenizer(directory: str | Path, vocab_size: int = 400) -> PreTrainedTokenizerBase:
    """Train, save to ``directory`` and reload a byte-level BPE tokenizer with the ChatML specials."""
    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=SPECIAL_TOKENS,
        show_progress=False,
    )
    backend.train_from_iterator(_TRAINING_TEXT, trainer=trainer)
    backend.add_tokens([AddedToken(token, special=False, normalized=False) for token in THINK_TOKENS])
    wrapped = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=SPECIAL_TOKENS[1:],
    )
    wrapped.chat_template = CHATML_TEMPLATE
    wrapped.save_pretrained(str(directory))
    return AutoTokenizer.from_pretrained(str(directory))
