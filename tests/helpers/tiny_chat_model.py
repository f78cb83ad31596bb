"""Test helper: save a tiny random-weight Qwen3ForCausalLM with a ChatML tokenizer to a directory.

The model is loadable through ``AutoModelForCausalLM`` / ``AutoTokenizer`` like a real target, but small
enough (hidden 32, 2 layers) that generating a few tokens for a batch takes milliseconds on CPU. Its answers
are random text; tests only rely on them being deterministic and on where they end up.

``save_scripted_chat_model`` saves the same model with weights set so that its greedy answer to any prompt is a
given text (a thinking answer, say): every layer's output projections are zero, so the last position's hidden
state is its own token's embedding, and the output head maps each token of the script to the next one.
"""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import PreTrainedTokenizerBase, Qwen3ForCausalLM

from tests.helpers.chat_tokenizer import build_chat_tokenizer
from tests.helpers.tiny_geometry import tiny_qwen3_config


def save_tiny_chat_model(directory: str | Path, seed: int = 0) -> str:
    """Write tokenizer + model + generation config to ``directory`` and return it as a string path."""
    model, _ = _tiny_chat_model(Path(directory), seed, tie_word_embeddings=True)
    model.save_pretrained(str(directory))
    return str(directory)


def save_scripted_chat_model(directory: str | Path, prompt_end: str, answer: str) -> str:
    """Save a model whose greedy answer after a prompt that ends with ``prompt_end`` is ``answer`` (then
    ``<|im_end|>``). The tokens of ``prompt_end``'s last token, the answer and the end must all differ: the
    model predicts each next token from the current one alone."""
    model, tokenizer = _tiny_chat_model(Path(directory), 0, tie_word_embeddings=False)
    chain = [tokenizer(prompt_end, add_special_tokens=False)["input_ids"][-1]]
    chain += tokenizer(answer, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
    if len(set(chain)) != len(chain):
        raise ValueError(f"a scripted answer needs distinct tokens, got {tokenizer.convert_ids_to_tokens(chain)}")
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        embeddings = model.model.embed_tokens.weight
        head = torch.zeros_like(model.lm_head.weight)
        # Row b scores highest for the embedding of its predecessor a (cosine 1), every other row lower.
        for current, following in zip(chain, chain[1:]):
            head[following] = embeddings[current] / embeddings[current].norm()
        model.lm_head.weight.copy_(head)
    model.save_pretrained(str(directory))
    return str(directory)


def _tiny_chat_model(
    directory: Path, seed: int, tie_word_embeddings: bool
) -> tuple[Qwen3ForCausalLM, PreTrainedTokenizerBase]:
    """The random-weight model and the tokenizer (saved to ``directory``) of ``save_tiny_chat_model``."""
    tokenizer = build_chat_tokenizer(directory)
    config = tiny_qwen3_config(
        vocab_size=len(tokenizer),
        intermediate_size=64,
        num_hidden_layers=2,
        head_dim=8,
        max_position_embeddings=1024,
        tie_word_embeddings=tie_word_embeddings,
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
    return model, tokenizer
