"""Drafters of every kind for the tiny untied Qwen3 target, as training leaves them: the target on disk, a recipe
per kind, a drafter with every trainable weight random, the ``<run>/drafter`` directory training writes, a DSpark
export, and random packed batches to compare logits on. Used by the export, engine-rule, calibration, RoPE and
fingerprint tests."""

from __future__ import annotations

from pathlib import Path
from typing import Optional, Sequence

import torch
from safetensors.torch import load_file, save_file
from transformers import Qwen3Config, Qwen3ForCausalLM

from deepspec_train.config.schema import DrafterConfig, RecipeConfig, TargetConfig
from deepspec_train.export.exporter import export_drafter
from deepspec_train.formats.trained_drafter import write_trained_drafter
from deepspec_train.kinds.builder import build_drafter_for_geometry
from deepspec_train.models.eagle3_drafter import Eagle3Drafter
from deepspec_train.models.geometry import geometry_from_target_config
from deepspec_train.packing.anchors import sample_anchors
from deepspec_train.packing.batch import PackedBatch
from deepspec_train.packing.packer import SequenceItem, pack_sequences
from deepspec_train.target.head_weights import load_head_weights
from tests.helpers.tiny_drafter import random_loss_mask
from tests.helpers.tiny_geometry import BLOCK, HIDDEN, MASK_ID, tiny_qwen3_config

LAYER_IDS = {"dspark": [0, 2], "dflash": [0, 2], "eagle3": [0, 1, 2]}


def save_tiny_target(directory: Path) -> str:
    """An untied 4-layer Qwen3 target (config.json + model.safetensors), so a swapped embed/LM head would show."""
    config = tiny_qwen3_config(intermediate_size=64, head_dim=8, max_position_embeddings=512,
                               tie_word_embeddings=False)
    torch.manual_seed(123)
    Qwen3ForCausalLM(config).save_pretrained(str(directory))
    return str(directory)


def tiny_recipe(kind: str, target_path: str, labels: str = "dspark", **drafter: object) -> RecipeConfig:
    """A tiny recipe of ``kind`` for the target at ``target_path``; ``drafter`` changes drafter fields."""
    base = {"kind": kind, "num_layers": 2, "block_size": BLOCK, "mask_token_id": MASK_ID, "labels": labels,
            "intermediate_size": 48}
    if kind == "dspark":
        base.update(markov_rank=8, confidence_head=True)
    elif kind == "dflash":
        base.update(markov_rank=0, confidence_head=False)
    else:
        base.update(num_layers=1, ttt_steps=BLOCK, draft_vocab_size=40, markov_rank=0, confidence_head=False)
    base.update(drafter)
    return RecipeConfig(
        drafter=DrafterConfig(**base), target=TargetConfig(path=target_path, layer_ids=list(LAYER_IDS[kind]))
    )


def trained_drafter(cfg: RecipeConfig, seed: int = 0) -> torch.nn.Module:
    """A drafter with every trainable weight random (norm scales, Markov W2 and biases too) and target heads."""
    geometry = geometry_from_target_config(Qwen3Config.from_pretrained(cfg.target.path), cfg.drafter.intermediate_size)
    torch.manual_seed(seed)
    counts = torch.randint(0, 100, (geometry.vocab_size,))
    drafter = build_drafter_for_geometry(cfg, geometry, counts)
    with torch.no_grad():
        for name, param in drafter.named_parameters():
            if name.endswith("norm.weight"):
                param.uniform_(0.5, 1.5)
            elif name.endswith(("markov_w2.weight", ".bias")):
                param.normal_(std=0.3)
    embed, lm_head = load_head_weights(cfg.target.path)
    if isinstance(drafter, Eagle3Drafter):
        drafter.load_target_embedding(embed)
    else:
        drafter.load_target_heads(embed, lm_head)
    return drafter.eval()


def write_training_output(drafter: torch.nn.Module, cfg: RecipeConfig, run_dir: Path) -> Path:
    """``<run>/drafter`` as training writes it; EAGLE-3 also keeps its draft-vocabulary maps there."""
    out = run_dir / "drafter"
    write_trained_drafter(drafter, cfg, out)
    if isinstance(drafter, Eagle3Drafter):
        state = load_file(str(out / "drafter.safetensors"))
        state.update(d2t=drafter.d2t.clone(), t2d=drafter.t2d.clone())
        save_file(state, str(out / "drafter.safetensors"))
    return out


def random_batch(kind: str, seed: int = 0, labels: str = "dspark") -> PackedBatch:
    """Anchor blocks from three random sequences with random target features for ``kind``'s taps."""
    g = torch.Generator().manual_seed(seed)
    width = len(LAYER_IDS[kind]) * HIDDEN
    items = []
    for i, length in enumerate((23, 31, 17)):
        items.append(
            SequenceItem(
                input_ids=torch.randint(0, MASK_ID, (length,), generator=g),
                loss_mask=random_loss_mask(length, g),
                ctx_features=torch.randn(length, width, generator=g),
                final_hidden=torch.randn(length, HIDDEN, generator=g),
                sample_id=i,
            )
        )
    anchors = [sample_anchors(it.loss_mask, 4, g) for it in items]
    (batch,) = pack_sequences(items, anchors, BLOCK, 10_000, MASK_ID, labels)
    return batch


def exported_dspark(
    tmp_path: Path, target: str, temperatures: Optional[Sequence[float]] = None
) -> tuple[Path, torch.nn.Module]:
    """A trained-ish DSpark drafter exported at fp32 (used by the calibrate CLI tests too)."""
    cfg = tiny_recipe("dspark", target)
    drafter = trained_drafter(cfg)
    run = write_training_output(drafter, cfg, tmp_path / "run")
    out = export_drafter(run, target, tmp_path / "export", confidence_temperatures=temperatures, dtype=torch.float32)
    return out, drafter
