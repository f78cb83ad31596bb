"""The records a target family is made of: what varies between Qwen3, Llama 3, Gemma 3, GPT-OSS and
DeepSeek-V3-style targets, each a field here rather than a string switch in the modules that use it.

A ``TargetFamily`` says which transformers architectures it covers, how a drafter's context taps are chosen
(the one rule every family shares), the special ids a drafter needs (the mask token of block drafting, the end
of a turn), how the target's input embedding relates to its stored ``embed_tokens`` weight (Gemma multiplies by
``sqrt(hidden_size)`` inside the model), which config fields its tensor-parallel plan splits, and what each
serving engine captures for it (``EngineSupport``). This package imports nothing else of ``deepspec_train``, so
config rules, target loading, models and export can all read it.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Optional

# How an engine gets a drafter its target features: the block drafters' capture (vLLM's aux hidden states, SGLang's
# ``set_dflash_layers_to_capture``) or EAGLE-3's (``set_eagle3_layers_to_capture``). Each serving layout record
# (``kinds``) names the one its drafters need; a target model class may offer one, both or none.
BLOCK_CAPTURE, EAGLE3_CAPTURE = "block drafter capture", "eagle3 capture"
ALL_CAPTURES = frozenset({BLOCK_CAPTURE, EAGLE3_CAPTURE})


def dspark_layer_ids(num_layers: int, count: int = 5) -> list[int]:
    """DSpark / DFlash taps: ``count`` decoder layers evenly spaced from 1 to ``L-3`` (never the last layers),
    rounded with Python's ``round`` as z-lab's and SGLang's ``build_target_layer_ids`` round them."""
    start, end = 1, num_layers - 3
    return [int(round(start + i * (end - start) / (count - 1))) for i in range(count)]


def eagle3_layer_ids(num_layers: int) -> list[int]:
    """EAGLE-3 taps: low, middle and high decoder layers ``[1, L//2 - 1, L - 4]``, the outputs both engines
    capture by default (hidden-state indices ``[2, L//2, L-3]``)."""
    return [1, num_layers // 2 - 1, num_layers - 4]


def plus_one(ids: Sequence[int], num_layers: int) -> list[int]:
    """Capture points ``id + 1`` (the stream entering layer ``id + 1`` = the output of decoder layer ``id``)."""
    return [int(i) + 1 for i in ids]


def plus_one_when_first_is_one(ids: Sequence[int], num_layers: int) -> list[int]:
    """SGLang's EAGLE-3 rule for DeepSeek-V2/V3 targets: ``+ 1`` only when the first id is 1, else the ids are
    taken as capture points already."""
    return plus_one(ids, num_layers) if ids and ids[0] == 1 else [int(i) for i in ids]


def plus_one_unless_last_boundary(ids: Sequence[int], num_layers: int) -> list[int]:
    """SGLang's EAGLE-3 rule for GPT-OSS targets: ``+ 1``, except that ids reaching ``num_layers`` (the final
    boundary) are taken as capture points already."""
    return [int(i) for i in ids] if ids and max(ids) == num_layers else plus_one(ids, num_layers)


@dataclass(frozen=True)
class EngineSupport:
    """What one engine (vLLM 0.33 or SGLang 0.5.23) does for one target architecture.

    ``captures``: the capture mechanisms (``BLOCK_CAPTURE``, ``EAGLE3_CAPTURE``) its model class of this target
    offers, i.e. the drafter layouts it can serve for it; ``eagle3_points``: how it turns an EAGLE-3 config's
    layer ids into capture points (SGLang's
    ``set_eagle3_layers_to_capture``; vLLM takes its top-level ids as capture points for every family);
    ``refusal``: why a layout needing another capture is not served; ``source``: where the rule was read."""

    captures: frozenset[str]
    eagle3_points: Callable[[Sequence[int], int], list[int]] = plus_one
    refusal: str = ""
    source: str = ""

    def unserved(self, capture: str) -> str | None:
        """Why a drafter that needs ``capture`` is not served for this target (None when it is)."""
        return None if capture in self.captures else self.refusal


def no_embedding_scale(config: Mapping[str, Any]) -> float:
    return 1.0


def sqrt_hidden_embedding_scale(config: Mapping[str, Any]) -> float:
    """Gemma's ``Gemma3TextScaledWordEmbedding``: the looked-up rows are multiplied by ``sqrt(hidden_size)``."""
    return float(config["hidden_size"]) ** 0.5


def _sparse(config: Mapping[str, Any]) -> bool:
    """Mixture-of-experts layers: ``num_experts`` (Qwen3-MoE's config.json) or ``num_local_experts`` (what
    transformers 5 writes for the same attribute) or ``n_routed_experts`` (DeepSeek-V3), with an expert width."""
    experts = config.get("num_experts") or config.get("num_local_experts") or config.get("n_routed_experts")
    return bool(experts) and bool(config.get("moe_intermediate_size"))


def _dense_mlp_layers(config: Mapping[str, Any]) -> bool:
    layers = config.get("num_hidden_layers") or 0
    if not _sparse(config):
        return True
    step = config.get("decoder_sparse_step") or 1
    dense_only = set(config.get("mlp_only_layers") or [])
    first_dense = config.get("first_k_dense_replace") or 0
    return any(i < first_dense or i in dense_only or (i + 1) % step for i in range(layers))


def heads_and_widths_split(config: Mapping[str, Any], plan: str) -> list[str]:
    """transformers' Qwen3 / Llama / Gemma / DeepSeek-style plan: with ``auto`` the query and KV heads
    (column-wise q/k/v), and the dense MLP width where dense layers exist, the expert width where experts do;
    ``experts`` replicates attention and splits only the widths (``[]`` when the target has no experts)."""
    if plan != "auto" and not _sparse(config):
        return []
    keys = ["num_attention_heads", "num_key_value_heads"] if plan == "auto" else []
    if _dense_mlp_layers(config):
        keys.append("intermediate_size")
    if _sparse(config):
        keys.append("moe_intermediate_size")
    return keys


def widths_only_split(config: Mapping[str, Any], plan: str) -> list[str]:
    """DeepSeek-V3's plan: no attention rule (MLA runs replicated on every rank), MLP and expert widths split."""
    return [key for key in heads_and_widths_split(config, "experts" if _sparse(config) else plan)
            if key not in ("num_attention_heads", "num_key_value_heads")]


def vocabulary_only_split(config: Mapping[str, Any], plan: str) -> list[str]:
    """GPT-OSS's plan: only the embedding is split (by vocabulary rows); attention and experts are replicated,
    so a TP group holds nearly the whole model on every rank."""
    return ["vocab_size"] if plan == "auto" else []


@dataclass(frozen=True)
class TargetFamily:
    """One family of targets; see the module docstring. ``mask_token_id``: the id DSpark / DFlash blocks are
    filled with (a reserved or unused row of the family's embedding); ``turn_end``: the token that ends an
    assistant turn; ``chat_format``: the chat template's shape, in words; ``tp_split``: the config fields
    transformers' TP plan splits (each must divide by ``target_tp``); ``config_facts``: config.json values every
    target of the family has, for an architecture other model lines share (SmolLM2 and TinyLlama are
    ``LlamaForCausalLM`` too); ``identifying_tokens``: tokens its tokenizer holds, checked when one is at hand."""

    name: str
    architectures: tuple[str, ...]
    models: tuple[str, ...]
    mask_token_id: int
    turn_end: str
    chat_format: str
    engines: Mapping[str, EngineSupport]
    embedding_scale: Callable[[Mapping[str, Any]], float] = no_embedding_scale
    tp_split: Callable[[Mapping[str, Any], str], list[str]] = heads_and_widths_split
    notes: tuple[str, ...] = field(default_factory=tuple)
    config_facts: Mapping[str, Any] = field(default_factory=dict)
    identifying_tokens: tuple[str, ...] = ()

    def identifies(self, target_config: Mapping[str, Any], vocabulary: Optional[Collection[str]] = None) -> bool:
        """Whether a target is of this family: its architecture is one of the family's, its config has every
        ``config_facts`` value and, when its tokenizer's ``vocabulary`` is given, it holds the identifying tokens."""
        archs = target_config.get("architectures") or [""]
        if str(archs[0]) not in self.architectures:
            return False
        if any(target_config.get(key) != value for key, value in self.config_facts.items()):
            return False
        return vocabulary is None or all(token in vocabulary for token in self.identifying_tokens)

    def layer_ids(self, num_layers: int, eagle3: bool = False) -> list[int]:
        """The taps a recipe for a target of ``num_layers`` decoder layers uses (the rule shared by every family)."""
        return eagle3_layer_ids(num_layers) if eagle3 else dspark_layer_ids(num_layers)

