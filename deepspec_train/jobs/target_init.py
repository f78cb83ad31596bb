"""``drafter.init_from_target_layers``: start the drafter's decoder layers from target decoder layers instead of
random weights, so that a drafter whose layers have the target's widths begins from what the target has learned.

Drafter layer ``i`` (its kind's ``decoder_layer_prefixes``: ``layers.<i>.`` for the parallel drafters, ``midlayer.``
for EAGLE-3) takes target layer ``init_from_target_layers[i]``; the drafter's later layers keep their init. Inside a
layer a tensor is copied when the target layer holds one of the same name and shape (attention projections, MLP,
norms of a dense target); the others keep their init (the drafter's q/k norms over a Llama target, EAGLE-3's
query / key / value projections over twice the width, a mixture-of-experts MLP), and the log names how many. A
layer of which nothing fits stops the run with one line. Runs after the random init and ``drafter.init_from``, draws
no random numbers, and reads the target's files (``target.layer_weights``): colocated and streamed drafters start
alike.
"""

from __future__ import annotations

import torch
from torch import nn

from deepspec_train.config.schema import RecipeConfig
from deepspec_train.common.console import get_logger
from deepspec_train.common.errors import UserError
from deepspec_train.kinds.registry import kind_spec
from deepspec_train.target.layer_weights import TargetLayerError, read_decoder_layer


class TargetInitError(UserError, ValueError):
    """Target layers that cannot start the recipe's drafter."""


def initialise_from_target(drafter: nn.Module, cfg: RecipeConfig) -> bool:
    """Copy the target layers ``cfg.drafter.init_from_target_layers`` into ``drafter``'s first decoder layers;
    False (nothing done) when the setting is unset."""
    layers = cfg.drafter.init_from_target_layers
    if layers is None:
        return False
    prefixes = kind_spec(cfg.drafter.kind).decoder_layer_prefixes(cfg.drafter)
    what = f"drafter.init_from_target_layers = {list(layers)}"
    if len(layers) > len(prefixes):
        raise TargetInitError(f"{what}: the {cfg.drafter.kind} drafter has {len(prefixes)} decoder layer(s)")
    params = dict(drafter.named_parameters())
    copied, kept = 0, []
    for prefix, layer in zip(prefixes, layers):
        try:
            state = read_decoder_layer(cfg.target.path, layer)
        except (OSError, TargetLayerError) as error:
            raise TargetInitError(f"{what}: {error}") from None
        mine = {name[len(prefix):]: p for name, p in params.items() if name.startswith(prefix)}
        fits = {name: state[name] for name, p in mine.items()
                if name in state and tuple(state[name].shape) == tuple(p.shape)}
        if not fits:
            raise TargetInitError(f"{what}: no tensor of target layer {layer} fits drafter layer {prefix!r} (names "
                                  "or widths differ)")
        with torch.no_grad():
            for name, value in fits.items():
                mine[name].copy_(value.to(dtype=mine[name].dtype, device=mine[name].device))
        copied += len(fits)
        kept += [prefix + name for name in mine if name not in fits]
    get_logger(__name__).info("%s: %d tensors copied into drafter layers %s; %d keep their init%s", what, copied,
                              list(prefixes[:len(layers)]), len(kept), f" ({', '.join(kept)})" if kept else "")
    return True
