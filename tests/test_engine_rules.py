"""The engine rules (``export.engine_rules``) on every production recipe's export plan at real Qwen3-4B/8B/14B
shapes (drafters on the meta device), and the ways an export can be misread, each refused.

The capture rule is checked against a brute-force walk of the decoder layers; each production plan must be
captured exactly as trained by every engine that serves it (a DSpark-label DFlash is not served by SGLang);
the negative cases edit one field or tensor of a valid plan and expect the one-line refusal naming it.
"""

from __future__ import annotations

import copy
import itertools
import json
import random

import pytest
import torch

from deepspec_train.export.engine_rules import EngineRuleError, check_engines, engine_reading
from deepspec_train.serving_layouts.engine_reading import captured_decoder_layers
from deepspec_train.serving_layouts.layout_checks import TensorSpec
from deepspec_train.export.production_plans import PRODUCTION_RECIPES, capture_table, production_export_plan
from deepspec_train.serving_layouts.draft_layers import DRAFT_CONFIG_CLASSES
from deepspec_train.models.geometry import geometry_from_target_config
from deepspec_train.costs.reference_targets import FAMILY_RECIPES, reference_target_config
from tests.helpers.scale_checks import assert_parses_as_the_drafter

# What each engine captures from each production export (decoder-layer outputs, fc column order).
EXPECTED = {
    "qwen3-4b": ([1, 9, 17, 25, 33], [1, 9, 17, 25, 33]),
    "qwen3-4b-dflash": ([1, 9, 17, 25, 33], None),
    "qwen3-4b-eagle3": ([1, 17, 32], [1, 17, 32]),
    "qwen3-8b": ([1, 9, 17, 25, 33], [1, 9, 17, 25, 33]),
    "qwen3-8b-dflash": ([1, 9, 17, 25, 33], None),
    "qwen3-8b-eagle3": ([1, 17, 32], [1, 17, 32]),
    "qwen3-14b": ([1, 10, 19, 28, 37], [1, 10, 19, 28, 37]),
    "qwen3-14b-dflash": ([1, 10, 19, 28, 37], None),
    "qwen3-14b-eagle3": ([1, 19, 36], [1, 19, 36]),
    "qwen3-8b-dflash2": ([1, 9, 17, 25, 33], [1, 9, 17, 25, 33]),
    "qwen3-8b-v32k": ([1, 9, 17, 25, 33], None),
    "qwen3-8b-32k": ([1, 9, 17, 25, 33], [1, 9, 17, 25, 33]),
    "qwen3-8b-eagle3-32k": ([1, 17, 32], [1, 17, 32]),
    "qwen3-30b-a3b": ([1, 12, 23, 34, 45], [1, 12, 23, 34, 45]),
    "qwen3-235b-a22b": ([1, 24, 46, 68, 91], [1, 24, 46, 68, 91]),
}


def test_capture_rule_matches_a_walk_of_the_layers():
    rng = random.Random(0)
    for _ in range(300):
        num_layers = rng.randint(1, 12)
        points = [rng.randint(-1, num_layers + 2) for _ in range(rng.randint(0, 6))]
        walked = []
        # The stream entering layer i is the output of layer i-1 (the embedding output, -1, for layer 0).
        for layer in range(num_layers):
            if layer in points:
                walked.append(layer - 1)
        assert captured_decoder_layers(points, num_layers) == walked


@pytest.fixture(scope="module")
def plans():
    return {recipe: production_export_plan(recipe) for recipe in PRODUCTION_RECIPES}


@pytest.mark.parametrize("recipe", PRODUCTION_RECIPES)
def test_production_exports_are_captured_as_trained(plans, recipe):
    plan, target, cfg = plans[recipe]
    assert all(t.is_meta for t in plan.tensors.values() if t.is_floating_point())
    readings = {r.engine: r for r in check_engines(plan.config, plan.tensors, target, cfg.target.layer_ids)}
    vllm, sglang = EXPECTED[recipe]
    assert readings["vllm"].captured_layers == vllm == cfg.target.layer_ids
    assert readings["vllm"].problems == [] and readings["vllm"].unserved is None
    if sglang is None and recipe.endswith("-v32k"):
        # A DSpark over a reduced draft vocabulary: the speculators layout, which SGLang does not read.
        assert "does not read the speculators format" in readings["sglang"].unserved
        assert plan.config["draft_vocab_size"] == 32000 and plan.tensors["markov_head.markov_w2.weight"].shape[0] == 32000
    elif sglang is None:
        assert "requires markov_rank > 0 (got 0)" in readings["sglang"].unserved
    else:
        assert readings["sglang"].captured_layers == sglang and readings["sglang"].problems == []
    if recipe.endswith("-eagle3"):
        assert plan.config["eagle_aux_hidden_state_layer_ids"] == [i + 1 for i in cfg.target.layer_ids]
        assert plan.config["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == cfg.target.layer_ids
        assert plan.tensors["lm_head.weight"].shape[0] == 32000 and "d2t" in plan.tensors


def test_capture_table_lists_every_recipe():
    table = capture_table()
    for recipe, (vllm, sglang) in EXPECTED.items():
        sglang_cell = "not served" if sglang is None else " ".join(map(str, sglang))
        assert f"| {recipe} |" in table and f"| {' '.join(map(str, vllm))} | {sglang_cell} |" in table


def test_serve_lines_of_the_8b_dspark_export(plans):
    plan, target, cfg = plans["qwen3-8b"]
    readings = check_engines(plan.config, plan.tensors, target, cfg.target.layer_ids, target_path="Qwen/Qwen3-8B",
                             export_dir="exports/qwen3-8b-dspark", sps_path="sps.sglang.json")
    vllm, sglang = (r.serve_commands for r in readings)
    fixed = {"method": "dspark", "model": "exports/qwen3-8b-dspark", "num_speculative_tokens": 7,
             "draft_sample_method": "probabilistic"}
    assert vllm == [f"vllm serve Qwen/Qwen3-8B --speculative-config '{json.dumps(fixed, separators=(',', ':'))}'",
                    f"vllm serve Qwen/Qwen3-8B --speculative-config "
                    f"'{json.dumps({**fixed, 'enable_adaptive_verification': True}, separators=(',', ':'))}'"]
    base = ("python -m sglang.launch_server --model-path Qwen/Qwen3-8B --speculative-algorithm DSPARK "
            "--speculative-draft-model-path exports/qwen3-8b-dspark")
    assert sglang == [base, f"SGLANG_RAGGED_VERIFY_MODE=compact {base} --speculative-dspark-block-size 7 "
                            "--speculative-dspark-sps-table-path sps.sglang.json "
                            "--speculative-dspark-confidence-sts-path exports/qwen3-8b-dspark/sglang_sts.json"]


def test_serve_lines_of_zlab_and_eagle3(plans):
    from deepspec_train.export.exporter import plan_export
    from tests.helpers.meta_drafters import QWEN3_8B, meta_parallel

    zlab = plan_export(meta_parallel("dflash", labels="zlab"), QWEN3_8B.to_dict())
    vllm, sglang = (engine_reading(e, zlab.config, zlab.tensors, QWEN3_8B.to_dict()) for e in ("vllm", "sglang"))
    assert '"method":"dflash"' in vllm.serve_commands[0] and '"num_speculative_tokens":6' in vllm.serve_commands[0]
    assert "--speculative-algorithm DFLASH" in sglang.serve_commands[0]
    assert sglang.serve_commands[0].endswith("--speculative-num-draft-tokens 7")
    assert vllm.captured_layers == sglang.captured_layers == [1, 9, 17, 25, 33]
    plan, target, _ = plans["qwen3-8b-eagle3"]
    vllm, sglang = (engine_reading(e, plan.config, plan.tensors, target) for e in ("vllm", "sglang"))
    assert '"method":"eagle3"' in vllm.serve_commands[0]
    assert "--speculative-algorithm EAGLE3" in sglang.serve_commands[0]


def _refused(config, tensors, target, trained, engines=None) -> list[str]:
    with pytest.raises(EngineRuleError) as err:
        check_engines(config, tensors, target, trained, engines)
    assert all(len(line.splitlines()) == 1 for line in err.value.problems)
    return err.value.problems


def _edited(plans, recipe):
    plan, target, cfg = plans[recipe]
    return copy.deepcopy(plan.config), dict(plan.tensors), copy.deepcopy(target), list(cfg.target.layer_ids)


def test_wrong_eagle3_id_conventions_are_refused(plans):
    config, tensors, target, trained = _edited(plans, "qwen3-8b-eagle3")
    config["eagle_aux_hidden_state_layer_ids"] = trained  # ours at the top level: vLLM reads one layer early
    assert _refused(config, tensors, target, trained) == [
        "vllm: captures decoder-layer outputs [0, 16, 31] (in fc column order), but the drafter was trained on "
        "[1, 17, 32]"]
    config, tensors, target, trained = _edited(plans, "qwen3-8b-eagle3")
    config["eagle_config"]["eagle_aux_hidden_state_layer_ids"] = [i + 1 for i in trained]  # the old rule
    assert _refused(config, tensors, target, trained) == [
        "sglang: captures decoder-layer outputs [2, 18, 33] (in fc column order), but the drafter was trained on "
        "[1, 17, 32]"]
    del config["eagle_config"]["eagle_aux_hidden_state_layer_ids"]
    assert "the only field SGLang reads" in _refused(config, tensors, target, trained)[0]


def test_sglang_eagle3_rule_depends_on_the_target_architecture(plans):
    config, tensors, target, trained = _edited(plans, "qwen3-8b-eagle3")
    target["architectures"] = ["DeepseekV3ForCausalLM"]
    # First id 1: SGLang adds 1 to every id, as for Qwen3.
    assert engine_reading("sglang", config, tensors, target).captured_layers == [1, 17, 32]
    config["eagle_config"]["eagle_aux_hidden_state_layer_ids"] = [0, 17, 32]
    config["eagle_aux_hidden_state_layer_ids"] = [1, 18, 33]
    # First id 0: taken as capture points as-is, one layer early (0 is the embedding output, -1).
    assert engine_reading("sglang", config, tensors, target).captured_layers == [-1, 16, 31]
    target["architectures"] = ["MistralForCausalLM"]
    reading = engine_reading("sglang", config, tensors, target)
    assert reading.by_architecture and "capture rule for a MistralForCausalLM target is not known" in reading.unserved


def test_draft_vocabulary_maps_must_match_the_vocabulary(plans):
    config, tensors, target, trained = _edited(plans, "qwen3-8b-eagle3")
    config["draft_vocab_size"] = target["vocab_size"]
    tensors["lm_head.weight"] = TensorSpec((target["vocab_size"], target["hidden_size"]), torch.bfloat16)
    problems = _refused(config, tensors, target, trained)
    assert problems == ["vllm: d2t is present but draft_vocab_size 151936 is the full vocabulary: vLLM then has no "
                        "draft_id_to_target_id parameter and its loader raises 'There is no module or parameter named'"]
    del tensors["d2t"], tensors["t2d"]
    check_engines(config, tensors, target, trained)
    config, tensors, target, trained = _edited(plans, "qwen3-8b-eagle3")
    del tensors["d2t"]
    problems = _refused(config, tensors, target, trained)
    assert [p.split(":")[0] for p in problems] == ["vllm", "sglang"]
    assert all("no d2t: draft ids would be read as target ids" in p for p in problems)


UNSORTED, LAST_LAYER = [9, 1, 17, 25, 33], [1, 9, 17, 25, 35]


@pytest.mark.parametrize(
    "edit, trained, expected",
    [
        (lambda c, t: c.pop("markov_rank"), None, "vllm: markov_rank is missing: vLLM reads it without a default"),
        (lambda c, t: c.update(markov_head_type="mlp"), None, "sglang: markov_head_type 'mlp' is not one of"),
        (lambda c, t: c.update(mask_token_id=151936), None, "sglang: mask_token_id 151936 is not a token"),
        (lambda c, t: c.pop("mask_token_id"), None, "vllm: mask_token_id is missing"),
        (lambda c, t: c.update(target_layer_ids=UNSORTED), UNSORTED,
         "vllm: captures decoder-layer outputs [1, 9, 17, 25, 33] (in fc column order), but the drafter was trained "
         "on [9, 1, 17, 25, 33]"),
        (lambda c, t: c.update(target_layer_ids=LAST_LAYER), LAST_LAYER,
         "sglang: captures decoder-layer outputs [1, 9, 17, 25] (in fc column order)"),
        (lambda c, t: c.update(is_causal=True), None, "vllm: the config makes vLLM run the drafter's layers causally"),
        (lambda c, t: c.update(eagle_aux_hidden_state_layer_ids=[1, 9, 17, 25, 33]), None,
         "vllm: captures decoder-layer outputs [0, 8, 16, 24, 32]"),
        (lambda c, t: t.pop("confidence_head.proj.weight"), None,
         "vllm: enable_confidence_head is true but the confidence"),
        (lambda c, t: t.update(d2t=TensorSpec((151936,), torch.int64)), None,
         "vllm: d2t is present but draft_vocab_size"),
    ],
)
def test_dspark_misreadings_are_refused(plans, edit, trained, expected):
    config, tensors, target, recipe_taps = _edited(plans, "qwen3-8b")
    edit(config, tensors)
    problems = _refused(config, tensors, target, trained or recipe_taps)
    assert any(p.startswith(expected) for p in problems), problems


def test_unserved_engine_is_reported_and_refused_only_when_asked_for(plans):
    config, tensors, target, trained = _edited(plans, "qwen3-8b-dflash")
    readings = check_engines(config, tensors, target, trained)
    assert [r.unserved is None for r in readings] == [True, False]
    assert _refused(config, tensors, target, trained, engines=["sglang"]) == [
        "sglang: does not serve this export: SGLang's DSPARK requires markov_rank > 0 (got 0); a DSpark-label "
        "DFlash is for comparisons, not for serving"]
    check_engines(config, tensors, target, trained, engines=["vllm"])


def test_every_engine_and_layout_has_a_serve_line(plans):
    for (recipe, (plan, target, cfg)), engine in itertools.product(plans.items(), ("vllm", "sglang")):
        reading = engine_reading(engine, plan.config, plan.tensors, target)
        assert bool(reading.serve_commands) == (reading.unserved is None), (recipe, engine)


@pytest.fixture(scope="module")
def family_plans():
    return {recipe: production_export_plan(recipe) for recipe in FAMILY_RECIPES}


@pytest.mark.parametrize("recipe", FAMILY_RECIPES)
def test_family_exports_parse_as_the_layers_the_drafter_has(family_plans, recipe):
    """The export parsed with the transformers config class its model_type names (what both engines do) gives the
    drafter's head_dim, no biases, SiLU and the drafter's one RoPE; every engine that serves it reads no problem."""
    plan, target, cfg = family_plans[recipe]
    config = plan.config
    geometry = geometry_from_target_config(reference_target_config(cfg), cfg.drafter.intermediate_size)
    assert_parses_as_the_drafter(config, plan.tensors, geometry)
    for reading in check_engines(config, plan.tensors, target, cfg.target.layer_ids):
        assert reading.problems == [], (recipe, reading.engine)


def test_default_head_dims_are_the_config_classes():
    """The readers' head_dim of a config without one is what transformers' Qwen3Config / LlamaConfig make of it."""
    from transformers import AutoConfig

    for model_type, config_class in DRAFT_CONFIG_CLASSES.items():
        for d, heads in itertools.product((2560, 4096, 7168), (32, 64, 128)):
            config = {"hidden_size": d, "num_attention_heads": heads, "num_key_value_heads": heads}
            assert config_class.head_dim(config) == AutoConfig.for_model(model_type, **config).head_dim


def _target_model_type(c, t, target):
    c["model_type"] = target["model_type"]


@pytest.mark.parametrize(
    "recipe, edit, expected",
    [
        # What the export was before: the target family's model type.
        ("deepseek-v3", _target_model_type, "vllm: model_type 'deepseek_v3': vLLM turns such a draft config into a "
                                            "DeepSeek MTP draft"),
        ("kimi-k2", lambda c, t, target: c.update(model_type="kimi_k2"), "vllm: model_type 'kimi_k2'"),
        ("deepseek-v3", _target_model_type, "sglang: model_type 'deepseek_v3': SGLang parses the draft config with "
                                            "that family's config class"),
        ("gpt-oss-20b", _target_model_type, "vllm: model_type 'gpt_oss'"),
        ("gpt-oss-20b", lambda c, t, target: c.update(attention_bias=True), "sglang: attention_bias is true"),
        # Qwen3Config's default head_dim is 128, DeepSeek-V3's drafter has 64.
        ("deepseek-v3", lambda c, t, target: c.pop("head_dim"), "vllm: vLLM builds head_dim 128 (128 heads: 16384 "
                                                                "query rows), but the export's q_proj has 8192 rows"),
        ("deepseek-v3", lambda c, t, target: c.update(quantization_config={"quant_method": "fp8"}),
         "sglang: quantization_config (fp8)"),
        ("kimi-k2", lambda c, t, target: c.update(auto_map={"AutoConfig": "configuration_deepseek.DeepseekV3Config"}),
         "vllm: auto_map names an AutoConfig"),
        ("gpt-oss-120b", lambda c, t, target: c.update(rope_parameters={
            "full_attention": c["rope_parameters"], "sliding_attention": c["rope_parameters"]}),
         "vllm: rope_parameters ['full_attention', 'sliding_attention'] is not one RoPE"),
        ("llama-3.3-70b", lambda c, t, target: c.update(hidden_act="gelu_pytorch_tanh"), "sglang: hidden_act"),
        ("llama-3.1-8b-dflash", lambda c, t, target: c.update(use_gemma_norm=True), None),
    ],
)
def test_family_exports_built_differently_are_refused(family_plans, recipe, edit, expected):
    plan, target, cfg = family_plans[recipe]
    config, tensors = copy.deepcopy(plan.config), dict(plan.tensors)
    edit(config, tensors, target)
    if expected is None:  # use_gemma_norm is read by SGLang only, which does not serve a DSpark-label DFlash
        check_engines(config, tensors, target, cfg.target.layer_ids)
        return
    problems = _refused(config, tensors, target, cfg.target.layer_ids)
    assert any(p.startswith(expected) for p in problems), problems


def test_speculators_layer_config_is_read_as_written(plans):
    config, tensors, target, trained = _edited(plans, "qwen3-8b-v32k")
    layers = config["transformer_layer_config"]
    assert layers["model_type"] == "qwen3" and layers["head_dim"] == 128 and layers["attention_bias"] is False
    layers["attention_bias"] = True
    assert _refused(config, tensors, target, trained)[0].startswith("vllm: attention_bias is true")
    del layers["attention_bias"], layers["head_dim"]
    check_engines(config, tensors, target, trained)  # raw fields: hidden / heads = 4096 / 32 = 128


def test_engines_give_a_gemma_drafter_the_unscaled_embedding(plans):
    config, tensors, target, trained = _edited(plans, "qwen3-8b-eagle3")
    target["architectures"] = ["Gemma3ForCausalLM"]
    problems = _refused(config, tensors, target, trained)
    assert problems == ["sglang: SGLang shares the target's stored embedding rows with the drafter, unscaled; the "
                        "target multiplies them by 64 and the drafter was trained on the scaled rows"]


def test_published_deepseek_config_without_head_dim_pairs_with_its_drafter(family_plans):
    """DeepSeek-V3's config.json has no head_dim: training's AutoConfig makes it qk_rope_head_dim (64), so the
    exporter reads it the same way; a model type transformers does not know is read field by field (hidden / heads)."""
    from deepspec_train.export.exporter import check_same_geometry

    _, target, cfg = family_plans["deepseek-v3"]
    geometry = geometry_from_target_config(reference_target_config(cfg), cfg.drafter.intermediate_size)
    published = {k: v for k, v in target.items() if k != "head_dim"}
    check_same_geometry(geometry, published)
    with pytest.raises(ValueError, match="head_dim: drafter 64 vs target 56"):
        check_same_geometry(geometry, {**published, "model_type": "kimi_k2"})
