"""The dtypes a run packs (and streams) target features in: the drafter's compute dtype, wherever casting to it
early provably changes nothing the drafter computes.

With ``train.mixed_precision: bf16`` on CUDA the drafter computes in bf16, and the two target features reach
bf16 through one rounding whatever dtype they arrive in:

- ``ctx_features`` (the tapped layers): their only reader is ``fc`` (which reads them as they come under autocast
  and cast to its weight dtype otherwise). Under autocast (DDP, fp32 weights) the linear rounds its input to bf16;
  with DeepSpeed's bf16 module the cast to the bf16 weights does. Rounding fp32 to bf16 on the target side instead, then widening
  to fp32 (exact) and rounding again (a no-op), gives the same bf16 values: cast, for both engines.
- ``target_hidden`` (final-norm states): the loss reads them once, as ``target_hidden @ W_t`` with the frozen
  target head. Under autocast that matmul rounds both operands to bf16, so the early cast is the same: cast with
  DDP. DeepSpeed's bf16 runs no autocast: the target logits are computed in ``W_t``'s dtype (fp32 for an fp32
  target), and bf16 inputs would change them (and mismatch the head's dtype): kept as the target made them.

Everything else (a CPU run, ``mixed_precision: no``) computes in fp32: features keep the target's dtype. A
cast applies only where it narrows (``FeatureDtypes.apply``), so a bf16 target sends what it always sent; the
win is an fp32 target (``target.dtype: float32``), whose features then cross the wire at half the bytes. Tests:
``tests/test_feature_dtypes.py`` (loss and gradients equal, bit for bit, with cast and uncast inputs under bf16
autocast; the DeepSpeed case where casting ``target_hidden`` would differ). A streamed run's target workers
decide with their own device, the drafters' device type in one launch.
"""

from __future__ import annotations

import torch

from deepspec_train.config.schema import RecipeConfig
from deepspec_train.steps.chunk_builder import FeatureDtypes
from deepspec_train.training.deepspeed_engine import uses_bf16


def feature_dtypes(cfg: RecipeConfig, device: torch.device) -> FeatureDtypes:
    """The feature dtypes of a run of ``cfg`` whose drafter computes on ``device`` (see the module docstring)."""
    if not uses_bf16(cfg, device):
        return FeatureDtypes()
    autocast = cfg.train.distributed == "ddp"
    return FeatureDtypes(ctx_features=torch.bfloat16, target_hidden=torch.bfloat16 if autocast else None)
