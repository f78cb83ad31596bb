"""The attention mask a target's decoder layers get, built without reading a device value into Python.

Given a 2D padding mask, transformers decides whether a forward needs a mask at all by reading it (``sdpa`` skips
the mask and runs ``is_causal`` when no position is padded): one or two ``__bool__`` reads of a device tensor per
forward, each a host sync on a GPU. Without a mask it reads the position ids instead, looking for packed
sequences. The tap's caller already knows the answer on the host (the sequences' lengths), so ``layer_mask`` asks
transformers' own builder (``create_causal_mask``) for the mask of that answer with the arguments that make it
read nothing: no padding mask and no position ids when no position is padded (its result is then transformers'
result for an all-ones mask: None for ``sdpa``, the causal mask for ``eager``), and the padding mask with the
``is_causal`` skip turned off when some are (the skip would not be taken). Same mask, same values, same kernels:
the features do not change.

``TargetTap`` hands the mask to every decoder layer through a forward pre-hook and gives the decoder a 4D
placeholder, which transformers' own mask building returns as it is, reading nothing. That holds only where every
layer gets the one causal mask: ``builds_layer_masks`` says when (a dense-mask attention implementation, no
sliding-window or chunked layers); other targets keep transformers' own mask building.
"""

from __future__ import annotations

import inspect
from typing import Any, Optional

import torch
from transformers.masking_utils import create_causal_mask

# Attention implementations whose mask transformers builds as a dense tensor or None (flex builds a BlockMask,
# flash attention keeps the 2D mask and reads it itself).
DENSE_MASK_IMPLEMENTATIONS = ("sdpa", "eager")
FULL_ATTENTION = "full_attention"
# transformers 5's builder: (config, inputs_embeds, attention_mask, cache, ...) with the switch of the ``is_causal``
# skip; 4.x's takes a cache_position and has no switch, so its targets keep their own mask building.
_BUILDER_PARAMETERS = inspect.signature(create_causal_mask).parameters
BUILDER_TAKES_SKIP_SWITCH = ("allow_is_causal_skip" in _BUILDER_PARAMETERS
                             and "cache_position" not in _BUILDER_PARAMETERS)


def builds_layer_masks(config: Any) -> bool:
    """Whether ``layer_mask`` is what every decoder layer of a target with ``config`` gets: a dense-mask attention
    implementation and one causal mask for all layers (no sliding-window or chunked-attention layers)."""
    layer_types = getattr(config, "layer_types", None) or [FULL_ATTENTION]
    return (BUILDER_TAKES_SKIP_SWITCH
            and getattr(config, "_attn_implementation", None) in DENSE_MASK_IMPLEMENTATIONS
            and getattr(config, "sliding_window", None) is None
            and getattr(config, "attention_chunk_size", None) is None
            and set(layer_types) == {FULL_ATTENTION})


def layer_mask(config: Any, input_ids: torch.Tensor, embed_dtype: torch.dtype,
               padding: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
    """The mask transformers gives the decoder layers of a forward over ``input_ids`` (``[batch, seq]``) with the
    2D ``padding`` mask (None: no position padded), built on their device without a read (module docstring)."""
    batch, length = input_ids.shape
    # The builder reads only the batch size, query length, dtype and device of the embeddings.
    shape_only = torch.empty(batch, length, 0, dtype=embed_dtype, device=input_ids.device)
    if padding is None:
        return create_causal_mask(config, shape_only, None, None)
    return create_causal_mask(config, shape_only, padding.to(input_ids.device), None, allow_is_causal_skip=False)
