"""``drafter.compile``: torch.compile each drafter block, once, before training.

A block is what repeats inside the drafter and carries most of its FLOPs: a DSpark / DFlash backbone layer, an
EAGLE-3 test-time-training step. Compiling them one by one (rather than the whole drafter) keeps each graph
small, compiles the block once for all layers of the same shape, and leaves the packing-dependent parts (masks,
gathers of supervised rows) eager, where their changing shapes would force recompiles. Each drafter module says
what its blocks are (``compile_blocks``); parameter names and checkpoints are unchanged. Default: on with CUDA,
off on CPU, where inductor's C++ build costs more than it saves on the tiny drafters the tests train.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import nn


def compile_enabled(setting: Optional[bool], device: torch.device) -> bool:
    """``drafter.compile`` resolved for ``device`` (None: on with CUDA only)."""
    return device.type == "cuda" if setting is None else bool(setting)


def compile_blocks(drafter: nn.Module, setting: Optional[bool], device: torch.device) -> bool:
    """Compile ``drafter``'s blocks in place when ``setting`` resolves to on; whether it did."""
    if not compile_enabled(setting, device):
        return False
    drafter.compile_blocks()
    return True
