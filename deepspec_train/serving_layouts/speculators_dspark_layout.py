"""The ``speculators-dspark`` serving layout: a DSpark in the speculators checkpoint format, the one vLLM reads a
DSpark with a reduced draft vocabulary from (``speculators_model_type: "dspark"``).

The config is the DeepSpec DSpark layout's (``dspark_layout``: same tensors, same fields, so every check of that
layout applies) plus what vLLM 0.33's speculators reader (``transformers_utils/configs/speculators``) takes:

- ``speculators_model_type "dspark"``, ``speculators_config`` (``proposal_methods[0].speculative_tokens``, the
  block size, and the ``verifier``: the target's path and architectures) and ``transformer_layer_config`` (the
  drafter's own model config, which vLLM builds the draft model from);
- ``aux_hidden_state_layer_ids``: the tapped layers as hidden-state indices (ours + 1; vLLM subtracts 1 for
  ``target_layer_ids``), ``use_aux_hidden_state true``, ``target_hidden_size``;
- ``sample_from_anchor true``: our block's slot 0 (the anchor's position) drafts the token after the anchor, so all
  ``block_size`` slots draft (vLLM's default ``false`` would read the anchor as a bonus token and the block as
  ``1 + N`` fill-in slots);
- ``draft_vocab_size``: over a reduced draft vocabulary of ``N < V`` tokens the LM head (the target head's rows of
  the draft tokens) and the Markov factor ``markov_w2`` have ``N`` rows, the logits and the Markov bias live on
  draft ids, and ``d2t [N]`` (int64 offsets: target id = draft id + ``d2t[draft id]``) maps a sampled draft id to
  its target id. ``t2d [V]`` (bool membership) goes along for readers that want it; vLLM skips it.

The architecture name ``DSparkSpeculator`` tells the layout apart from the DeepSpec one; vLLM's speculators reader
builds a ``Qwen3DSparkModel`` for any architecture name it does not list. Engines: vLLM serves the vanilla Markov
head only, as in the DeepSpec layout, and checks that a reduced vocabulary comes with ``d2t`` and its own LM
head. SGLang 0.5.23 does not read the speculators format for DSpark and serves DSpark with the target's own LM head
over the whole vocabulary, so it is named as not serving this layout (the export is still written).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, Optional

from deepspec_train.families.records import BLOCK_CAPTURE
from deepspec_train.serving_layouts.draft_layers import (
    QWEN3_MODEL_TYPE, RAW_FIELDS, drafter_layer_fields, layer_config_problems,
)
from deepspec_train.serving_layouts.dspark_layout import check_dspark_config, dspark_fields, read_dspark_config
from deepspec_train.serving_layouts.engine_reading import (
    SAMPLE_METHOD, EngineReading, ServePaths, TargetFacts, speculative_config,
)
from deepspec_train.serving_layouts.layout_checks import ConfigCheck, TensorSpec
from deepspec_train.serving_layouts.layout_spec import (
    ExportReading, ServingLayout, WrittenDrafter, holds_any, no_companion_files, no_readme_section, published_as_is,
    stacked_depth,
)
from deepspec_train.serving_layouts.parallel_engine_readers import BlockServing, block_layout_engines
from deepspec_train.models.markov_forms import DEFAULT_FORM, VLLM, served_by

NAME = "speculators-dspark"
SPECULATORS_TYPE = "dspark"
# Target fields the drafter's own model config (``transformer_layer_config``) repeats; the layer fields themselves
# are the drafter's (``draft_layers.drafter_layer_fields``: vLLM sets them on its config as they are).
_TARGET_FIELDS = ("hidden_size", "num_attention_heads", "num_key_value_heads", "vocab_size", "max_position_embeddings")


def _fields(drafter: WrittenDrafter) -> dict[str, Any]:
    module = drafter.module
    geometry = module.geometry
    vocab = module.draft_vocab
    depth = stacked_depth(module)
    model = {key: drafter.target_config[key] for key in _TARGET_FIELDS if key in drafter.target_config}
    model.update(model_type=QWEN3_MODEL_TYPE, num_hidden_layers=depth, intermediate_size=geometry.intermediate_size,
                 layer_types=["full_attention"] * depth, tie_word_embeddings=False, **drafter_layer_fields(geometry))
    return {
        **dspark_fields(drafter),
        "speculators_model_type": SPECULATORS_TYPE,
        "speculators_config": {
            "algorithm": SPECULATORS_TYPE,
            "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": drafter.block_size}],
            "default_proposal_method": "greedy",
            "verifier": {"name_or_path": drafter.target_path,
                         "architectures": list(drafter.target_config.get("architectures") or [])},
        },
        "transformer_layer_config": model,
        "draft_vocab_size": geometry.vocab_size if vocab is None else vocab.size,
        "target_hidden_size": geometry.hidden_size,
        "aux_hidden_state_layer_ids": [int(k) + 1 for k in drafter.target_layer_ids],
        "use_aux_hidden_state": True,
        "sample_from_anchor": True,
    }


def _check(check: ConfigCheck) -> Optional[dict[str, TensorSpec]]:
    import torch

    tensors = check_dspark_config(check)
    check.equals("speculators_model_type", SPECULATORS_TYPE)
    check.equals("sample_from_anchor", True)
    check.equals("use_aux_hidden_state", True)
    block = check.config.get("block_size")
    speculators = check.config.get("speculators_config")
    methods = (speculators.get("proposal_methods") if isinstance(speculators, Mapping) else None) or [{}]
    if not isinstance(methods[0], Mapping) or methods[0].get("speculative_tokens") != block:
        check.problems.append(f"speculators_config.proposal_methods[0].speculative_tokens must be block_size {block}")
    if not isinstance(check.config.get("transformer_layer_config"), Mapping):
        check.problems.append("config field transformer_layer_config is missing (vLLM builds the draft model from it)")
    taps = check.config.get("target_layer_ids")
    if isinstance(taps, list) and check.config.get("aux_hidden_state_layer_ids") != [int(k) + 1 for k in taps]:
        check.problems.append("aux_hidden_state_layer_ids must be target_layer_ids + 1 (hidden-state indices)")
    vocab = check.config.get("vocab_size")
    draft = check.integer("draft_vocab_size", 1)
    if tensors is None or draft is None or not isinstance(vocab, int):
        return None
    if draft > vocab:
        check.problems.append(f"draft_vocab_size {draft} exceeds vocab_size {vocab}")
    elif draft < vocab:
        d, f = check.config["hidden_size"], torch.float32
        tensors["lm_head.weight"] = TensorSpec((draft, d), f)
        if "markov_head.markov_w2.weight" in tensors:
            tensors["markov_head.markov_w2.weight"] = TensorSpec((draft, check.config["markov_rank"]), f)
        tensors["d2t"] = TensorSpec((draft,), torch.int64)
        tensors["t2d"] = TensorSpec((vocab,), torch.bool)
    return tensors


def _read(config: Mapping[str, Any]) -> ExportReading:
    reading = read_dspark_config(config)
    draft = config["draft_vocab_size"]
    if draft >= config["vocab_size"]:
        return reading
    return reading._replace(drafter=dataclasses.replace(reading.drafter, draft_vocab_size=draft))


def _layers(engine: str, config: Mapping[str, Any], tensors: Mapping[str, Any]) -> list[str]:
    """vLLM builds the draft model from ``transformer_layer_config``, its fields set as they are."""
    layers = config.get("transformer_layer_config")
    return layer_config_problems(engine, layers if isinstance(layers, Mapping) else {}, tensors, RAW_FIELDS)


def _vllm_unserved(config: Mapping[str, Any]) -> Optional[str]:
    head_type = config.get("markov_head_type", DEFAULT_FORM.name)
    if served_by(VLLM, head_type):
        return None
    return f"vLLM's qwen3_dspark builds only the vanilla Markov head; a {head_type} head's tensors would be refused"


def _vllm_serve(reading: EngineReading, config: Mapping[str, Any], tensors: Mapping[str, Any], target: TargetFacts,
                paths: ServePaths) -> None:
    reading.notes.append("vLLM reads the speculators config (speculators_model_type dspark) on its V2 model runner")
    spec = {"method": "dspark", "model": paths.export, "num_speculative_tokens": int(config.get("block_size", 0)),
            "draft_sample_method": SAMPLE_METHOD}
    reading.serve_commands.append(f"vllm serve {paths.target} --speculative-config {speculative_config(spec)}")


def _sglang_unserved(config: Mapping[str, Any]) -> Optional[str]:
    return ("SGLang 0.5.23 does not read the speculators format for DSpark, and its DSPARK drafts over the target's "
            "own LM head (no draft vocabulary): export a full-vocabulary DSpark in the dspark layout for SGLang")


def _no_sglang_serve(reading: EngineReading, config: Mapping[str, Any], tensors: Mapping[str, Any],
                     target: TargetFacts, paths: ServePaths) -> None:
    """Never called: SGLang does not serve this layout (``_sglang_unserved``)."""


SPECULATORS_DSPARK_LAYOUT = ServingLayout(
    name=NAME,
    architecture="DSparkSpeculator",
    holds=holds_any,
    capture=BLOCK_CAPTURE,
    from_target=(),
    copies_target_heads=True,
    carries_temperatures=False,
    unwritten=lambda module: frozenset(),
    depth=stacked_depth,
    fields=_fields,
    check=_check,
    taps=lambda config: list(config["target_layer_ids"]),
    read=_read,
    engines=block_layout_engines(
        NAME, BlockServing(_vllm_unserved, _vllm_serve, _layers), BlockServing(_sglang_unserved, _no_sglang_serve)
    ),
    complete_published=published_as_is,
    target_vocab_tensors=("embed_tokens.weight", "markov_head.markov_w1.weight", "t2d"),
    companion_files=no_companion_files,
    readme_section=no_readme_section,
)
