"""Build the drafter a recipe asks for, from the target it drafts for.

One place maps ``drafter.kind`` to a module: DSpark and DFlash are the same ``ParallelDrafter`` (DFlash is Markov
rank 0 without a confidence head), EAGLE-3 is ``Eagle3Drafter`` with a draft vocabulary counted from the
supervised tokens of the training data. Frozen embedding / LM-head copies are filled from the target.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Iterable, Mapping, Optional

import torch
from torch import nn

from deepspec_train.config.schema import RecipeConfig
from deepspec_train.models.draft_vocab import build_draft_vocab, count_supervised_tokens
from deepspec_train.models.eagle3_drafter import Eagle3Drafter
from deepspec_train.models.geometry import DrafterGeometry, geometry_from_target_config
from deepspec_train.models.parallel_drafter import ParallelDrafter


def check_kind_settings(cfg: RecipeConfig) -> None:
    """Reject recipe combinations that would silently train something else than asked."""
    d = cfg.drafter
    if d.kind == "dflash" and (d.markov_rank != 0 or d.confidence_head):
        raise ValueError("drafter.kind=dflash needs drafter.markov_rank=0 and drafter.confidence_head=false")
    if d.kind == "dspark" and d.markov_rank <= 0:
        raise ValueError("drafter.kind=dspark needs drafter.markov_rank > 0 (use kind=dflash for rank 0)")
    if d.labels == "zlab" and d.kind != "dflash":
        raise ValueError("drafter.labels=zlab is DFlash's own convention: only with drafter.kind=dflash")


def build_drafter_for_geometry(
    cfg: RecipeConfig,
    geometry: DrafterGeometry,
    token_counts: Optional[torch.Tensor] = None,
) -> nn.Module:
    """The untrained drafter module (random weights; heads not yet loaded)."""
    check_kind_settings(cfg)
    if cfg.drafter.kind == "eagle3":
        counts = token_counts if token_counts is not None else torch.ones(geometry.vocab_size, dtype=torch.long)
        vocab = build_draft_vocab(counts, cfg.drafter.draft_vocab_size)
        return Eagle3Drafter(geometry, cfg.drafter, cfg.target.layer_ids, vocab)
    return ParallelDrafter(geometry, cfg.drafter, cfg.target.layer_ids)


def build_drafter(cfg: RecipeConfig, target: nn.Module, train_rows: Iterable[Mapping[str, Any]]) -> nn.Module:
    """Drafter for ``target`` (a loaded HF causal LM), with the target's embedding / LM head copied in."""
    geometry = geometry_from_target_config(target.config, cfg.drafter.intermediate_size)
    counts = None
    if cfg.drafter.kind == "eagle3":
        counts = count_supervised_tokens(train_rows, geometry.vocab_size)
    drafter = build_drafter_for_geometry(cfg, geometry, counts)
    embed = target.get_input_embeddings().weight.detach().float()
    if isinstance(drafter, Eagle3Drafter):
        drafter.load_target_embedding(embed)
    else:
        drafter.load_target_heads(embed, target.get_output_embeddings().weight.detach().float())
    return drafter


def drafter_metadata(drafter: nn.Module, cfg: RecipeConfig) -> dict:
    """What a loader needs to rebuild ``drafter``: kind, recipe drafter section, geometry, target layers."""
    return {
        "kind": cfg.drafter.kind,
        "drafter": dataclasses.asdict(cfg.drafter),
        "geometry": dataclasses.asdict(drafter.geometry),
        "target_layer_ids": list(cfg.target.layer_ids),
        "target_path": cfg.target.path,
    }
