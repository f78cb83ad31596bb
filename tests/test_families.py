"""The target-family records: every production recipe's taps follow the one rule, the published configs keep the
facts the records and recipes rely on (layer counts, vocabularies, special ids, windows, experts), the engine
facts per architecture are the ones read in vLLM 0.33 / SGLang 0.5.23, and the TP split fields are the plans'.
"""

from __future__ import annotations

import pytest

from deepspec_train.config.rules import tensor_parallel_problems
from deepspec_train.families.catalog import DEEPSEEK_V3, FAMILIES, GEMMA3, GPT_OSS, LLAMA3, QWEN3, family_of
from deepspec_train.families.records import (
    ALL_CAPTURES, BLOCK_CAPTURE, EAGLE3_CAPTURE, dspark_layer_ids, eagle3_layer_ids, plus_one, plus_one_unless_last_boundary,
    plus_one_when_first_is_one,
)
from deepspec_train.models.family_configs import family_reference_configs
from deepspec_train.models.reference_configs import REFERENCE_LAYER_IDS, reference_configs
from deepspec_train.costs.reference_targets import FAMILY_RECIPES, reference_target_config
from deepspec_train.kinds.recipe_validation import load_recipe
from tests.helpers import family_tokenizers


@pytest.mark.parametrize("recipe", FAMILY_RECIPES)
def test_family_recipes_tap_by_the_qwen3_rule_and_use_the_family_mask(recipe: str) -> None:
    cfg = load_recipe(recipe, check_target=False)
    config = reference_target_config(cfg)
    family = family_of(config.to_dict())
    assert family is not None and type(config).__name__ != "Qwen3Config"
    layers = config.num_hidden_layers
    eagle3 = cfg.drafter.kind == "eagle3"
    assert cfg.target.layer_ids == family.layer_ids(layers, eagle3=eagle3)
    if not eagle3 and recipe != "kimi-k2":
        assert cfg.drafter.mask_token_id == family.mask_token_id
    assert cfg.drafter.mask_token_id < config.vocab_size


def test_the_rule_reproduces_the_qwen3_taps() -> None:
    for name, ids in REFERENCE_LAYER_IDS.items():
        assert dspark_layer_ids(reference_configs()[name].num_hidden_layers) == ids
    assert eagle3_layer_ids(36) == [1, 17, 32] and eagle3_layer_ids(32) == [1, 15, 28]


def test_published_configs_keep_the_family_facts() -> None:
    c = family_reference_configs()
    assert [c[n].num_hidden_layers for n in ("Llama-3.1-8B-Instruct", "Llama-3.3-70B-Instruct", "gemma-3-12b-it",
                                             "gemma-3-27b-it", "gpt-oss-20b", "gpt-oss-120b", "DeepSeek-V3",
                                             "Kimi-K2-Instruct")] == [32, 80, 48, 62, 24, 36, 61, 61]
    assert {c[n].vocab_size for n in ("Llama-3.1-8B-Instruct", "Llama-3.3-70B-Instruct")} == {128256}
    assert c["Llama-3.1-8B-Instruct"].rope_parameters["rope_type"] == "llama3"
    gemma = c["gemma-3-27b-it"]
    assert gemma.layer_types.count("full_attention") == 10 and gemma.sliding_window == 1024
    assert gemma.tie_word_embeddings and gemma.final_logit_softcapping is None
    oss = c["gpt-oss-120b"]
    assert oss.layer_types[:2] == ["sliding_attention", "full_attention"] and oss.num_local_experts == 128
    ds, kimi = c["DeepSeek-V3"], c["Kimi-K2-Instruct"]
    assert (ds.first_k_dense_replace, ds.n_routed_experts, ds.n_shared_experts, ds.kv_lora_rank) == (3, 256, 1, 512)
    assert (kimi.first_k_dense_replace, kimi.n_routed_experts, kimi.vocab_size) == (1, 384, 163840)
    for name, config in c.items():
        assert family_of(config.to_dict()).architectures[0] == config.architectures[0], name


def test_engine_facts_per_architecture() -> None:
    for family in (QWEN3, LLAMA3, GPT_OSS, DEEPSEEK_V3):
        assert all(family.engines[e].captures == ALL_CAPTURES for e in ("vllm", "sglang")), family.name
    assert GEMMA3.engines["vllm"].captures == frozenset() and GEMMA3.engines["sglang"].captures == {EAGLE3_CAPTURE}
    assert "set_dflash_layers_to_capture" in GEMMA3.engines["sglang"].unserved(BLOCK_CAPTURE)
    # SGLang's EAGLE-3 id rules, by brute force over every id list a 61-layer target can take.
    assert plus_one([1, 29, 57], 61) == [2, 30, 58]
    assert plus_one_when_first_is_one([1, 29, 57], 61) == [2, 30, 58]
    assert plus_one_when_first_is_one([2, 30, 58], 61) == [2, 30, 58]
    assert plus_one_unless_last_boundary([1, 17, 32], 36) == [2, 18, 33]
    assert plus_one_unless_last_boundary([2, 18, 36], 36) == [2, 18, 36]
    assert DEEPSEEK_V3.engines["sglang"].eagle3_points is plus_one_when_first_is_one
    assert GPT_OSS.engines["sglang"].eagle3_points is plus_one_unless_last_boundary
    assert len({a for f in FAMILIES for a in f.architectures}) == sum(len(f.architectures) for f in FAMILIES)


def test_tensor_parallel_splits_follow_each_family_plan() -> None:
    c = family_reference_configs()
    # Llama 3.3-70B: 64 / 8 heads split 8 ways, not 16 (8 KV heads).
    assert tensor_parallel_problems(c["Llama-3.3-70B-Instruct"].to_dict(), 8) == []
    assert "num_key_value_heads = 8" in tensor_parallel_problems(c["Llama-3.3-70B-Instruct"].to_dict(), 16)[0]
    # DeepSeek-V3: MLA has no TP rule (replicated), so 16 ways is the widths' business only.
    assert tensor_parallel_problems(c["DeepSeek-V3"].to_dict(), 16, "experts") == []
    assert "moe_intermediate_size = 2048" in tensor_parallel_problems(c["DeepSeek-V3"].to_dict(), 3, "experts")[0]
    # GPT-OSS: only the embedding splits (201,088 rows = 2^7 * 1,571).
    assert tensor_parallel_problems(c["gpt-oss-120b"].to_dict(), 8) == []
    assert "vocab_size = 201088" in tensor_parallel_problems(c["gpt-oss-120b"].to_dict(), 3)[0]


def test_special_ids_are_the_published_tokenizers() -> None:
    """The ids checked against public sources (docs/reference/target_families.md names each): Llama 3 (Meta's
    llama-models tokenizer), Gemma 3 (google-deepmind/gemma's special tokens), GPT-OSS (tiktoken's o200k_harmony),
    DeepSeek-V3 (its GGUF tokenizer metadata), Kimi-K2 (its tokenization_kimi.py named tokens)."""
    c = family_reference_configs()
    llama = c["Llama-3.1-8B-Instruct"]
    assert (llama.bos_token_id, llama.eos_token_id, LLAMA3.mask_token_id) == (128000, [128001, 128008, 128009], 128002)
    gemma = c["gemma-3-12b-it"]
    assert (gemma.pad_token_id, gemma.bos_token_id, gemma.eos_token_id, GEMMA3.mask_token_id) == (0, 2, [1, 106], 4)
    oss = c["gpt-oss-20b"]
    assert (oss.eos_token_id, oss.pad_token_id, GPT_OSS.mask_token_id, oss.vocab_size) == (200002, 199999, 200000,
                                                                                          201088)
    ds, kimi = c["DeepSeek-V3"], c["Kimi-K2-Instruct"]
    assert (ds.bos_token_id, ds.eos_token_id, DEEPSEEK_V3.mask_token_id, ds.vocab_size) == (0, 1, 128815, 129280)
    assert (kimi.bos_token_id, kimi.eos_token_id) == (163584, 163585)
    assert load_recipe("kimi-k2", check_target=False).drafter.mask_token_id == 163589
    # The masks are reserved ids of the tokenizers, never a token the chat formats or the ends of turns use.
    assert family_tokenizers.LLAMA3.specials[128002].startswith("<|reserved_special_token_")
    assert family_tokenizers.KIMI_K2.specials[163589].startswith("<|reserved_token_")
    assert family_tokenizers.HARMONY.specials[200000] == "<|reserved_200000|>"
    assert family_tokenizers.DEEPSEEK_V3.size == 128815 and family_tokenizers.GEMMA3.specials[4] == "<mask>"
