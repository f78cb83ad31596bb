"""Test helper: save a tiny random-weight Qwen3ForCausalLM with a ChatML tokenizer to a directory.

The model is loadable through ``AutoModelForCausalLM`` / ``AutoTokenizer`` like a real target, but small
enough (hidden 32, 2 layers) that generating a few tokens for a batch takes milliseconds on CPU. Its answers
are random text; tests only rely on them being deterministic and on where they end up.
"""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import Qwen3ForCausalLM

from tests.helpers.chat_tokenizer import build_chat_tokenizer
from tests.helpers.tiny_geometry import tiny_qwen3_config


def save_tiny_chat_model(directory: str | Path, seed: int = 0) -> str:
    """Write tokenizer + model + generation config to ``directory`` and return it as a string path."""
    directory = Path(directory)
    tokenizer = build_chat_tokenizer(directory)
    config = tiny_qwen3_config(
        vocab_size=len(tokenizer),
        intermediate_size=64,
        num_hidden_layers=2,
        head_dim=8,
        max_position_embeddings=1024,
        tie_word_embeddings=True,
        # Far larger than the usual 0.02 so that the random model's greedy answers depend on the prompt.
        initializer_range=0.5,
        bos_token_id=None,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(seed)
    model = Qwen3ForCausalLM(config)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.save_pretrained(str(directory))
    return str(directory)
