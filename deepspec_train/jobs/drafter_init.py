"""``drafter.init_from``: start training from a drafter directory instead of random weights, to fine-tune a
published DSpark / DFlash / EAGLE-3 (or an earlier run) on one's own data.

The directory is read like ``deepspec eval`` reads it (``export.loader``: this project's outputs and exports,
DeepSpec's DSpark releases, z-lab DFlash, EAGLE-3 from SpecForge or the EAGLE repository). What the drafter trains
(every trainable tensor) and its EAGLE-3 vocabulary maps are copied into the drafter the recipe built; the frozen
target heads stay the target's, and the optimizer starts fresh (it is built after this). A published drafter
records no target, and a fine-tuning target may differ from the one it was trained for, so the fingerprint check
is replaced by a shape-and-vocabulary check: the directory must fit the target (``formats.published_drafters``)
and hold every tensor of the recipe's drafter in the same shape; otherwise the run stops with one line. A kind with a
``warm_start`` record also starts from the drafters of the kinds it names (DFlash2 from a DFlash with z-lab
labels): the tensors that kind lacks keep the recipe drafter's init (DFlash2's identity convolutions).
"""

from __future__ import annotations

import torch
from torch import nn

from deepspec_train.config.schema import RecipeConfig
from deepspec_train.common.console import get_logger
from deepspec_train.common.errors import UserError
from deepspec_train.formats.drafter_loader import load_exported_drafter
from deepspec_train.formats.trained_drafter import SAVED_BUFFERS
from deepspec_train.kinds.registry import kind_spec


class InitFromError(UserError, ValueError):
    """A ``drafter.init_from`` directory that does not fit the recipe's drafter."""


def initialise_from(drafter: nn.Module, cfg: RecipeConfig) -> bool:
    """Copy ``cfg.drafter.init_from``'s weights into ``drafter``; False (nothing done) when the field is unset."""
    source = cfg.drafter.init_from
    if source is None:
        return False
    what = f"drafter.init_from = {source}"
    try:
        loaded = load_exported_drafter(source, target_path=cfg.target.path, check_target=False)
    except (OSError, ValueError, KeyError) as error:
        raise InitFromError(f"{what}: {error}") from None
    warm_start = kind_spec(cfg.drafter.kind).warm_start
    # A kind may start from another kind's drafter (DFlash2 from DFlash): its own extra tensors keep their init.
    other_kind = loaded.kind != cfg.drafter.kind
    if other_kind and (warm_start is None or loaded.kind not in warm_start.kinds):
        raise InitFromError(f"{what} holds a {loaded.kind} drafter, the recipe trains a {cfg.drafter.kind}")
    if other_kind and loaded.labels != cfg.drafter.labels:
        raise InitFromError(f"{what} was trained with {loaded.labels} labels, the recipe's drafter uses "
                            f"{cfg.drafter.labels} labels")
    if list(loaded.target_layer_ids) != list(cfg.target.layer_ids):
        raise InitFromError(f"{what} reads target layers {loaded.target_layer_ids}, the recipe's target.layer_ids "
                            f"are {list(cfg.target.layer_ids)}")
    wanted = {n: p for n, p in drafter.named_parameters() if p.requires_grad}
    wanted |= {n: b for n, b in drafter.named_buffers() if n in SAVED_BUFFERS}
    given = loaded.module.state_dict()
    if other_kind:
        wanted = {name: tensor for name, tensor in wanted.items() if not warm_start.keeps_init(name)}
    for name, tensor in wanted.items():
        if name not in given:
            raise InitFromError(f"{what} has no tensor {name} (the recipe's drafter differs: layers, Markov head, "
                                "confidence head?)")
        if tuple(given[name].shape) != tuple(tensor.shape):
            raise InitFromError(f"{what}: {name} is {tuple(given[name].shape)} there, {tuple(tensor.shape)} in the "
                                "recipe's drafter")
    with torch.no_grad():
        for name, tensor in wanted.items():
            tensor.copy_(given[name].to(dtype=tensor.dtype, device=tensor.device))
    get_logger(__name__).info("%s: loaded %d tensors (%s layout); optimizer fresh", what, len(wanted), loaded.source)
    return True
