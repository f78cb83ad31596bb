"""Chat data pipeline: read conversations, render them with the target's chat template, build loss masks
from message boundaries, and tokenise them once into cached Arrow shards.

Modules: ``chatml_template`` (the Qwen3-style ChatML template the tiny world ships), ``conversations``
(file readers and ShareGPT/OpenAI normalisation), ``loss_mask`` (rendering with an assistant-only loss mask),
``token_shards`` (the cached tokenised dataset). Import them directly; this package imports nothing heavy.
"""
