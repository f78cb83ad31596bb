"""Families that do not guess, both directions: a target is matched to a family record by what identifies it
(config and tokenizer), not by class name alone. SmolLM2-135M-Instruct (a ``LlamaForCausalLM``) gets no family
record, and a recipe that leaves its taps and mask null gets the stated rules: the shared tap rule, an unused
special token of its own tokenizer (``<empty_output>``, 16), and ``<|im_end|>`` from its chat template, each
named in the log and saved in the resolved config. A Llama 3 copy (its scale config and a tokenizer laid out as
Llama 3's) still gets Llama 3's record and mask; a tokenizer whose specials are all in use gets one line naming
``drafter.mask_token_id``. Serving facts follow the model class: both engines serve SmolLM2 as a Llama.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
from transformers import AutoTokenizer

from deepspec_train.config.loader import ConfigError, save_resolved
from deepspec_train.families.catalog import LLAMA3, engines_of, family_of
from deepspec_train.families.own_tokens import chat_turn_end, unused_special_token
from deepspec_train.models.scale_targets import scale_target_config
from deepspec_train.kinds.recipe_validation import load_recipe
from tests.helpers.chat_tokenizer import build_chat_tokenizer
from tests.helpers.family_tokenizers import LLAMA3 as LLAMA3_LAYOUT, build_layout_tokenizer
from tests.helpers.real_world import real_config_target  # noqa: F401 (a fixture)

FROM_THE_TARGET = ["target.layer_ids=null", "drafter.mask_token_id=null"]


def _recipe_overrides(target: Path, out: Path) -> list[str]:
    return [f"target.path={target}", f"data.train=[{out / 'train.jsonl'}]", f"run.output_dir={out / 'run'}"]


def test_smollm2_is_not_llama3_but_is_served_as_a_llama(real_config_target: Path) -> None:
    config = json.loads((real_config_target / "config.json").read_text())
    vocabulary = set(AutoTokenizer.from_pretrained(real_config_target).get_vocab())
    assert config["architectures"] == ["LlamaForCausalLM"] and config["vocab_size"] == 49152
    assert family_of(config) is None and family_of(config, vocabulary) is None
    assert engines_of(config) is LLAMA3.engines


def test_smollm2_tokens_follow_the_stated_rules(real_config_target: Path) -> None:
    tokenizer = AutoTokenizer.from_pretrained(real_config_target)
    config = json.loads((real_config_target / "config.json").read_text())
    assert unused_special_token(tokenizer, config) == (16, "<empty_output>")
    assert chat_turn_end(tokenizer) == "<|im_end|>"


@pytest.mark.parametrize("kind_recipe, taps", [("smollm2-135m-dspark", [1, 8, 14, 20, 27]),
                                                ("smollm2-135m-eagle3", [1, 14, 26])])
def test_null_settings_are_taken_from_smollm2_logged_and_saved(kind_recipe: str, taps: list[int],
                                                                real_config_target: Path, tmp_path: Path,
                                                                caplog) -> None:
    logger = logging.getLogger("deepspec_train.config.target_tokens")
    logger.addHandler(caplog.handler)
    try:
        cfg = load_recipe(kind_recipe, _recipe_overrides(real_config_target, tmp_path) + FROM_THE_TARGET)
    finally:
        logger.removeHandler(caplog.handler)
    assert (cfg.target.layer_ids, cfg.drafter.mask_token_id) == (taps, 16)
    logged = caplog.text
    assert "no family record identifies the target" in logged and "<empty_output>" in logged
    assert "turn end '<|im_end|>' (from its chat template)" in logged
    save_resolved(cfg, tmp_path / "resolved_config.yaml")
    resolved = (tmp_path / "resolved_config.yaml").read_text()
    assert "mask_token_id: 16" in resolved and "null" not in resolved.split("layer_ids:")[1].split("\n")[0]
    # The shipped recipe states the same values (it must load without reading the target).
    explicit = load_recipe(kind_recipe, _recipe_overrides(real_config_target, tmp_path))
    assert explicit.target.layer_ids == taps
    assert explicit.drafter.mask_token_id == 16


def test_a_llama3_copy_still_gets_the_llama3_record(tmp_path: Path) -> None:
    target = tmp_path / "llama3"
    build_layout_tokenizer(target, LLAMA3_LAYOUT, ["What is two plus three? Five."])
    config = scale_target_config("Llama-3.1-8B-Instruct").to_dict()
    (target / "config.json").write_text(json.dumps(config))
    vocabulary = set(AutoTokenizer.from_pretrained(target).get_vocab())
    assert family_of(config) is LLAMA3 and family_of(config, vocabulary) is LLAMA3
    cfg = load_recipe("tiny-dspark", _recipe_overrides(target, tmp_path) + FROM_THE_TARGET)
    assert cfg.drafter.mask_token_id == LLAMA3.mask_token_id == 128002
    assert cfg.target.layer_ids == LLAMA3.layer_ids(config["num_hidden_layers"])
    # Llama 3's vocabulary size with a tokenizer that lacks its header and turn tokens is not Llama 3.
    assert family_of(config, {"<|im_start|>", "<|im_end|>"}) is None


def test_a_tokenizer_without_an_unused_special_names_the_setting(tmp_path: Path) -> None:
    target = tmp_path / "chatml"
    tokenizer = build_chat_tokenizer(target)
    # Every special token of this tokenizer is eos / pad or written by its template, except <|mask|>: drop it.
    config = {"architectures": ["LlamaForCausalLM"], "num_hidden_layers": 6, "vocab_size": len(tokenizer),
              "eos_token_id": tokenizer.eos_token_id, "pad_token_id": tokenizer.pad_token_id}
    (target / "config.json").write_text(json.dumps(config))
    assert unused_special_token(tokenizer, config) == (tokenizer.convert_tokens_to_ids("<|mask|>"), "<|mask|>")
    mask_id = tokenizer.convert_tokens_to_ids("<|mask|>")
    assert unused_special_token(tokenizer, {**config, "vocab_size": mask_id}) is None
    (target / "config.json").write_text(json.dumps({**config, "vocab_size": mask_id}))
    with pytest.raises(ConfigError) as refused:
        load_recipe("tiny-dspark", _recipe_overrides(target, tmp_path) + FROM_THE_TARGET)
    message = str(refused.value)
    assert "\n" not in message and "set drafter.mask_token_id" in message
