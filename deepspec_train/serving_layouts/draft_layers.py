"""The drafter's decoder layers as a serving engine builds them from an export's config.json, and the config fields
the exporter writes so that vLLM 0.33 and SGLang 0.5.23 build the layers the project trained.

Every drafter here has Qwen3-style layers whatever the target family (``models/qwen3_layers.py``): RMSNorm with a
plain scale, q/k RMSNorm (block drafters), no biases, a SiLU-gated MLP, softmax scale ``head_dim ** -0.5``, and one
rotary embedding: the target's, for Gemma 3 its global layers'. The engines build these layers from the draft
config's fields, but they first parse that config with the transformers config class its ``model_type`` names,
and some model types change what is built (read in the engines' code):

- vLLM's speculative config rewrites a draft config of model type ``deepseek_v3`` (``kimi_k2`` is parsed with the
  same ``DeepseekV3Config``), ``deepseek_v32`` or ``glm_moe_dsa`` into a DeepSeek MTP draft (``DeepSeekMTPModel``)
  for every method; a DSpark then becomes its DeepSeek-V4 DSpark (``DSparkDraftModel``), not this drafter.
- The config class supplies the fields the file leaves out: ``Qwen3Config`` defaults ``head_dim`` to 128 (not
  hidden / heads), ``GptOssConfig`` ``attention_bias`` to true, ``DeepseekV3Config`` sets ``head_dim`` to
  ``qk_rope_head_dim``; ``Gemma3TextConfig`` has ``hidden_activation``, not ``hidden_act``.
- Both engines' layers read ``head_dim`` (absent: hidden / heads), ``attention_bias`` (true: q/k/v and o_proj
  biases; vLLM's loader then refuses an export without them, SGLang keeps them uninitialised), ``hidden_act``
  (``silu``; SGLang also takes ``swigluoai``), ``rms_norm_eps``, ``rope_parameters`` (one flat dict with
  ``rope_type``; vLLM's YaRN reads ``mscale`` / ``mscale_all_dim`` / ``truncate`` as transformers does),
  ``layer_types`` / ``sliding_window`` (sliding layers only) and, in SGLang, ``use_gemma_norm`` (a ``1 + w``
  RMSNorm). Neither reads Gemma's ``query_pre_attn_scalar``.
- A ``quantization_config`` (GPT-OSS's mxfp4, DeepSeek-V3's and Kimi-K2's fp8) makes both engines build quantized
  draft layers for the bf16 weights; an ``auto_map`` naming an ``AutoConfig`` makes a remote-code config loader
  look for a module the export does not have.
- Both engines share the target's stored embedding rows with the drafter; Gemma multiplies them by
  ``sqrt(hidden_size)`` outside its embedding module (vLLM ``gemma3.py``'s normalizer, SGLang's scaled embedding's
  forward), so a drafter trained on the scaled rows gets the unscaled ones.

``drafter_layer_fields`` is what the exporter writes (and ``TARGET_ONLY_FIELDS`` what it drops from the target's
config); ``layer_config_problems`` is the engines' reading of those fields, which ``deepspec export`` checks.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Optional

if TYPE_CHECKING:
    from deepspec_train.models.geometry import DrafterGeometry

# The model types the layouts write: Qwen3 for the block drafters (DeepSpec's and z-lab's releases), Llama for
# EAGLE-3 (SpecForge's); both parse as configs that build exactly the fields given.
QWEN3_MODEL_TYPE, LLAMA_MODEL_TYPE = "qwen3", "llama"
# Fields of a target's config.json that would change the drafter the engines build; the exporter drops them.
TARGET_ONLY_FIELDS = ("quantization_config", "auto_map", "rope_scaling")
# Model types vLLM's SpeculativeConfig.hf_config_override turns into a DeepSeek MTP draft.
VLLM_MTP_MODEL_TYPES = ("deepseek_v3", "kimi_k2", "deepseek_v32", "glm_moe_dsa")
SILU = "silu"
ENGINE_NAMES = {"vllm": "vLLM", "sglang": "SGLang"}


def drafter_layer_fields(geometry: "DrafterGeometry") -> dict[str, Any]:
    """The config fields the engines build the drafter's layers from, as the drafter has them (every one written,
    so no config class's default or derived value applies)."""
    return {
        "head_dim": geometry.head_dim,
        "attention_bias": False,
        "hidden_act": SILU,
        "rms_norm_eps": geometry.rms_norm_eps,
        "rope_theta": geometry.rope_theta,
        "rope_parameters": dict(geometry.rope_parameters),
    }


@dataclass(frozen=True)
class DraftConfigClass:
    """A transformers config class an engine parses a draft config with, as far as the drafter's layers go:
    ``head_dim`` is the value it ends up with for a config dict (explicit or its default)."""

    model_type: str
    head_dim: Callable[[Mapping[str, Any]], Optional[int]]


def _explicit_or(default: Callable[[Mapping[str, Any]], Optional[int]]) -> Callable[[Mapping[str, Any]], Optional[int]]:
    def head_dim(config: Mapping[str, Any]) -> Optional[int]:
        value = config.get("head_dim")
        return value if value is not None else default(config)

    return head_dim


def _hidden_over_heads(config: Mapping[str, Any]) -> Optional[int]:
    d, heads = config.get("hidden_size"), config.get("num_attention_heads")
    return d // heads if isinstance(d, int) and isinstance(heads, int) and heads else None


DRAFT_CONFIG_CLASSES = {
    QWEN3_MODEL_TYPE: DraftConfigClass(QWEN3_MODEL_TYPE, _explicit_or(lambda config: 128)),
    LLAMA_MODEL_TYPE: DraftConfigClass(LLAMA_MODEL_TYPE, _explicit_or(_hidden_over_heads)),
}
# vLLM's speculators reader sets the layer config's fields as they are, under its own config class.
RAW_FIELDS = DraftConfigClass("speculators", _explicit_or(_hidden_over_heads))


def _model_type_problem(engine: str, model_type: Any) -> Optional[str]:
    if engine == "vllm" and model_type in VLLM_MTP_MODEL_TYPES:
        return (f"model_type {model_type!r}: vLLM turns such a draft config into a DeepSeek MTP draft "
                "(DeepSeekMTPModel; for DSpark its DeepSeek-V4 DSparkDraftModel), not this drafter")
    if model_type not in DRAFT_CONFIG_CLASSES:
        return (f"model_type {model_type!r}: {ENGINE_NAMES[engine]} parses the draft config with that family's config class (its "
                f"defaults and derived fields, not the drafter's Qwen3-style layers); expected one of "
                f"{sorted(DRAFT_CONFIG_CLASSES)}")
    return None


def _query_rows(tensors: Mapping[str, Any]) -> Optional[int]:
    for name, tensor in tensors.items():
        if name.endswith("self_attn.q_proj.weight"):
            return int(tensor.shape[0])
    return None


def _has_attention_bias(tensors: Mapping[str, Any]) -> bool:
    return any(name.endswith("self_attn.q_proj.bias") for name in tensors)


def layer_config_problems(
    engine: str, config: Mapping[str, Any], tensors: Mapping[str, Any], config_class: Optional[DraftConfigClass] = None
) -> list[str]:
    """How ``engine`` would build the drafter's layers differently from the export's tensors, one line each.
    ``config``: the fields the layers are built from (the config, or a speculators ``transformer_layer_config``);
    ``config_class``: how they are parsed (None: by their ``model_type``)."""
    problems, name = [], ENGINE_NAMES[engine]
    if config_class is None:
        model_type = config.get("model_type")
        problem = _model_type_problem(engine, model_type)
        if problem is not None:
            return [problem]
        config_class = DRAFT_CONFIG_CLASSES[model_type]
    head_dim, heads, rows = config_class.head_dim(config), config.get("num_attention_heads"), _query_rows(tensors)
    if rows is not None and isinstance(heads, int) and isinstance(head_dim, int) and heads * head_dim != rows:
        problems.append(f"{name} builds head_dim {head_dim} ({heads} heads: {heads * head_dim} query rows), but the "
                        f"export's q_proj has {rows} rows")
    if config.get("attention_bias") and not _has_attention_bias(tensors):
        problems.append(f"attention_bias is true: {name} builds q/k/v/o biases the export does not have "
                        "(vLLM refuses the load, SGLang leaves them uninitialised)")
    if config.get("hidden_act", SILU) != SILU:
        problems.append(f"hidden_act {config.get('hidden_act')!r}: {name} builds that MLP activation, the "
                        "drafter's is silu")
    if config.get("quantization_config"):
        method = config["quantization_config"].get("quant_method", "?")
        problems.append(f"quantization_config ({method}): {name} builds quantized draft layers for the export's "
                        "unquantized weights")
    auto_map = config.get("auto_map")
    if isinstance(auto_map, Mapping) and "AutoConfig" in auto_map:
        problems.append(f"auto_map names an AutoConfig ({auto_map['AutoConfig']}): with trust_remote_code {name} "
                        "parses the draft config with a module the export does not have")
    rope = config.get("rope_parameters")
    if isinstance(rope, Mapping) and "rope_type" not in rope:
        problems.append(f"rope_parameters {sorted(rope)} is not one RoPE (rope_type missing, e.g. one per attention "
                        f"type): {name} reads one for every drafter layer")
    if engine == "sglang" and config.get("use_gemma_norm"):
        problems.append("use_gemma_norm is true: SGLang builds (1 + w) RMSNorms, the drafter's scale is w")
    return problems


def shared_embedding_problems(engine: str, embedding_scale: float) -> list[str]:
    """The engines give the drafter the target's stored embedding rows; a drafter of a target that scales them
    (Gemma: ``sqrt(hidden_size)``) was trained on the scaled ones."""
    if embedding_scale == 1.0:
        return []
    return [f"{ENGINE_NAMES[engine]} shares the target's stored embedding rows with the drafter, unscaled; the target multiplies "
            f"them by {embedding_scale:g} and the drafter was trained on the scaled rows"]
