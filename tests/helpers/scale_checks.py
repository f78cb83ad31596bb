"""Checks the scale-model tiers share (Qwen3's ``tests/test_scale_tier.py``, the other families'
``tests/test_family_scale_tier.py`` and the long-context ``tests/test_long_context_tier.py``): which recipe keys a
tier may change, the disk the final checkpoint takes, that an export reloads to the trained drafter, and that an
export's config parses, as the engines parse it, into the drafter's layers (also run on the production plans by
``tests/test_engine_rules.py``)."""

from __future__ import annotations

import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from deepspec_train.formats.drafter_loader import load_exported_drafter
from deepspec_train.jobs.assembly import chunk_builder, validation_pass, validation_plan
from deepspec_train.packing.batch import PackedBatch
from deepspec_train.target.hidden_states import TargetTap
from deepspec_train.target.loading import load_target_model
from tests.helpers.tiny_drafter import drafter_outputs

# The recipe keys the tier may change: paths, sizes, step count, the logging of a test run, and the topology: one
# target worker without a tensor-parallel group (groups are tested in test_target_groups.py).
CHANGED_KEYS = {
    "target.path", "data.train", "data.validation", "data.cache_dir", "data.max_length", "data.num_workers",
    "train.max_steps", "train.global_batch_sequences", "train.eval_every", "train.eval_sequences",
    "logging.wandb", "logging.progress", "logging.log_every", "run.output_dir", "topology.target_workers",
    "topology.target_tp",
}

def drop_final_checkpoint(run_dir: Path) -> None:
    """The run ends with a checkpoint (weights + Adam state: about 0.9 GB for a DSpark drafter's V x r Markov
    factors); the tier checks it was written, then frees the disk."""
    final = run_dir / "checkpoints" / "step_00000002"
    assert (final / "trainer_state.json").is_file()
    shutil.rmtree(final)


def flat_config(tree: dict, prefix: str = "") -> dict[str, object]:
    flat = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            flat.update(flat_config(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def assert_parses_as_the_drafter(config: Mapping[str, Any], tensors: Mapping[str, Any], geometry: Any) -> None:
    """Parse an export's config.json with the transformers config class its ``model_type`` names, as vLLM and
    SGLang do before they build the draft layers, and check that it describes the drafter: its head_dim (the query
    rows of the stored q_proj), no attention bias, SiLU, its RMSNorm epsilon and its one RoPE, no quantization."""
    from transformers import AutoConfig

    assert config["model_type"] == ("llama" if "midlayer.self_attn.q_proj.weight" in tensors else "qwen3")
    assert not {"quantization_config", "auto_map", "rope_scaling"} & config.keys()
    parsed = AutoConfig.for_model(**{k: v for k, v in config.items() if k not in ("architectures", "dtype")})
    rows = {int(t.shape[0]) for name, t in tensors.items() if name.endswith("self_attn.q_proj.weight")}
    assert rows == {parsed.num_attention_heads * parsed.head_dim} and parsed.head_dim == geometry.head_dim
    assert parsed.attention_bias is False and parsed.hidden_act == "silu"
    assert parsed.rope_parameters == geometry.rope_parameters and parsed.rms_norm_eps == geometry.rms_norm_eps


def validation_batch(cfg, rows) -> PackedBatch:
    """The first validation micro-batch of ``rows`` (token rows of the data path) with real target features, as
    the trainer's validation builds it."""
    device = torch.device("cpu")
    tap = TargetTap(load_target_model(cfg.target, device), cfg.target.layer_ids)
    return validation_pass(validation_plan(cfg, rows, 0, 1), chunk_builder(cfg, tap, device))()[0]


def assert_export_reloads(trained_dir: Path, export_dir: Path, target: str, batch: PackedBatch) -> None:
    """The export's reloaded module computes what the trained one does (at the export's bf16 weights) on ``batch``:
    slot logits and, for DSpark, confidences."""
    trained = load_exported_drafter(trained_dir, target).module.to(torch.bfloat16).float()
    reloaded = load_exported_drafter(export_dir, target, dtype=torch.float32).module
    expected, got = drafter_outputs(trained, batch), drafter_outputs(reloaded, batch)
    assert expected.keys() == got.keys()
    assert all(torch.equal(expected[name], got[name]) for name in expected)
