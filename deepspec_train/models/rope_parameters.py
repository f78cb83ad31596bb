"""A target's RoPE settings, read and checked without torch: ``normalized_rope_parameters`` turns a transformers 5
``rope_parameters`` dict, or the 4.x ``rope_theta`` + ``rope_scaling`` pair, of a config object or config.json
dict into one flat dict; ``check_rope_parameters`` refuses, with a one-line error, a type the drafter does not
implement exactly (``models.rope_scaling`` computes the frequencies of the supported ones) or a partial rotary
factor, before a drafter is built.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

SUPPORTED_ROPE_TYPES = ("default", "linear", "dynamic", "yarn", "llama3")
_REQUIRED = {"linear": ("factor",), "dynamic": ("factor",), "yarn": ("factor",),
             "llama3": ("factor", "low_freq_factor", "high_freq_factor")}
_ORIGINAL_LENGTH_TYPES = ("yarn", "llama3", "longrope")
GLOBAL_LAYER_TYPE = "full_attention"


def _get(config: Any, key: str) -> Any:
    return config.get(key) if isinstance(config, Mapping) else getattr(config, key, None)


def normalized_rope_parameters(hf_config: Any) -> dict[str, Any]:
    """The target's RoPE settings as one flat dict with ``rope_type`` and ``rope_theta`` (and, for the types
    that need it, ``original_max_position_embeddings``), from a config object or a config.json dict."""
    params = _get(hf_config, "rope_parameters") or _get(hf_config, "rope_scaling") or {}
    if not isinstance(params, Mapping):
        raise ValueError(f"target config rope_parameters = {params!r} is not a dict")
    # Gemma 3 keeps one RoPE per attention type; the drafter's layers attend globally, so they take the global
    # layers' settings (theta 1e6 with linear scaling, not the local layers' theta 10,000).
    if isinstance(params.get(GLOBAL_LAYER_TYPE), Mapping):
        params = params[GLOBAL_LAYER_TYPE]
    params = dict(params)
    legacy_type = params.pop("type", None)
    params.setdefault("rope_type", legacy_type or "default")
    if "rope_theta" not in params:
        theta = _get(hf_config, "rope_theta")
        if theta is None:
            raise ValueError("target config has neither rope_parameters['rope_theta'] nor rope_theta")
        params["rope_theta"] = theta
    params["rope_theta"] = float(params["rope_theta"])
    if params["rope_type"] in _ORIGINAL_LENGTH_TYPES:
        # transformers' standardisation: a top-level original_max_position_embeddings wins, else the model's.
        original = _get(hf_config, "original_max_position_embeddings") or _get(hf_config, "max_position_embeddings")
        params.setdefault("original_max_position_embeddings", original)
    return params


def check_rope_parameters(params: Mapping[str, Any]) -> None:
    """Refuse RoPE settings the drafter does not implement exactly (one-line ``ValueError``)."""
    rope_type = params.get("rope_type", "default")
    if rope_type not in SUPPORTED_ROPE_TYPES:
        raise ValueError(f"target rope_type {rope_type!r} is not implemented by the drafter; supported: "
                         f"{list(SUPPORTED_ROPE_TYPES)}")
    missing = [key for key in _REQUIRED.get(rope_type, ()) if params.get(key) is None]
    if rope_type == "yarn" and params.get("factor") is None and params.get("original_max_position_embeddings"):
        missing.remove("factor")
    if missing:
        raise ValueError(f"target rope_parameters of type {rope_type!r} lack {missing}")
    if params.get("partial_rotary_factor", 1.0) != 1.0:
        raise ValueError(f"target partial_rotary_factor {params['partial_rotary_factor']} is not implemented by the "
                         "drafter (it rotates whole heads)")
