"""Build the drafter a recipe asks for, from the target it drafts for.

The drafter kind's record (``kinds``) says which module to build and which frozen copies of the target's heads
it holds; EAGLE-3's draft vocabulary is sized from the supervised-token counts of the training data. Two
entry points: ``build_drafter`` next to a loaded target (colocated training), and ``build_drafter_from_files``
from the target's config and safetensors only (a streamed drafter worker never loads the target's layers).
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping, Optional

import torch
from torch import nn

from deepspec_train.config.schema import RecipeConfig
from deepspec_train.kinds.registry import kind_spec
from deepspec_train.models.draft_vocab import count_supervised_tokens
from deepspec_train.models.geometry import DrafterGeometry, geometry_from_target_config
from deepspec_train.target.head_weights import input_embeddings, load_head_weights
from deepspec_train.target.loading import load_target_config, resolve_dtype


def build_drafter_for_geometry(
    cfg: RecipeConfig,
    geometry: DrafterGeometry,
    token_counts: Optional[torch.Tensor] = None,
) -> nn.Module:
    """The untrained drafter module (random weights; heads not yet loaded). ``cfg`` has passed
    ``kinds.recipe_validation.load_recipe``: its kind's rules are not checked again here."""
    return kind_spec(cfg.drafter.kind).build(cfg.drafter, geometry, list(cfg.target.layer_ids), token_counts)


def build_drafter(cfg: RecipeConfig, target: nn.Module, train_rows: Iterable[Mapping[str, Any]]) -> nn.Module:
    """Drafter for ``target`` (a loaded HF causal LM), with the target's embedding / LM head copied in."""
    spec = kind_spec(cfg.drafter.kind)
    geometry = geometry_from_target_config(target.config, cfg.drafter.intermediate_size)
    counts = count_supervised_tokens(train_rows, geometry.vocab_size) if spec.needs_token_counts(cfg.drafter) else None
    drafter = build_drafter_for_geometry(cfg, geometry, counts)
    embed = input_embeddings(target.get_input_embeddings().weight.detach(), target.config.to_dict()).float()
    spec.load_frozen_heads(drafter, embed, target.get_output_embeddings().weight.detach().float())
    return drafter


def build_drafter_from_files(
    cfg: RecipeConfig, token_counts: Optional[torch.Tensor], device: torch.device
) -> tuple[nn.Module, torch.Tensor]:
    """The drafter and the frozen LM-head weight, from the target's config and safetensors only."""
    geometry = geometry_from_target_config(load_target_config(cfg.target), cfg.drafter.intermediate_size)
    drafter = build_drafter_for_geometry(cfg, geometry, token_counts)
    embed, lm_head = load_head_weights(cfg.target.path)
    kind_spec(cfg.drafter.kind).load_frozen_heads(drafter, embed.float(), lm_head.float())
    # The same dtype the colocated path takes from the loaded target's output embedding.
    return drafter.to(device), lm_head.to(device=device, dtype=resolve_dtype(cfg.target.dtype, device))
