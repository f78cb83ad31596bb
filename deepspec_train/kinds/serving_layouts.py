"""What each serving layout must contain, and the one validation that exporter and loader both run.

Three layouts, each the format a serving engine loads (vLLM 0.33, SGLang 0.5.23):

- ``dspark``: DeepSpec's release layout (``Qwen3DSparkModel``), read by vLLM and SGLang. Also the layout of a
  DFlash trained with DSpark labels (``markov_rank 0``, no confidence head). ``markov_head_type`` is
  ``vanilla`` (both engines), ``gated`` (adds ``markov_head.gate_proj.{weight [r, d + r], bias [r]}``) or
  ``rnn`` (adds ``markov_head.joint_proj.{weight [3r, 2r + d], bias [3r]}``); the last two only SGLang serves.
  Our addition: an optional ``confidence_temperatures`` list (one calibrated temperature per block position, written by
  ``deepspec calibrate``; no engine reads it: SGLang takes temperatures from its STS file, absent means 1.0).
- ``zlab-dflash``: z-lab's ``DFlashDraftModel``; only for a DFlash trained with z-lab labels.
- ``eagle3``: SGLang's ``LlamaForCausalLMEagle3``; the draft-vocabulary maps ``d2t`` / ``t2d`` only for a
  reduced draft vocabulary. Our additions, ignored by engines: ``block_size`` (TTT steps) and
  ``num_target_layers``.

``validate_layout(layout, config, tensors)`` checks a config dict and a name -> tensor (or ``TensorSpec``) map
against the layout: every required config field with a usable value, every required tensor with the shape the
config implies and the right dtype family, no unexpected tensor (a wrapper prefix such as ``model.`` shows up as
missing + unexpected). It raises ``LayoutError`` listing every problem, so an export is never half right. What
each engine then makes of a valid checkpoint (which layers it captures, which tensors it refuses) is
``engine_rules``' business.

Layer ids. Our ``target_layer_ids`` are 0-indexed decoder layers: id ``k`` is the output of decoder layer ``k``,
which is transformers' ``hidden_states[k + 1]`` (``hidden_states[0]`` is the embedding output). DSpark and
z-lab DFlash configs use the same convention, so their ids are written unchanged (both engines add 1 inside).
EAGLE-3 configs carry two fields in two conventions: the top-level ``eagle_aux_hidden_state_layer_ids``, read
first by vLLM, holds hidden-state indices (vLLM captures the state entering layer ``L`` = ``hidden_states[L]``),
so ours + 1 (``vllm_eagle3_layer_ids``); ``eagle_config.eagle_aux_hidden_state_layer_ids``, the only field
SGLang reads, holds decoder-layer ids for Qwen3 / Llama / Qwen2 targets (SGLang captures before layer
``id + 1``), so ours unchanged.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, NamedTuple

import torch

LAYOUTS = ("dspark", "zlab-dflash", "eagle3")
ARCHITECTURES = {
    "dspark": "Qwen3DSparkModel",
    "zlab-dflash": "DFlashDraftModel",
    "eagle3": "LlamaForCausalLMEagle3",
}
# DeepSpec's Markov head forms (``markov_head_type``); which engine serves which is ``export.engine_rules``'.
MARKOV_HEAD_TYPES = ("vanilla", "gated", "rnn")
# Tensors of the drafter module that a layout does not store: the serving engine uses the target's own.
OMITTED_TENSORS = {
    "dspark": (),
    "zlab-dflash": ("embed_tokens.weight", "lm_head.weight"),
    "eagle3": ("embed_tokens.weight",),
}
FLOAT = "floating point"


class LayoutError(ValueError):
    """An export (or an export plan) that does not match its layout; ``problems`` lists every mismatch."""

    def __init__(self, layout: str, problems: list[str]) -> None:
        self.layout = layout
        self.problems = list(problems)
        super().__init__(f"{layout} layout: " + "; ".join(self.problems))


class TensorSpec(NamedTuple):
    """Shape and dtype of a tensor, enough to validate a checkpoint without reading its data."""

    shape: tuple[int, ...]
    dtype: torch.dtype


def spec_of(tensor: torch.Tensor | TensorSpec) -> TensorSpec:
    if isinstance(tensor, TensorSpec):
        return tensor
    return TensorSpec(tuple(int(n) for n in tensor.shape), tensor.dtype)


def layout_of_config(config: Mapping[str, Any]) -> str:
    """The layout an exported config.json is in, from its ``architectures``."""
    archs = config.get("architectures") or []
    for layout, arch in ARCHITECTURES.items():
        if arch in archs:
            return layout
    raise LayoutError("unknown", [f"architectures {archs} is none of {sorted(ARCHITECTURES.values())}"])


def vllm_eagle3_layer_ids(layer_ids: list[int]) -> list[int]:
    """Our decoder-layer ids -> the top-level EAGLE-3 field vLLM reads (hidden-state indices, ``k -> k + 1``)."""
    return [int(k) + 1 for k in layer_ids]


def layer_ids_from_eagle3_config(config: Mapping[str, Any]) -> list[int]:
    """Our decoder-layer ids from an EAGLE-3 config: ``eagle_config``'s ids (already ours), else the top-level
    hidden-state indices minus 1."""
    eagle = config.get("eagle_config")
    if isinstance(eagle, Mapping) and "eagle_aux_hidden_state_layer_ids" in eagle:
        return [int(i) for i in eagle["eagle_aux_hidden_state_layer_ids"]]
    return [int(i) - 1 for i in config["eagle_aux_hidden_state_layer_ids"]]


class _ConfigCheck:
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


class _Geometry(NamedTuple):
    d: int
    inter: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int


def _geometry(check: _ConfigCheck) -> _Geometry | None:
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
    return _Geometry(*values) if all(v is not None for v in values) else None


def _decoder_layer_tensors(prefix: str, g: _Geometry, attn_in: int, qk_norm: bool) -> dict[str, TensorSpec]:
    """One Qwen3/Llama decoder layer; ``attn_in`` is the attention input width (2d for EAGLE-3)."""
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


def _parallel_backbone(g: _Geometry, num_layers: int, num_taps: int) -> dict[str, TensorSpec]:
    f = torch.float32
    tensors = {
        "fc.weight": TensorSpec((g.d, num_taps * g.d), f),
        "hidden_norm.weight": TensorSpec((g.d,), f),
        "norm.weight": TensorSpec((g.d,), f),
    }
    for i in range(num_layers):
        tensors.update(_decoder_layer_tensors(f"layers.{i}.", g, g.d, qk_norm=True))
    return tensors


def _check_temperatures(check: _ConfigCheck, block_size: int | None, confidence: bool | None) -> None:
    temps = check.config.get("confidence_temperatures")
    if temps is None:
        return
    ok = isinstance(temps, list) and all(
        isinstance(t, (int, float)) and not isinstance(t, bool) and math.isfinite(t) and t > 0 for t in temps
    )
    if not ok:
        check.problems.append(f"confidence_temperatures = {temps!r} is not a list of positive numbers")
    elif block_size is not None and len(temps) != block_size:
        check.problems.append(f"confidence_temperatures has {len(temps)} entries, block_size is {block_size}")
    if confidence is False:
        check.problems.append("confidence_temperatures given but enable_confidence_head is false")


def _mask_in_vocab(
    check: _ConfigCheck, key: str, vocab: int | None, source: Mapping[str, Any] | None = None, where: str = ""
) -> None:
    value = check.integer(key, 0, source, where)
    if value is not None and vocab is not None and value >= vocab:
        check.problems.append(f"config field {where}{key} = {value} is outside the vocabulary ({vocab})")


def _dspark(check: _ConfigCheck) -> dict[str, TensorSpec] | None:
    g = _geometry(check)
    num_layers = check.integer("num_hidden_layers", 1)
    num_target = check.integer("num_target_layers", 1)
    block_size = check.integer("block_size", 1)
    check.integer("num_anchors", 1)
    check.equals("tie_word_embeddings", False)
    head_type = check.config.get("markov_head_type")
    if "markov_head_type" not in check.config:
        check.problems.append("config field markov_head_type is missing")
    elif head_type not in MARKOV_HEAD_TYPES:
        check.problems.append(f"config field markov_head_type = {head_type!r} is not one of {list(MARKOV_HEAD_TYPES)}")
    if num_layers is not None:
        check.equals("layer_types", ["full_attention"] * num_layers)
    _mask_in_vocab(check, "mask_token_id", None if g is None else g.vocab)
    layer_ids = check.id_list("target_layer_ids", 0, num_target)
    rank = check.integer("markov_rank", 0)
    confidence = check.boolean("enable_confidence_head")
    with_markov = check.boolean("confidence_head_with_markov")
    _check_temperatures(check, block_size, confidence)
    if None in (g, num_layers, layer_ids, rank, confidence, with_markov):
        return None
    tensors = _parallel_backbone(g, num_layers, len(layer_ids))
    f = torch.float32
    tensors["embed_tokens.weight"] = TensorSpec((g.vocab, g.d), f)
    tensors["lm_head.weight"] = TensorSpec((g.vocab, g.d), f)
    if rank > 0:
        tensors["markov_head.markov_w1.weight"] = TensorSpec((g.vocab, rank), f)
        tensors["markov_head.markov_w2.weight"] = TensorSpec((g.vocab, rank), f)
        if head_type == "gated":
            tensors["markov_head.gate_proj.weight"] = TensorSpec((rank, g.d + rank), f)
            tensors["markov_head.gate_proj.bias"] = TensorSpec((rank,), f)
        elif head_type == "rnn":
            tensors["markov_head.joint_proj.weight"] = TensorSpec((3 * rank, 2 * rank + g.d), f)
            tensors["markov_head.joint_proj.bias"] = TensorSpec((3 * rank,), f)
    elif head_type in MARKOV_HEAD_TYPES and head_type != "vanilla":
        check.problems.append(f"markov_head_type {head_type} needs markov_rank > 0")
    if confidence:
        tensors["confidence_head.proj.weight"] = TensorSpec((1, g.d + (rank if with_markov else 0)), f)
        tensors["confidence_head.proj.bias"] = TensorSpec((1,), f)
    return tensors


def _zlab_dflash(check: _ConfigCheck) -> dict[str, TensorSpec] | None:
    g = _geometry(check)
    check.equals("model_type", "qwen3")
    num_layers = check.integer("num_hidden_layers", 1)
    num_target = check.integer("num_target_layers", 1)
    # z-lab blocks draft B-1 tokens: a block of 1 drafts nothing.
    check.integer("block_size", 2)
    if num_layers is not None:
        check.equals("layer_types", ["full_attention"] * num_layers)
    dflash = check.mapping("dflash_config")
    layer_ids = None
    if dflash is not None:
        _mask_in_vocab(check, "mask_token_id", None if g is None else g.vocab, dflash, "dflash_config.")
        layer_ids = check.id_list("target_layer_ids", 0, num_target, dflash, "dflash_config.")
    if None in (g, num_layers, layer_ids):
        return None
    return _parallel_backbone(g, num_layers, len(layer_ids))


def _eagle3(check: _ConfigCheck) -> dict[str, TensorSpec] | None:
    g = _geometry(check)
    check.equals("model_type", "llama")
    check.equals("num_hidden_layers", 1)
    check.equals("tie_word_embeddings", False)
    check.number("rope_theta")
    num_target = check.config.get("num_target_layers")
    if num_target is not None:
        num_target = check.integer("num_target_layers", 1)
    if "block_size" in check.config:
        check.integer("block_size", 1)
    draft_vocab = check.integer("draft_vocab_size", 1)
    if g is not None and draft_vocab is not None and draft_vocab > g.vocab:
        check.problems.append(f"draft_vocab_size {draft_vocab} exceeds vocab_size {g.vocab}")
    if g is not None and "target_hidden_size" in check.config:
        check.equals("target_hidden_size", g.d)
    eagle = check.mapping("eagle_config")
    # Our ids are decoder layers 0..L-2 (the last layer's output enters no layer, so no engine captures it).
    top = check.id_list("eagle_aux_hidden_state_layer_ids", 1, num_target)
    ours = None
    if eagle is not None:
        check.equals("use_aux_hidden_state", True, eagle, "eagle_config.")
        high = None if num_target is None else num_target - 1
        ours = check.id_list("eagle_aux_hidden_state_layer_ids", 0, high, eagle, "eagle_config.")
    if top is not None:
        if len(top) != 3:
            check.problems.append(f"eagle_aux_hidden_state_layer_ids {top} must name 3 hidden states")
        if ours is not None and top != vllm_eagle3_layer_ids(ours):
            check.problems.append(
                f"eagle_config.eagle_aux_hidden_state_layer_ids {ours} must be the top-level ids {top} minus 1 "
                "(eagle_config holds decoder-layer ids for SGLang, the top level hidden-state indices for vLLM)"
            )
    if None in (g, draft_vocab, top):
        return None
    f = torch.float32
    tensors = _decoder_layer_tensors("midlayer.", g, 2 * g.d, qk_norm=False)
    tensors.update(
        {
            "midlayer.hidden_norm.weight": TensorSpec((g.d,), f),
            "fc.weight": TensorSpec((g.d, len(top) * g.d), f),
            "norm.weight": TensorSpec((g.d,), f),
            "lm_head.weight": TensorSpec((draft_vocab, g.d), f),
        }
    )
    # A full draft vocabulary is the identity map: no maps (vLLM has no parameter to load a d2t into then).
    if draft_vocab < g.vocab:
        tensors["d2t"] = TensorSpec((draft_vocab,), torch.int64)
        tensors["t2d"] = TensorSpec((g.vocab,), torch.bool)
    return tensors


_CHECKS = {"dspark": _dspark, "zlab-dflash": _zlab_dflash, "eagle3": _eagle3}


def expected_tensors(layout: str, config: Mapping[str, Any]) -> dict[str, TensorSpec]:
    """Name -> required shape/dtype for ``config`` in ``layout`` (float dtypes stand for any floating dtype).

    Raises ``LayoutError`` when the config itself is incomplete."""
    if layout not in _CHECKS:
        raise ValueError(f"unknown layout {layout!r}; choose one of {LAYOUTS}")
    check = _ConfigCheck(config)
    check.equals("architectures", [ARCHITECTURES[layout]])
    tensors = _CHECKS[layout](check)
    if check.problems or tensors is None:
        raise LayoutError(layout, check.problems or ["config incomplete"])
    return tensors


def _dtype_family_ok(expected: torch.dtype, got: torch.dtype) -> bool:
    if expected.is_floating_point:
        return got.is_floating_point
    return got == expected


def validate_layout(
    layout: str, config: Mapping[str, Any], tensors: Mapping[str, torch.Tensor | TensorSpec]
) -> None:
    """Raise ``LayoutError`` unless ``config`` and ``tensors`` form a complete, well-shaped ``layout`` checkpoint."""
    expected = expected_tensors(layout, config)
    got = {name: spec_of(t) for name, t in tensors.items()}
    problems = [f"tensor {name} is missing" for name in sorted(expected.keys() - got.keys())]
    problems += [f"unexpected tensor {name}" for name in sorted(got.keys() - expected.keys())]
    for name in sorted(expected.keys() & got.keys()):
        want, have = expected[name], got[name]
        if want.shape != have.shape:
            problems.append(f"tensor {name} has shape {list(have.shape)}, expected {list(want.shape)}")
        if not _dtype_family_ok(want.dtype, have.dtype):
            kind = FLOAT if want.dtype.is_floating_point else str(want.dtype)
            problems.append(f"tensor {name} has dtype {have.dtype}, expected {kind}")
    if problems:
        raise LayoutError(layout, problems)


def check_draft_vocab(d2t: torch.Tensor, t2d: torch.Tensor) -> None:
    """The EAGLE-3 maps agree: ``d2t[i] + i`` are increasing target ids, exactly the ones ``t2d`` marks."""
    target_ids = torch.arange(d2t.shape[0], dtype=torch.long) + d2t.long().cpu()
    members = t2d.bool().cpu()
    problems = []
    if target_ids.numel() and (int(target_ids.min()) < 0 or int(target_ids.max()) >= members.shape[0]):
        problems.append("d2t maps draft ids outside the target vocabulary")
    elif bool((target_ids[1:] <= target_ids[:-1]).any()):
        problems.append("d2t target ids are not strictly increasing")
    elif int(members.sum()) != target_ids.numel() or not bool(members[target_ids].all()):
        problems.append("t2d does not mark exactly the target ids that d2t maps to")
    if problems:
        raise LayoutError("eagle3", problems)
