"""The ``dflash2`` serving layout: ``DFlash2DraftModel``, which vLLM 0.33 (``qwen3_dflash2.py``, method ``dflash``)
and SGLang 0.5.23 (``models/dflash.py``, ``--speculative-algorithm DFLASH``) load, for a DFlash2 drafter.

The config is z-lab's DFlash config (``model_type`` qwen3, the draft's Qwen3 fields, ``block_size``,
``num_target_layers``, ``layer_types`` all ``full_attention``) whose ``dflash_config`` adds the DFlash2 keys both
engines read: ``conv_kernel_size``, ``conv_group_size`` (must divide ``hidden_size``), ``selector_rank``,
``selector_top_k`` (vLLM reads all four without a default), plus ``mask_token_id`` and ``target_layer_ids`` (our
convention: both engines add 1 inside), ``block_size`` (SGLang reads it there first) and ``sample_from_anchor``
false (vLLM refuses true). ``embed_tokens`` / ``lm_head`` are not stored: both engines use the target's (SGLang
has no such parameters and would drop them; vLLM would keep a differing copy and rank candidates with it). The
neutral ``input_embedding_scale`` (1), ``output_multiplier`` (1) and ``final_logit_softcapping`` (off) are left out:
SGLang never reads the first, so any other value would be served differently by the two engines.

Tensors: the DFlash backbone (``fc``, ``hidden_norm``, ``norm``, the layers), per layer ``attention_conv`` and
``mlp_conv`` (``base_kernel [2, K, d]``, ``kernel_projection.weight [2 K d / gs, d]``), and
``candidate_selector.{predecessor_codebook, successor_codebook} [V, r]``, ``candidate_selector.hidden_projection
.weight [r, d]``. Neither engine refuses a missing tensor (the parameter stays uninitialised, or for SGLang's
``base_kernel`` the identity), so the exporter's own check is the only guard: every tensor is required here.

Engine rules (docs/reference/file_formats.md): vLLM runs DFlash2 only on its V2 model runner (V1 lists "DFlash
candidate-head drafts" as unsupported) and takes the convolution block from ``num_speculative_tokens + 1``, which
must therefore be ``block_size - 1``; SGLang takes it from ``--speculative-num-draft-tokens`` (default the config's
``block_size``) and walks the selector with a Triton kernel on CUDA whose lanes are ``tl.arange(0, top_k)``, so
``selector_top_k`` must be a power of two there. Assumption where the engines' code leaves it open: the selector
reads the final-normed slot state (what both engines hand their candidate top-k), and the candidates come from the
target's LM head.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, Optional

from deepspec_train.config.schema import ZLAB_LABELS, DrafterConfig
from deepspec_train.serving_layouts.draft_layers import QWEN3_MODEL_TYPE
from deepspec_train.serving_layouts.engine_reading import EngineReading, ServePaths, TargetFacts
from deepspec_train.serving_layouts.layout_checks import (
    ConfigCheck, Geometry, TensorSpec, config_geometry, mask_in_vocab, parallel_backbone,
)
from deepspec_train.serving_layouts.layout_spec import (
    ExportReading, WrittenDrafter, holds_any, no_companion_files, no_readme_section,
)
from deepspec_train.serving_layouts.parallel_engine_readers import BlockServing, always_served, block_layout_engines
from deepspec_train.serving_layouts.zlab_dflash_layout import ZLAB_DFLASH_LAYOUT, sglang_serve, vllm_serve

NAME = "dflash2"
# The DFlash2 keys of ``dflash_config``, each an integer >= 1 (vLLM indexes them without a default).
SETTINGS = ("conv_kernel_size", "conv_group_size", "selector_rank", "selector_top_k")
_CONVS = ("attention_conv", "mlp_conv")


def _fields(drafter: WrittenDrafter) -> dict[str, Any]:
    module = drafter.module
    first = module.layers[0].attention_conv
    settings = {
        "conv_kernel_size": first.taps,
        "conv_group_size": first.group_size,
        "selector_rank": module.candidate_selector.hidden_projection.weight.shape[0],
        "selector_top_k": module.selector_top_k,
    }
    return {
        "model_type": QWEN3_MODEL_TYPE,
        "num_target_layers": module.geometry.num_target_layers,
        "block_size": drafter.block_size,
        "dflash_config": {
            "mask_token_id": drafter.mask_token_id,
            "target_layer_ids": list(drafter.target_layer_ids),
            "block_size": drafter.block_size,
            "sample_from_anchor": False,
            **settings,
        },
    }


def dflash2_tensors(g: Geometry, num_layers: int, num_taps: int,
                    settings: Mapping[str, int]) -> dict[str, TensorSpec]:
    """Every tensor of a DFlash2 export: the DFlash backbone, the layers' convolutions and the selector."""
    import torch

    f = torch.float32
    taps, group, rank = settings["conv_kernel_size"], settings["conv_group_size"], settings["selector_rank"]
    tensors = parallel_backbone(g, num_layers, num_taps)
    for i in range(num_layers):
        for conv in _CONVS:
            tensors[f"layers.{i}.{conv}.base_kernel"] = TensorSpec((2, taps, g.d), f)
            tensors[f"layers.{i}.{conv}.kernel_projection.weight"] = TensorSpec((2 * taps * (g.d // group), g.d), f)
    tensors["candidate_selector.predecessor_codebook"] = TensorSpec((g.vocab, rank), f)
    tensors["candidate_selector.successor_codebook"] = TensorSpec((g.vocab, rank), f)
    tensors["candidate_selector.hidden_projection.weight"] = TensorSpec((rank, g.d), f)
    return tensors


def _check(check: ConfigCheck) -> Optional[dict[str, TensorSpec]]:
    g = config_geometry(check)
    check.equals("model_type", QWEN3_MODEL_TYPE)
    num_layers = check.integer("num_hidden_layers", 1)
    num_target = check.integer("num_target_layers", 1)
    block = check.integer("block_size", 2)
    if num_layers is not None:
        check.equals("layer_types", ["full_attention"] * num_layers)
    dflash = check.mapping("dflash_config")
    if dflash is None:
        return None
    mask_in_vocab(check, "mask_token_id", None if g is None else g.vocab, dflash, "dflash_config.")
    layer_ids = check.id_list("target_layer_ids", 0, num_target, dflash, "dflash_config.")
    settings = {name: check.integer(name, 1, dflash, "dflash_config.") for name in SETTINGS}
    if "block_size" in dflash and block is not None:
        check.equals("block_size", block, dflash, "dflash_config.")
    if dflash.get("sample_from_anchor", False) is not False:
        check.problems.append("config field dflash_config.sample_from_anchor must be false (the 1 + N layout)")
    group, top_k = settings["conv_group_size"], settings["selector_top_k"]
    if g is not None and group is not None and g.d % group:
        check.problems.append(f"config field dflash_config.conv_group_size = {group} does not divide hidden_size "
                              f"{g.d}")
    if g is not None and top_k is not None and top_k > g.vocab:
        check.problems.append(f"config field dflash_config.selector_top_k = {top_k} exceeds the vocabulary "
                              f"({g.vocab})")
    if check.problems or None in (g, num_layers, layer_ids) or None in settings.values():
        return None
    return dflash2_tensors(g, num_layers, len(layer_ids), settings)


def _read(config: Mapping[str, Any]) -> ExportReading:
    dflash = config["dflash_config"]
    drafter = DrafterConfig(
        num_layers=config["num_hidden_layers"], block_size=config["block_size"], markov_rank=0, confidence_head=False,
        labels=ZLAB_LABELS, mask_token_id=dflash["mask_token_id"], intermediate_size=config["intermediate_size"],
        **{name: dflash[name] for name in SETTINGS},
    )
    return ExportReading(drafter=drafter, target_layer_ids=ZLAB_DFLASH_LAYOUT.taps(config),
                         num_target_layers=config["num_target_layers"], mask_token_id=dflash["mask_token_id"],
                         confidence_temperatures=None)


def _shared_problems(reading: EngineReading, config: Mapping[str, Any]) -> None:
    dflash = config.get("dflash_config") or {}
    if dflash.get("sample_from_anchor"):
        reading.problems.append("dflash_config.sample_from_anchor is true: vLLM refuses it (the anchor is the bonus "
                                "token in the 1 + N layout)")
    scale = dflash.get("input_embedding_scale", 1.0)
    if scale != 1.0:
        reading.problems.append(f"dflash_config.input_embedding_scale {scale}: vLLM scales the draft's input "
                                "embeddings by it, SGLang never reads it; the two engines would draft differently")


def _vllm_serve(reading: EngineReading, config: Mapping[str, Any], tensors: Mapping[str, Any], target: TargetFacts,
                paths: ServePaths) -> None:
    _shared_problems(reading, config)
    vllm_serve(reading, config, tensors, target, paths)
    block = int(config.get("block_size", 0))
    reading.notes.append("vLLM serves DFlash2 on its V2 model runner only, and sizes the convolutions from "
                         f"num_speculative_tokens + 1, so keep num_speculative_tokens = {block - 1}")


def _sglang_serve(reading: EngineReading, config: Mapping[str, Any], tensors: Mapping[str, Any],
                  target: TargetFacts, paths: ServePaths) -> None:
    _shared_problems(reading, config)
    dflash = config.get("dflash_config") or {}
    top_k = dflash.get("selector_top_k")
    if isinstance(top_k, int) and top_k & (top_k - 1):
        reading.problems.append(f"dflash_config.selector_top_k {top_k} is not a power of two: SGLang's CUDA selector "
                                "walk (tl.arange(0, top_k)) fails on it")
    hidden = config.get("hidden_size")
    if config.get("target_hidden_size", hidden) != hidden:
        reading.problems.append("target_hidden_size differs from hidden_size: SGLang sizes fc from hidden_size and "
                                "refuses the stored fc.weight")
    sglang_serve(reading, config, tensors, target, paths)


# z-lab's DFlash layout with the DFlash2 keys, tensors and engine rules: the same capture, target-held tensors, taps
# and publishing.
DFLASH2_LAYOUT = dataclasses.replace(
    ZLAB_DFLASH_LAYOUT,
    name=NAME,
    architecture="DFlash2DraftModel",
    holds=holds_any,
    fields=_fields,
    check=_check,
    read=_read,
    engines=block_layout_engines(NAME, BlockServing(always_served, _vllm_serve),
                                 BlockServing(always_served, _sglang_serve)),
    target_vocab_tensors=("candidate_selector.predecessor_codebook", "candidate_selector.successor_codebook"),
    companion_files=no_companion_files,
    readme_section=no_readme_section,
)
