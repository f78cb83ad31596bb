"""The ``dspark`` serving layout: DeepSpec's release layout (``Qwen3DSparkModel``), read by vLLM and SGLang.

Also the layout of a DFlash trained with DSpark labels (``markov_rank 0``, no confidence head). ``markov_head_type``
is ``vanilla`` (both engines), ``gated`` (adds ``markov_head.gate_proj.{weight [r, d + r], bias [r]}``) or ``rnn``
(adds ``markov_head.joint_proj.{weight [3r, 2r + d], bias [3r]}``); the last two only SGLang serves. It stores
copies of the target's ``embed_tokens`` / ``lm_head`` (engines may use the target's own, so they must equal it).
Our addition: an optional ``confidence_temperatures`` list (one calibrated temperature per block position, written
by ``deepspec calibrate``; no engine reads it: SGLang takes temperatures from its STS file, absent means 1.0).
``target_layer_ids`` are ours (both engines add 1 inside).

Engines: vLLM reads ``markov_rank`` without a default, reads no ``markov_head_type`` and builds only the vanilla
Markov head (``markov_w1`` / ``markov_w2``), so it does not serve a gated or RNN head; it drops a confidence head
whose tensors are missing. SGLang's DSPARK requires ``markov_rank > 0``, ``markov_head_type`` among the Markov head
types and a ``mask_token_id`` inside the vocabulary, and uses the target's embedding and LM head; a DSpark-label
DFlash (``markov_rank 0``) is therefore served by vLLM only.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Optional

from deepspec_train.config.schema import DSPARK_LABELS, DrafterConfig
from deepspec_train.families.records import BLOCK_CAPTURE
from deepspec_train.serving_layouts.draft_layers import QWEN3_MODEL_TYPE
from deepspec_train.serving_layouts.engine_reading import (
    SAMPLE_METHOD, EngineReading, ServePaths, TargetFacts, sglang_launch, speculative_config,
)
from deepspec_train.serving_layouts.layout_checks import (
    ConfigCheck, TensorSpec, config_geometry, mask_in_vocab, parallel_backbone,
)
from deepspec_train.serving_layouts.layout_spec import (
    ExportReading, ServingLayout, WrittenDrafter, holds_full_vocabulary, no_companion_files, no_readme_section,
    published_as_is, stacked_depth,
)
from deepspec_train.serving_layouts.parallel_engine_readers import BlockServing, block_layout_engines
from deepspec_train.models.markov_forms import (
    DEFAULT_FORM, MARKOV_FORMS, SGLANG, VLLM, find_form, forms_served_by, served_by,
)

if TYPE_CHECKING:
    from torch import nn

NAME = "dspark"


def dspark_fields(drafter: WrittenDrafter) -> dict[str, Any]:
    """``fields`` of the DSpark layout (DeepSpec's config fields)."""
    module = drafter.module
    confidence = module.confidence_head is not None
    fields = {
        # DeepSpec's release is a Qwen3 config; any other model type is parsed as its family's
        # (serving_layouts.draft_layers).
        "model_type": QWEN3_MODEL_TYPE,
        "num_target_layers": module.geometry.num_target_layers,
        "block_size": drafter.block_size,
        "tie_word_embeddings": False,
        "mask_token_id": drafter.mask_token_id,
        "target_layer_ids": list(drafter.target_layer_ids),
        "num_anchors": drafter.num_anchors,
        "enable_confidence_head": confidence,
        # Our confidence head reads [h_k ; W1[x_prev]] whenever there is a Markov head.
        "confidence_head_with_markov": confidence and module.markov_rank > 0,
        "markov_rank": module.markov_rank,
        "markov_head_type": DEFAULT_FORM.name if module.markov_head is None else module.markov_head.form.name,
    }
    if drafter.confidence_temperatures is not None:
        fields["confidence_temperatures"] = [float(t) for t in drafter.confidence_temperatures]
    return fields


def _check_temperatures(check: ConfigCheck, block_size: int | None, confidence: bool | None) -> None:
    temps = check.config.get("confidence_temperatures")
    if temps is None:
        return
    ok = isinstance(temps, list) and all(
        isinstance(t, (int, float)) and not isinstance(t, bool) and math.isfinite(t) and t > 0 for t in temps
    )
    if not ok:
        check.problems.append(f"confidence_temperatures = {temps!r} is not a list of positive numbers")
    elif block_size is not None and len(temps) != block_size:
        check.problems.append(f"confidence_temperatures has {len(temps)} entries, block_size is {block_size}")
    if confidence is False:
        check.problems.append("confidence_temperatures given but enable_confidence_head is false")


def _markov_tensors(head_type: Any, rank: int, d: int, vocab: int) -> dict[str, TensorSpec]:
    """The Markov head's tensors: the two low-rank factors, plus the gate or the recurrent cell of its form (none
    for a value that names no form: the config check reports it)."""
    import torch

    f = torch.float32
    tensors = {
        "markov_head.markov_w1.weight": TensorSpec((vocab, rank), f),
        "markov_head.markov_w2.weight": TensorSpec((vocab, rank), f),
    }
    form = find_form(head_type)
    for name, shape in ({} if form is None else form.parameter_shapes(rank, d)).items():
        tensors[f"markov_head.{name}"] = TensorSpec(shape, f)
    return tensors


def check_dspark_config(check: ConfigCheck) -> Optional[dict[str, TensorSpec]]:
    """``check`` of the DSpark layout: its required fields and the tensors they imply (over the full vocabulary)."""
    g = config_geometry(check)
    num_layers = check.integer("num_hidden_layers", 1)
    num_target = check.integer("num_target_layers", 1)
    block_size = check.integer("block_size", 1)
    check.integer("num_anchors", 1)
    check.equals("tie_word_embeddings", False)
    head_type = check.config.get("markov_head_type")
    form = find_form(head_type)
    if "markov_head_type" not in check.config:
        check.problems.append("config field markov_head_type is missing")
    elif form is None:
        check.problems.append(f"config field markov_head_type = {head_type!r} is not one of {list(MARKOV_FORMS)}")
    if num_layers is not None:
        check.equals("layer_types", ["full_attention"] * num_layers)
    mask_in_vocab(check, "mask_token_id", None if g is None else g.vocab)
    layer_ids = check.id_list("target_layer_ids", 0, num_target)
    rank = check.integer("markov_rank", 0)
    confidence = check.boolean("enable_confidence_head")
    with_markov = check.boolean("confidence_head_with_markov")
    _check_temperatures(check, block_size, confidence)
    if None in (g, num_layers, layer_ids, rank, confidence, with_markov):
        return None
    tensors = parallel_backbone(g, num_layers, len(layer_ids))
    import torch

    f = torch.float32
    tensors["embed_tokens.weight"] = TensorSpec((g.vocab, g.d), f)
    tensors["lm_head.weight"] = TensorSpec((g.vocab, g.d), f)
    if rank > 0:
        tensors.update(_markov_tensors(head_type, rank, g.d, g.vocab))
    elif form is not None and form.projection is not None:
        # Rank 0 is no Markov head at all (a DSpark-label DFlash): a form with a projection of its own cannot be.
        check.problems.append(f"markov_head_type {head_type} needs markov_rank > 0")
    if confidence:
        tensors["confidence_head.proj.weight"] = TensorSpec((1, g.d + (rank if with_markov else 0)), f)
        tensors["confidence_head.proj.bias"] = TensorSpec((1,), f)
    return tensors


def _taps(config: Mapping[str, Any]) -> list[int]:
    return list(config["target_layer_ids"])


def read_dspark_config(config: Mapping[str, Any]) -> ExportReading:
    """``read`` of the DSpark layout."""
    rank, confidence = config["markov_rank"], config["enable_confidence_head"]
    if confidence and config["confidence_head_with_markov"] != (rank > 0):
        raise ValueError("only confidence heads that read the Markov rows exactly when markov_rank > 0 load")
    # The layout allows a confidence head without a Markov head, but no drafter kind has one (DFlash has neither).
    if confidence and rank == 0:
        raise ValueError("enable_confidence_head with markov_rank 0 does not load: no drafter kind has that head")
    drafter = DrafterConfig(
        num_layers=config["num_hidden_layers"], block_size=config["block_size"], markov_rank=rank,
        confidence_head=confidence, labels=DSPARK_LABELS, mask_token_id=config["mask_token_id"],
        intermediate_size=config["intermediate_size"], markov_head_type=config["markov_head_type"],
    )
    temperatures = config.get("confidence_temperatures")
    return ExportReading(
        drafter=drafter,
        target_layer_ids=_taps(config),
        num_target_layers=config["num_target_layers"],
        mask_token_id=config["mask_token_id"],
        confidence_temperatures=None if temperatures is None else [float(t) for t in temperatures],
    )


def _vllm_unserved(config: Mapping[str, Any]) -> Optional[str]:
    head_type = config.get("markov_head_type", DEFAULT_FORM.name)
    if served_by(VLLM, head_type):
        return None
    return (f"vLLM's qwen3_dspark builds only the vanilla Markov head and ignores markov_head_type; a {head_type} "
            "head's tensors would be refused: serve it with SGLang")


def _vllm_serve(reading: EngineReading, config: Mapping[str, Any], tensors: Mapping[str, Any], target: TargetFacts,
                paths: ServePaths) -> None:
    if "markov_rank" not in config:
        reading.problems.append("markov_rank is missing: vLLM reads it without a default")
    if "mask_token_id" not in config:
        reading.problems.append("mask_token_id is missing: vLLM fills the block with it")
    confidence = bool(config.get("enable_confidence_head"))
    if confidence and "confidence_head.proj.weight" not in tensors:
        reading.problems.append("enable_confidence_head is true but the confidence head tensors are missing: vLLM "
                                "drops the head and cannot schedule by confidence")
    if config.get("markov_rank") == 0:
        reading.notes.append("markov_rank 0 (a DSpark-label DFlash): vLLM builds an empty Markov head; this "
                             "combination is not run by any test here")
    reading.notes.append("vLLM serves method dspark on its V2 model runner only")
    block = int(config.get("block_size", 0))
    spec = {"method": "dspark", "model": paths.export, "num_speculative_tokens": block,
            "draft_sample_method": SAMPLE_METHOD}
    reading.serve_commands.append(f"vllm serve {paths.target} --speculative-config {speculative_config(spec)}")
    if confidence:
        adaptive = {**spec, "enable_adaptive_verification": True}
        reading.serve_commands.append(f"vllm serve {paths.target} --speculative-config {speculative_config(adaptive)}")


def _sglang_unserved(config: Mapping[str, Any]) -> Optional[str]:
    rank = config.get("markov_rank", 0)
    if isinstance(rank, int) and rank > 0:
        return None
    return (f"SGLang's DSPARK requires markov_rank > 0 (got {rank}); a DSpark-label DFlash is for comparisons, not "
            "for serving")


def _sglang_serve(reading: EngineReading, config: Mapping[str, Any], tensors: Mapping[str, Any], target: TargetFacts,
                  paths: ServePaths) -> None:
    if not served_by(SGLANG, config.get("markov_head_type")):
        reading.problems.append(f"markov_head_type {config.get('markov_head_type')!r} is not one of "
                                f"{list(forms_served_by(SGLANG))}: SGLang's DSPARK refuses it")
    mask = config.get("mask_token_id")
    if not isinstance(mask, int) or not 0 <= mask < target.vocab_size:
        reading.problems.append(f"mask_token_id {mask!r} is not a token of the {target.vocab_size}-token "
                                "vocabulary: SGLang's DSPARK refuses it")
    reading.notes.append("SGLang uses the target's embedding and LM head, not the export's copies")
    base = sglang_launch(paths, "DSPARK")
    reading.serve_commands.append(base)
    if config.get("enable_confidence_head"):
        block = int(config.get("block_size", 0))
        reading.serve_commands.append(
            f"SGLANG_RAGGED_VERIFY_MODE=compact {base} --speculative-dspark-block-size {block} "
            f"--speculative-dspark-sps-table-path {paths.sps} "
            f"--speculative-dspark-confidence-sts-path {paths.sts}")


def _unwritten(module: "nn.Module") -> frozenset[str]:
    return frozenset()


DSPARK_LAYOUT = ServingLayout(
    name=NAME,
    architecture="Qwen3DSparkModel",
    holds=holds_full_vocabulary,
    capture=BLOCK_CAPTURE,
    from_target=(),
    copies_target_heads=True,
    carries_temperatures=True,
    unwritten=_unwritten,
    depth=stacked_depth,
    fields=dspark_fields,
    check=check_dspark_config,
    taps=_taps,
    read=read_dspark_config,
    engines=block_layout_engines(
        NAME, BlockServing(_vllm_unserved, _vllm_serve), BlockServing(_sglang_unserved, _sglang_serve)
    ),
    complete_published=published_as_is,
    target_vocab_tensors=("embed_tokens.weight", "lm_head.weight", "markov_head.markov_w1.weight"),
    companion_files=no_companion_files,
    readme_section=no_readme_section,
)
