"""Scale copies of the production targets: the published architecture with only its widths shrunk.

A scale copy keeps everything a recipe or a serving engine reads from a target's ``config.json`` (architecture,
decoder-layer count, vocabulary size, special token ids, query / KV head counts, tied embeddings, RoPE settings,
context length) and divides the widths (``head_dim``, ``hidden_size``, ``intermediate_size``) by one factor, so
``head_dim * heads / hidden`` and the MLP ratio stay the published ones while the model runs on a laptop CPU.
The copies are derived here from ``reference_configs`` and never written by hand, so they cannot drift from the
published configs. The scale-model test tier (``tests/test_scale_tier.py``) trains every production recipe on
them:

    config = scale_target_config("Qwen3-8B")        # hidden 128, head_dim 4, 36 layers, vocab 151,936
    save_scale_target("Qwen3-8B", "models/Qwen3-8B-scale")  # random weights, save_pretrained

The mixture-of-experts targets (Qwen3-30B-A3B, Qwen3-235B-A22B) keep their expert count, how many experts
route each token and which layers are sparse; their expert MLP width shrinks by the same factor. To add a target
family, add its published config to ``reference_configs`` (``family_configs`` for the non-Qwen3 ones) and a
``ScaleTarget`` to ``SCALE_TARGETS`` whose ``shrink`` names the family's width fields (``shrink_family``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, PretrainedConfig

from deepspec_train.models.family_configs import family_reference_configs
from deepspec_train.models.reference_configs import qwen3_moe_reference_configs, qwen3_reference_configs

SCALE_HEAD_DIM = 4


def _shrink(reference: PretrainedConfig, fields: tuple[str, ...], head_dim: int) -> dict[str, int]:
    factor, rest = divmod(reference.head_dim, head_dim)
    widths = {name: getattr(reference, name) for name in fields}
    uneven = {name: value for name, value in widths.items() if rest or value % factor}
    if uneven:
        raise ValueError(f"head_dim {head_dim} does not divide the widths of the reference config evenly: {uneven}")
    return {"head_dim": head_dim, **{name: value // factor for name, value in widths.items()}}


def shrink_dense_qwen3(reference: PretrainedConfig, head_dim: int = SCALE_HEAD_DIM) -> dict[str, int]:
    """The width fields of a dense Qwen3 config divided by ``reference.head_dim / head_dim``."""
    return _shrink(reference, ("hidden_size", "intermediate_size"), head_dim)


def shrink_moe_qwen3(reference: PretrainedConfig, head_dim: int = SCALE_HEAD_DIM) -> dict[str, int]:
    """The width fields of a Qwen3-MoE config (the expert MLPs' too) divided by ``reference.head_dim / head_dim``."""
    return _shrink(reference, ("hidden_size", "intermediate_size", "moe_intermediate_size"), head_dim)


@dataclass(frozen=True)
class ScaleTarget:
    """One production target: its published config and the function that shrinks that config's widths."""

    name: str
    reference: Callable[[], PretrainedConfig]
    shrink: Callable[[PretrainedConfig], Mapping[str, int]]

    def config(self) -> PretrainedConfig:
        reference = self.reference()
        return type(reference).from_dict({**reference.to_dict(), **self.shrink(reference)})


def _qwen3(name: str) -> ScaleTarget:
    return ScaleTarget(name, lambda: qwen3_reference_configs()[name], shrink_dense_qwen3)


def _qwen3_moe(name: str) -> ScaleTarget:
    return ScaleTarget(name, lambda: qwen3_moe_reference_configs()[name], shrink_moe_qwen3)


def shrink_family(widths: tuple[str, ...], head_dim_field: str = "head_dim", scale_head_dim: int = SCALE_HEAD_DIM,
                  expert_widths: Mapping[str, int] | None = None) -> Callable[[PretrainedConfig], dict[str, int]]:
    """A shrink for another family: ``widths`` divided by ``reference.<head_dim_field> / scale_head_dim``; the
    ``expert_widths`` (field -> the scale copy's value) go further, so that the hundreds of experts of GPT-OSS and
    DeepSeek-V3 / Kimi-K2 (14,000-23,000 expert MLPs) fit a CPU: their count and routing stay the published ones."""

    def shrink(reference: PretrainedConfig) -> dict[str, int]:
        factor, rest = divmod(getattr(reference, head_dim_field), scale_head_dim)
        values = {name: getattr(reference, name) for name in widths}
        uneven = {name: value for name, value in values.items() if rest or value % factor}
        if uneven:
            raise ValueError(f"{head_dim_field} {scale_head_dim} does not divide the widths evenly: {uneven}")
        return {head_dim_field: scale_head_dim, **{n: v // factor for n, v in values.items()},
                **(expert_widths or {})}

    return shrink


_LLAMA_WIDTHS = shrink_family(("hidden_size", "intermediate_size"))
# MLA: every projection rank and head width shrinks with the rotary width (qk_rope_head_dim 64 -> 2).
_MLA_WIDTHS = shrink_family(
    ("hidden_size", "intermediate_size", "q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "v_head_dim"),
    head_dim_field="qk_rope_head_dim", scale_head_dim=2, expert_widths={"moe_intermediate_size": 8})


def _shrink_mla(reference: PretrainedConfig) -> dict[str, int]:
    """``_MLA_WIDTHS`` plus the two fields DeepseekV3Config derives from them (``to_dict`` writes them out, and
    ``from_dict`` would otherwise keep the published values)."""
    widths = _MLA_WIDTHS(reference)
    return {**widths, "head_dim": widths["qk_rope_head_dim"],
            "qk_head_dim": widths["qk_nope_head_dim"] + widths["qk_rope_head_dim"]}


def _family(name: str, shrink: Callable[[PretrainedConfig], Mapping[str, int]]) -> ScaleTarget:
    return ScaleTarget(name, lambda: family_reference_configs()[name], shrink)


SCALE_TARGETS: dict[str, ScaleTarget] = {
    t.name: t
    for t in [
        *map(_qwen3, ("Qwen3-4B", "Qwen3-8B", "Qwen3-14B", "Qwen3-32B")),
        *map(_qwen3_moe, ("Qwen3-30B-A3B", "Qwen3-235B-A22B")),
        *(_family(name, _LLAMA_WIDTHS) for name in ("Llama-3.1-8B-Instruct", "Llama-3.3-70B-Instruct")),
        # transformers asks a Gemma 3 config for hidden_size % heads == 0: head_dim 16 keeps 240 / 16 (12B) and
        # 672 / 32 (27B) whole.
        *(_family(name, shrink_family(("hidden_size", "intermediate_size"), scale_head_dim=16))
          for name in ("gemma-3-12b-it", "gemma-3-27b-it")),
        # GPT-OSS's intermediate_size is its expert width (no dense MLP): 2,880 -> 16. head_dim 8 (hidden 360):
        # transformers' grouped expert matmul wants bf16 rows whose byte strides are multiples of 16.
        *(_family(name, shrink_family(("hidden_size",), scale_head_dim=8, expert_widths={"intermediate_size": 16}))
          for name in ("gpt-oss-20b", "gpt-oss-120b")),
        *(_family(name, _shrink_mla) for name in ("DeepSeek-V3", "Kimi-K2-Instruct")),
    ]
}


def scale_target_config(name: str) -> PretrainedConfig:
    """The scale copy's config of the production target ``name`` (a key of ``SCALE_TARGETS``)."""
    if name not in SCALE_TARGETS:
        raise KeyError(f"no scale target {name!r}; known: {sorted(SCALE_TARGETS)}")
    return SCALE_TARGETS[name].config()


def save_scale_target(name: str, directory: str | Path, seed: int = 0, num_hidden_layers: int = 0,
                      heads: tuple[int, int] | None = None) -> Path:
    """Write a random-weight scale copy of ``name`` with ``save_pretrained`` (config.json + model.safetensors,
    bf16 like the published checkpoints) to ``directory``; no tokenizer is written. ``num_hidden_layers`` > 0
    keeps only that many decoder layers (heads, vocabulary, widths and RoPE unchanged): a shallow copy for tests
    whose cost is the target's attention at long length. ``heads`` = (query, key-value) replaces the attention
    heads (head_dim, hidden size and vocabulary unchanged): the minimal-width copy that tests length alone."""
    config = scale_target_config(name)
    if heads is not None:
        config.num_attention_heads, config.num_key_value_heads = heads
    if num_hidden_layers:
        config.num_hidden_layers = num_hidden_layers
        # Per-layer fields (Qwen3's ``layer_types``) must list one entry per remaining layer.
        if getattr(config, "layer_types", None):
            config.layer_types = config.layer_types[:num_hidden_layers]
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    model.generation_config.eos_token_id = config.eos_token_id
    model.save_pretrained(str(directory))
    return Path(directory)
