"""The target families the project knows by name, one ``TargetFamily`` record each, and the lookup of a target's
family by what identifies it (its architecture, and config values and tokens where other model lines share it).

Engine facts (``EngineSupport``) were read in vLLM 0.33.0 and SGLang 0.5.23 as published on PyPI:

- vLLM captures tapped layers only for target classes implementing ``SupportsEagle3``; every one of them keeps
  the stream entering each listed layer (``_maybe_add_hidden_state(..., idx + 1, ...)`` in ``llama.py``,
  ``qwen3.py``, ``qwen3_moe.py``, ``gpt_oss.py``; ``deepseek_v2.py``, which also runs ``DeepseekV3ForCausalLM``,
  keeps it before layer ``idx``). Its ``gemma3.py`` ``Gemma3ForCausalLM`` implements no such interface.
- SGLang's DFLASH / DSPARK ask the target class for ``set_dflash_layers_to_capture`` (or
  ``set_dspark_layers_to_capture``) and refuse it without one (``attention_backend_setup.py``); every class that
  has it captures ``id + 1``. ``gemma3_causal.py`` has only ``set_eagle3_layers_to_capture``. The EAGLE-3 rule
  differs: ``+ 1`` for Qwen3 / Qwen2 / Llama / Gemma 3; for DeepSeek-V2/V3 ``+ 1`` only when the first id is 1;
  for GPT-OSS ``+ 1`` unless an id already equals the layer count.

Special ids were checked against the tokenizers' own code and metadata (docs/reference/target_families.md names the
sources): Llama 3's in Meta's ``llama-models`` tokenizer, Gemma 3's in ``google-deepmind/gemma``, GPT-OSS's in
tiktoken's ``o200k_harmony``, DeepSeek-V3's in its GGUF tokenizer metadata (control tokens end at 128814, 129,280 rows),
Kimi-K2's in its ``tokenization_kimi.py`` named tokens (163589 is one of the reserved slots).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any, Optional

from deepspec_train.families.records import (
    ALL_CAPTURES, EAGLE3_CAPTURE, EngineSupport, TargetFamily, plus_one, plus_one_unless_last_boundary,
    plus_one_when_first_is_one, sqrt_hidden_embedding_scale, vocabulary_only_split, widths_only_split,
)

VLLM_ALL = EngineSupport(ALL_CAPTURES, source="vLLM SupportsEagle3 target class: captures the stream entering id + 1")


def _sglang_all(rule=plus_one, where: str = "") -> EngineSupport:
    return EngineSupport(ALL_CAPTURES, rule, source=f"SGLang {where}: set_eagle3 / set_dflash_layers_to_capture")


QWEN3 = TargetFamily(
    name="qwen3",
    architectures=("Qwen3ForCausalLM",),
    models=("Qwen3-4B", "Qwen3-8B", "Qwen3-14B", "Qwen3-32B"),
    mask_token_id=151669,  # the first of the embedding rows past the tokenizer's 151,669 entries
    turn_end="<|im_end|>",
    chat_format="ChatML (<|im_start|>role ... <|im_end|>), an empty <think></think> block with thinking off",
    engines={"vllm": VLLM_ALL, "sglang": _sglang_all(where="qwen3.py")},
)

QWEN3_MOE = TargetFamily(
    name="qwen3-moe",
    architectures=("Qwen3MoeForCausalLM",),
    models=("Qwen3-30B-A3B", "Qwen3-235B-A22B"),
    mask_token_id=151669,
    turn_end="<|im_end|>",
    chat_format=QWEN3.chat_format,
    engines={"vllm": VLLM_ALL, "sglang": _sglang_all(where="qwen3_moe.py")},
)

QWEN2 = TargetFamily(
    name="qwen2",
    architectures=("Qwen2ForCausalLM",),
    models=(),
    mask_token_id=151665,  # Qwen2.5's tokenizer has 151,665 entries; the rows past them are unused
    turn_end="<|im_end|>",
    chat_format="ChatML",
    engines={"vllm": VLLM_ALL, "sglang": _sglang_all(where="qwen2.py")},
)

LLAMA3 = TargetFamily(
    name="llama3",
    architectures=("LlamaForCausalLM",),
    models=("Llama-3.1-8B-Instruct", "Llama-3.3-70B-Instruct"),
    # <|reserved_special_token_0|>: every one of the 128,256 rows is a token, so the mask is a reserved one.
    mask_token_id=128002,
    turn_end="<|eot_id|>",
    chat_format="<|begin_of_text|><|start_header_id|>role<|end_header_id|>\\n\\n ... <|eot_id|>",
    engines={"vllm": VLLM_ALL, "sglang": _sglang_all(where="llama.py")},
    # LlamaForCausalLM is also SmolLM2, TinyLlama, ...: only Llama 3's 128,256-row vocabulary (and, with a
    # tokenizer at hand, its header and turn tokens) makes a target Llama 3.
    config_facts={"vocab_size": 128256},
    identifying_tokens=("<|begin_of_text|>", "<|start_header_id|>", "<|eot_id|>"),
)

GEMMA3 = TargetFamily(
    name="gemma3",
    architectures=("Gemma3ForCausalLM",),
    models=("gemma-3-12b-it", "gemma-3-27b-it"),
    mask_token_id=4,  # Gemma's own <mask> token
    turn_end="<end_of_turn>",
    chat_format="<bos><start_of_turn>user\\n(system\\n\\n)... <end_of_turn>\\n<start_of_turn>model\\n ...",
    engines={
        "vllm": EngineSupport(frozenset(), refusal=(
            "vLLM 0.33's Gemma3ForCausalLM (gemma3.py) implements no SupportsEagle3, so it captures no target "
            "layers for any drafter")),
        "sglang": EngineSupport(frozenset({EAGLE3_CAPTURE}), plus_one, refusal=(
            "SGLang 0.5.23's Gemma3ForCausalLM (gemma3_causal.py) has no set_dflash_layers_to_capture: DFLASH and "
            "DSPARK refuse the target at start-up (EAGLE-3 only)")),
    },
    embedding_scale=sqrt_hidden_embedding_scale,
    notes=("the input embedding is embed_tokens.weight * sqrt(hidden_size) (in the weight's dtype): the drafter "
           "holds that product", "no final-logit soft-capping in Gemma 3's configs (Gemma 2 had 30.0)"),
)

GPT_OSS = TargetFamily(
    name="gpt-oss",
    architectures=("GptOssForCausalLM",),
    models=("gpt-oss-20b", "gpt-oss-120b"),
    mask_token_id=200000,  # <|reserved_200000|>, a reserved id of o200k_harmony
    turn_end="<|end|>",
    chat_format="harmony: <|start|>role<|message|>...<|end|>; assistant turns <|channel|>analysis|final<|message|>",
    engines={"vllm": VLLM_ALL,
             "sglang": _sglang_all(plus_one_unless_last_boundary, where="gpt_oss.py")},
    tp_split=vocabulary_only_split,
    notes=("transformers' TP plan splits only the embedding: a TP group replicates attention and experts",),
)

DEEPSEEK_V3 = TargetFamily(
    name="deepseek-v3",
    architectures=("DeepseekV3ForCausalLM", "DeepseekV2ForCausalLM"),
    models=("DeepSeek-V3", "Kimi-K2-Instruct"),
    # DeepSeek-V3: the first row past the tokenizer's 128,815 entries. Kimi-K2 recipes override it with a
    # reserved id of its own tokenizer (163589): the family's tokenizers differ, the architecture does not.
    mask_token_id=128815,
    turn_end="<｜end▁of▁sentence｜>",
    chat_format="<｜begin▁of▁sentence｜>system<｜User｜>...<｜Assistant｜>...<｜end▁of▁sentence｜> (Kimi-K2: "
                "<|im_user|>user<|im_middle|>...<|im_end|>)",
    engines={"vllm": VLLM_ALL,
             "sglang": _sglang_all(plus_one_when_first_is_one, where="deepseek_v2.py")},
    tp_split=widths_only_split,
    notes=("MLA attention has no TP rule in transformers' plan (replicated); dense, shared and routed expert "
           "widths split",),
)

FAMILIES: tuple[TargetFamily, ...] = (QWEN3, QWEN3_MOE, QWEN2, LLAMA3, GEMMA3, GPT_OSS, DEEPSEEK_V3)
# The serving engines' facts belong to the target's model class, which a family shares with any other model line
# of its architecture (vLLM and SGLang serve SmolLM2 with the LlamaForCausalLM class they serve Llama 3 with).
_ENGINES_BY_ARCHITECTURE = {arch: family.engines for family in FAMILIES for arch in family.architectures}


def architecture_of(target_config: Mapping[str, Any]) -> str:
    """The first entry of a config.json's ``architectures`` (``""`` when it has none)."""
    archs = target_config.get("architectures") or [""]
    return str(archs[0])


def family_of(target_config: Mapping[str, Any], vocabulary: Optional[Collection[str]] = None) -> TargetFamily | None:
    """The family of the target whose config.json is ``target_config`` (and whose tokenizer holds ``vocabulary``,
    when given), matched by what identifies it (``TargetFamily.identifies``), never by class name alone; None for
    a target no record identifies (it trains with the rules of ``families.own_tokens`` or explicit settings)."""
    return next((family for family in FAMILIES if family.identifies(target_config, vocabulary)), None)


def engines_of(target_config: Mapping[str, Any]) -> Mapping[str, EngineSupport] | None:
    """What each serving engine captures for the target's model class (None for a class no record covers)."""
    return _ENGINES_BY_ARCHITECTURE.get(architecture_of(target_config))
