"""Reading a layout's config.json field by field, and the tensor lists the layouts share.

``TensorSpec`` is a tensor's shape and dtype, what a layout requires of each tensor (read from a safetensors header
or a module on the meta device, no data needed). ``ConfigCheck`` reads required fields of a config dict and collects
one line per problem (missing, wrong type, out of range) instead of stopping at the first, so an export is refused
with everything wrong in it. The layout records (``serving_layouts/*_layout.py``) use it in their ``check``;
``config_geometry`` reads the target geometry every layout repeats, ``decoder_layer_tensors`` / ``parallel_backbone``
are the tensors of a Qwen3 / Llama decoder layer and of the DSpark / DFlash backbone (names and shapes:
docs/reference/file_formats.md).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, NamedTuple

from deepspec_train.common.errors import UserError

if TYPE_CHECKING:
    import torch


class PublishedDrafterError(UserError, ValueError):
    """A drafter directory that cannot be read, or that does not fit the target it is used with."""


class TensorSpec(NamedTuple):
    """Shape and dtype of a tensor, enough to validate a checkpoint without reading its data."""

    shape: tuple[int, ...]
    dtype: torch.dtype


class ConfigCheck:
    """Collects problems while reading required fields of a config dict."""

    def __init__(self, config: Mapping[str, Any]) -> None:
        self.config = config
        self.problems: list[str] = []

    def _get(self, key: str, source: Mapping[str, Any] | None, where: str) -> tuple[bool, Any]:
        source = self.config if source is None else source
        if key not in source:
            self.problems.append(f"config field {where}{key} is missing")
            return False, None
        return True, source[key]

    def integer(
        self, key: str, minimum: int = 0, source: Mapping[str, Any] | None = None, where: str = ""
    ) -> int | None:
        found, value = self._get(key, source, where)
        if not found:
            return None
        # bool is an int subclass in Python; a `true` where a size belongs is still an error.
        if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
            self.problems.append(f"config field {where}{key} = {value!r} is not an integer >= {minimum}")
            return None
        return value

    def number(self, key: str) -> float | None:
        found, value = self._get(key, None, "")
        if not found:
            return None
        if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value) or value <= 0:
            self.problems.append(f"config field {key} = {value!r} is not a positive number")
            return None
        return float(value)

    def boolean(self, key: str) -> bool | None:
        found, value = self._get(key, None, "")
        if found and not isinstance(value, bool):
            self.problems.append(f"config field {key} = {value!r} is not a boolean")
            return None
        return value

    def equals(self, key: str, expected: Any, source: Mapping[str, Any] | None = None, where: str = "") -> None:
        found, value = self._get(key, source, where)
        if found and value != expected:
            self.problems.append(f"config field {where}{key} = {value!r}, expected {expected!r}")

    def mapping(self, key: str) -> Mapping[str, Any] | None:
        found, value = self._get(key, None, "")
        if found and not isinstance(value, Mapping):
            self.problems.append(f"config field {key} is not an object")
            return None
        return value

    def id_list(
        self, key: str, low: int, high: int | None, source: Mapping[str, Any] | None = None, where: str = ""
    ) -> list[int] | None:
        """A non-empty list of ints in ``[low, high)`` (``high`` None: unbounded)."""
        found, value = self._get(key, source, where)
        if not found:
            return None
        ok = isinstance(value, list) and len(value) > 0 and all(
            isinstance(i, int) and not isinstance(i, bool) and i >= low and (high is None or i < high) for i in value
        )
        if not ok:
            bound = f"[{low}, {high})" if high is not None else f">= {low}"
            self.problems.append(f"config field {where}{key} = {value!r} is not a non-empty list of ints in {bound}")
            return None
        return list(value)

    def rope_theta(self) -> None:
        params = self.config.get("rope_parameters")
        if isinstance(params, Mapping) and "rope_theta" in params:
            return
        self.number("rope_theta")


class Geometry(NamedTuple):
    """The target geometry a layout's config repeats (hidden, MLP, heads, KV heads, head dim, vocabulary)."""

    d: int
    inter: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int


def config_geometry(check: ConfigCheck) -> Geometry | None:
    """The geometry fields of the config (None when one is missing or unusable; ``check`` says which)."""
    d = check.integer("hidden_size", 1)
    inter = check.integer("intermediate_size", 1)
    heads = check.integer("num_attention_heads", 1)
    kv_heads = check.integer("num_key_value_heads", 1)
    vocab = check.integer("vocab_size", 1)
    check.integer("max_position_embeddings", 1)
    check.number("rms_norm_eps")
    check.rope_theta()
    head_dim = check.config.get("head_dim")
    if head_dim is None and d and heads:
        head_dim = d // heads
    elif head_dim is not None:
        head_dim = check.integer("head_dim", 1)
    if heads and kv_heads and heads % kv_heads:
        check.problems.append(f"num_attention_heads {heads} is not a multiple of num_key_value_heads {kv_heads}")
    values = (d, inter, heads, kv_heads, head_dim, vocab)
    return Geometry(*values) if all(v is not None for v in values) else None


def decoder_layer_tensors(prefix: str, g: Geometry, attn_in: int, qk_norm: bool) -> dict[str, TensorSpec]:
    """One Qwen3/Llama decoder layer; ``attn_in`` is the attention input width (2d for EAGLE-3)."""
    import torch

    f = torch.float32
    shapes = {
        "input_layernorm.weight": (g.d,),
        "post_attention_layernorm.weight": (g.d,),
        "self_attn.q_proj.weight": (g.heads * g.head_dim, attn_in),
        "self_attn.k_proj.weight": (g.kv_heads * g.head_dim, attn_in),
        "self_attn.v_proj.weight": (g.kv_heads * g.head_dim, attn_in),
        "self_attn.o_proj.weight": (g.d, g.heads * g.head_dim),
        "mlp.gate_proj.weight": (g.inter, g.d),
        "mlp.up_proj.weight": (g.inter, g.d),
        "mlp.down_proj.weight": (g.d, g.inter),
    }
    if qk_norm:
        shapes["self_attn.q_norm.weight"] = (g.head_dim,)
        shapes["self_attn.k_norm.weight"] = (g.head_dim,)
    return {prefix + name: TensorSpec(shape, f) for name, shape in shapes.items()}


def parallel_backbone(g: Geometry, num_layers: int, num_taps: int) -> dict[str, TensorSpec]:
    """The DSpark / DFlash backbone: ``fc`` over ``num_taps`` target layers, its norms and ``num_layers`` layers."""
    import torch

    f = torch.float32
    tensors = {
        "fc.weight": TensorSpec((g.d, num_taps * g.d), f),
        "hidden_norm.weight": TensorSpec((g.d,), f),
        "norm.weight": TensorSpec((g.d,), f),
    }
    for i in range(num_layers):
        tensors.update(decoder_layer_tensors(f"layers.{i}.", g, g.d, qk_norm=True))
    return tensors


def mask_in_vocab(
    check: ConfigCheck, key: str, vocab: int | None, source: Mapping[str, Any] | None = None, where: str = ""
) -> None:
    """Reads ``key`` as a token id inside the ``vocab``-token vocabulary."""
    value = check.integer(key, 0, source, where)
    if value is not None and vocab is not None and value >= vocab:
        check.problems.append(f"config field {where}{key} = {value} is outside the vocabulary ({vocab})")
