"""The ``eagle3`` serving layout: SGLang's ``LlamaForCausalLMEagle3`` (SpecForge format), read by vLLM and SGLang.

One decoder layer (``midlayer.*``) on ``fc``-fused target features, its own draft-vocabulary ``lm_head``; the
draft-vocabulary maps ``d2t`` / ``t2d`` only for a reduced draft vocabulary (with a full one vLLM has no parameter
to load a ``d2t`` into). No embedding: the engines share the target's. Our additions, ignored by engines:
``block_size`` (TTT steps) and ``num_target_layers``.

Layer ids, two fields in two conventions: the top-level ``eagle_aux_hidden_state_layer_ids``, read first by vLLM,
holds hidden-state indices (vLLM captures the state entering layer ``L`` = ``hidden_states[L]``), so ours + 1;
``eagle_config.eagle_aux_hidden_state_layer_ids``, the only field SGLang reads, holds decoder-layer ids for Qwen3 /
Llama / Qwen2 targets (SGLang captures before layer ``id + 1``; + 1 only when the first id is 1 for DeepSeek-V2/V3
and GLM-4 MoE lite targets), so ours unchanged. Without ids both engines capture hidden states ``[2, L//2, L-3]``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

from deepspec_train.config.schema import DrafterConfig
from deepspec_train.families.records import EAGLE3_CAPTURE
from deepspec_train.serving_layouts.draft_layers import (
    LLAMA_MODEL_TYPE, layer_config_problems, shared_embedding_problems,
)
from deepspec_train.serving_layouts.engine_reading import (
    EngineReading,
    ServePaths,
    TargetFacts,
    captured_decoder_layers,
    config_ids,
    default_eagle3_points,
    draft_vocab_problems,
    sglang_launch,
    speculative_config,
    vllm_capture_points,
)
from deepspec_train.serving_layouts.layout_checks import (
    ConfigCheck, PublishedDrafterError, TensorSpec, config_geometry, decoder_layer_tensors,
)
from deepspec_train.serving_layouts.layout_spec import (
    ExportReading, LayoutError, ServingLayout, WrittenDrafter, holds_any, no_companion_files, no_readme_section,
)

if TYPE_CHECKING:
    import torch
    from torch import nn

NAME = "eagle3"
# Low / mid / high target layers, fused by ``fc``.
NUM_FUSED_LAYERS = 3
# EAGLE-3 configs written elsewhere carry no block size; DeepSpec trains EAGLE-3 with 7 TTT steps.
DEFAULT_BLOCK = 7
_FROM_TARGET = ("embed_tokens.weight",)
_VOCAB_MAPS = ("d2t", "t2d")


def vllm_eagle3_layer_ids(layer_ids: list[int]) -> list[int]:
    """Our decoder-layer ids -> the top-level EAGLE-3 field vLLM reads (hidden-state indices, ``k -> k + 1``)."""
    return [int(k) + 1 for k in layer_ids]


def layer_ids_from_eagle3_config(config: Mapping[str, Any]) -> list[int]:
    """Our decoder-layer ids from an EAGLE-3 config: ``eagle_config``'s ids (already ours), else the top-level
    hidden-state indices minus 1."""
    eagle = config.get("eagle_config")
    if isinstance(eagle, Mapping) and "eagle_aux_hidden_state_layer_ids" in eagle:
        return [int(i) for i in eagle["eagle_aux_hidden_state_layer_ids"]]
    return [int(i) - 1 for i in config["eagle_aux_hidden_state_layer_ids"]]


def check_eagle3_taps(layer_ids: list[int], num_target_layers: int) -> None:
    """Refuse EAGLE-3 taps that no serving engine can feed back in the trained order (one-line ``ValueError``).

    vLLM and SGLang capture the residual stream entering each chosen decoder layer while they walk the layers in
    order, so ``fc``'s input columns always come in increasing layer order, and the last layer's output (it
    enters no layer) is never available. Taps must therefore be 3 non-decreasing decoder-layer ids in
    ``0..L-2``. Repeated ids train, but each engine captures a layer once, so their export is refused later.
    """
    ids = list(layer_ids)
    if len(ids) != NUM_FUSED_LAYERS or not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
        raise ValueError(f"EAGLE-3 fuses exactly {NUM_FUSED_LAYERS} target layers (ints), got target.layer_ids={ids}")
    if ids != sorted(ids):
        raise ValueError(
            f"EAGLE-3 target.layer_ids={ids} are not in increasing order; the engines feed fc in layer order, "
            f"so train with target.layer_ids={sorted(ids)}"
        )
    last = num_target_layers - 2
    if ids[0] < 0 or ids[-1] > last:
        raise ValueError(
            f"EAGLE-3 target.layer_ids={ids} must be decoder layers 0..{last} of the {num_target_layers}-layer "
            "target (engines capture the state entering a layer, never the last layer's output)"
        )


def check_draft_vocab(d2t: torch.Tensor, t2d: torch.Tensor) -> None:
    """The EAGLE-3 maps agree: ``d2t[i] + i`` are increasing target ids, exactly the ones ``t2d`` marks."""
    import torch

    target_ids = torch.arange(d2t.shape[0], dtype=torch.long) + d2t.long().cpu()
    members = t2d.bool().cpu()
    problems = []
    if target_ids.numel() and (int(target_ids.min()) < 0 or int(target_ids.max()) >= members.shape[0]):
        problems.append("d2t maps draft ids outside the target vocabulary")
    elif bool((target_ids[1:] <= target_ids[:-1]).any()):
        problems.append("d2t target ids are not strictly increasing")
    elif int(members.sum()) != target_ids.numel() or not bool(members[target_ids].all()):
        problems.append("t2d does not mark exactly the target ids that d2t maps to")
    if problems:
        raise LayoutError(NAME, problems)


def _fields(drafter: WrittenDrafter) -> dict[str, Any]:
    module, geometry = drafter.module, drafter.module.geometry
    layer_ids = list(drafter.target_layer_ids)
    check_eagle3_taps(layer_ids, geometry.num_target_layers)
    return {
        "model_type": LLAMA_MODEL_TYPE,
        "draft_vocab_size": int(module.d2t.shape[0]),
        "tie_word_embeddings": False,
        "target_hidden_size": geometry.hidden_size,
        "rope_theta": geometry.rope_theta,
        # SGLang reads only eagle_config's ids, as decoder layers (ours); vLLM reads the top level first, as
        # hidden-state indices (ours + 1).
        "eagle_config": {"eagle_aux_hidden_state_layer_ids": layer_ids, "use_aux_hidden_state": True},
        "eagle_aux_hidden_state_layer_ids": vllm_eagle3_layer_ids(layer_ids),
        "num_target_layers": geometry.num_target_layers,
        "block_size": drafter.block_size,
    }


def _check_layer_ids(check: ConfigCheck, num_target: Optional[int]) -> Optional[list[int]]:
    """The top-level (vLLM) ids, checked against ``eagle_config``'s (SGLang) ones."""
    eagle = check.mapping("eagle_config")
    # Our ids are decoder layers 0..L-2 (the last layer's output enters no layer, so no engine captures it).
    top = check.id_list("eagle_aux_hidden_state_layer_ids", 1, num_target)
    ours = None
    if eagle is not None:
        check.equals("use_aux_hidden_state", True, eagle, "eagle_config.")
        high = None if num_target is None else num_target - 1
        ours = check.id_list("eagle_aux_hidden_state_layer_ids", 0, high, eagle, "eagle_config.")
    if top is not None:
        if len(top) != NUM_FUSED_LAYERS:
            check.problems.append(f"eagle_aux_hidden_state_layer_ids {top} must name 3 hidden states")
        if ours is not None and top != vllm_eagle3_layer_ids(ours):
            check.problems.append(
                f"eagle_config.eagle_aux_hidden_state_layer_ids {ours} must be the top-level ids {top} minus 1 "
                "(eagle_config holds decoder-layer ids for SGLang, the top level hidden-state indices for vLLM)"
            )
    return top


def _check(check: ConfigCheck) -> Optional[dict[str, TensorSpec]]:
    g = config_geometry(check)
    check.equals("model_type", LLAMA_MODEL_TYPE)
    check.equals("num_hidden_layers", 1)
    check.equals("tie_word_embeddings", False)
    check.number("rope_theta")
    num_target = check.config.get("num_target_layers")
    if num_target is not None:
        num_target = check.integer("num_target_layers", 1)
    if "block_size" in check.config:
        check.integer("block_size", 1)
    draft_vocab = check.integer("draft_vocab_size", 1)
    if g is not None and draft_vocab is not None and draft_vocab > g.vocab:
        check.problems.append(f"draft_vocab_size {draft_vocab} exceeds vocab_size {g.vocab}")
    if g is not None and "target_hidden_size" in check.config:
        check.equals("target_hidden_size", g.d)
    top = _check_layer_ids(check, num_target)
    if None in (g, draft_vocab, top):
        return None
    import torch

    f = torch.float32
    tensors = decoder_layer_tensors("midlayer.", g, 2 * g.d, qk_norm=False)
    tensors.update(
        {
            "midlayer.hidden_norm.weight": TensorSpec((g.d,), f),
            "fc.weight": TensorSpec((g.d, len(top) * g.d), f),
            "norm.weight": TensorSpec((g.d,), f),
            "lm_head.weight": TensorSpec((draft_vocab, g.d), f),
        }
    )
    # A full draft vocabulary is the identity map: no maps (vLLM has no parameter to load a d2t into then).
    if draft_vocab < g.vocab:
        tensors["d2t"] = TensorSpec((draft_vocab,), torch.int64)
        tensors["t2d"] = TensorSpec((g.vocab,), torch.bool)
    return tensors


def _read(config: Mapping[str, Any]) -> ExportReading:
    layer_ids = layer_ids_from_eagle3_config(config)
    block = config.get("block_size", DEFAULT_BLOCK)
    drafter = DrafterConfig(
        num_layers=1, block_size=block, ttt_steps=block, markov_rank=0, confidence_head=False,
        draft_vocab_size=config["draft_vocab_size"], intermediate_size=config["intermediate_size"],
    )
    return ExportReading(
        drafter=drafter,
        target_layer_ids=layer_ids,
        # Only used as metadata by the EAGLE-3 module; the smallest depth consistent with its taps when absent.
        num_target_layers=config.get("num_target_layers", max(layer_ids) + 1),
        mask_token_id=None,
        confidence_temperatures=None,
    )


def _vllm(config: Mapping[str, Any], tensors: Mapping[str, Any], target: TargetFacts,
          paths: ServePaths) -> EngineReading:
    reading = EngineReading("vllm", NAME, None)
    points = vllm_capture_points(config)
    if config_ids(config.get("eagle_aux_hidden_state_layer_ids")) is None:
        points = default_eagle3_points(target.num_layers)
        reading.problems.append(
            f"no top-level eagle_aux_hidden_state_layer_ids: vLLM captures its default hidden states {points}")
    if config.get("norm_before_residual"):
        reading.problems.append("norm_before_residual is true, but the drafter keeps the un-normed residual")
    reading.problems += layer_config_problems("vllm", config, tensors)
    reading.problems += shared_embedding_problems("vllm", target.embedding_scale)
    reading.problems += draft_vocab_problems("vllm", config, tensors, target.vocab_size)
    steps = int(config.get("block_size", DEFAULT_BLOCK))
    spec = {"method": "eagle3", "model": paths.export, "num_speculative_tokens": steps}
    reading.serve_commands.append(f"vllm serve {paths.target} --speculative-config {speculative_config(spec)}")
    reading.captured_layers = captured_decoder_layers(points, target.num_layers)
    return reading


def _sglang_points(config: Mapping[str, Any], target: TargetFacts, reading: EngineReading) -> list[int] | None:
    eagle = config.get("eagle_config")
    ids = config_ids(eagle.get("eagle_aux_hidden_state_layer_ids")) if isinstance(eagle, Mapping) else None
    if ids is None:
        points = default_eagle3_points(target.num_layers)
        reading.problems.append(
            f"no eagle_config.eagle_aux_hidden_state_layer_ids (the only field SGLang reads): it captures its "
            f"default hidden states {points}")
        return points
    if target.engines is None:
        reading.problems.append(f"SGLang's EAGLE-3 capture rule for a {target.architecture} target is not stated here")
        return None
    # SGLang's set_eagle3_layers_to_capture differs by target class (+1, +1 when the first id is 1, ...).
    return target.engines["sglang"].eagle3_points(ids, target.num_layers)


def _sglang(config: Mapping[str, Any], tensors: Mapping[str, Any], target: TargetFacts,
            paths: ServePaths) -> EngineReading:
    reading = EngineReading("sglang", NAME, None)
    points = _sglang_points(config, target, reading)
    reading.problems += layer_config_problems("sglang", config, tensors)
    reading.problems += shared_embedding_problems("sglang", target.embedding_scale)
    reading.problems += draft_vocab_problems("sglang", config, tensors, target.vocab_size)
    reading.serve_commands.append(
        f"{sglang_launch(paths, 'EAGLE3')} "
        "--speculative-num-steps 6 --speculative-eagle-topk 10 --speculative-num-draft-tokens 32")
    if points is not None:
        reading.captured_layers = captured_decoder_layers(points, target.num_layers)
    return reading


def _unwritten(module: "nn.Module") -> frozenset[str]:
    # A full draft vocabulary is the identity map (draft ids are sorted target ids): ship no maps.
    full_vocabulary = module.d2t.shape[0] == module.geometry.vocab_size
    return frozenset(_FROM_TARGET + (_VOCAB_MAPS if full_vocabulary else ()))


def _depth(module: "nn.Module") -> int:
    return 1


# An embedding some publishers ship with an EAGLE-3 drafter; the engines use the target's.
PUBLISHED_EMBEDDING = "embed_tokens.weight"


def complete_published_eagle3(
    config: dict[str, Any], state: dict[str, "torch.Tensor"], target_path: Optional[str]
) -> tuple[dict[str, Any], dict[str, "torch.Tensor"]]:
    """``complete_published`` of EAGLE-3: a config that names no tapped layers (the EAGLE repository's) gets the
    engines' default taps from the target's depth, and a shipped embedding is dropped once its shape is checked
    against the target's (the target's own is the one used)."""
    config, state = dict(config), dict(state)
    eagle = config.get("eagle_config") or {}
    target = json.loads((Path(target_path) / "config.json").read_text()) if target_path else None
    if "eagle_aux_hidden_state_layer_ids" not in config and "eagle_aux_hidden_state_layer_ids" not in eagle:
        if target is None:
            raise PublishedDrafterError("this EAGLE-3 config names no tapped target layers: pass the target so the "
                                        "engines' default taps can be derived from its depth")
        taps = [point - 1 for point in default_eagle3_points(int(target["num_hidden_layers"]))]
        config["eagle_config"] = {**eagle, "eagle_aux_hidden_state_layer_ids": taps, "use_aux_hidden_state": True}
    embedding = state.pop(PUBLISHED_EMBEDDING, None)
    if embedding is not None and target is not None:
        expected = (int(target["vocab_size"]), int(target["hidden_size"]))
        if tuple(embedding.shape) != expected:
            raise PublishedDrafterError(f"the EAGLE-3 drafter does not fit the target {target_path}: its "
                                        f"{PUBLISHED_EMBEDDING} is {tuple(embedding.shape)}, the target's embedding "
                                        f"(vocabulary x hidden) is {expected}")
    return config, state


EAGLE3_LAYOUT = ServingLayout(
    name=NAME,
    architecture="LlamaForCausalLMEagle3",
    holds=holds_any,
    capture=EAGLE3_CAPTURE,
    from_target=_FROM_TARGET,
    copies_target_heads=False,
    carries_temperatures=False,
    unwritten=_unwritten,
    depth=_depth,
    fields=_fields,
    check=_check,
    taps=layer_ids_from_eagle3_config,
    read=_read,
    engines={"vllm": _vllm, "sglang": _sglang},
    complete_published=complete_published_eagle3,
    target_vocab_tensors=("t2d",),
    companion_files=no_companion_files,
    readme_section=no_readme_section,
)
