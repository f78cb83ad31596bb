"""Published drafter directories in: DeepSpec's DSpark release (sharded safetensors, no target record), z-lab
DFlash, EAGLE-3 as SpecForge writes it and as the EAGLE repository ships it (``pytorch_model.bin`` with its own
embedding). Each is built here with random weights for the tiny random target, then evaluated by ``deepspec eval``,
checked against the target's shapes and vocabulary, and used as ``drafter.init_from`` to fine-tune."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from deepspec_train.commands.dispatch import main
from deepspec_train.kinds.recipe_validation import recipe_and_kind_problems as recipe_problems
from deepspec_train.export.exporter import plan_export
from deepspec_train.formats.drafter_loader import load_exported_drafter
from deepspec_train.formats.published_drafters import PICKLE_WEIGHTS, SHARD_INDEX
from deepspec_train.serving_layouts.eagle3_layout import PUBLISHED_EMBEDDING as EAGLE3_EMBEDDING
from deepspec_train.serving_layouts.eagle3_layout import complete_published_eagle3 as complete_eagle3_checkpoint
from deepspec_train.jobs.drafter_init import initialise_from
from deepspec_train.kinds.builder import build_drafter_for_geometry
from deepspec_train.models.geometry import geometry_from_target_config
from deepspec_train.commands.train_entry import main as train_main
from tests.helpers.benchmark_suites import prepare_all_suites
from tests.helpers.chat_model_drafters import drafter_recipe, random_drafter
from tests.helpers.streaming_world import recipe_overrides

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def publish(loaded, target: Path, layout: str, out: Path, style: str) -> Path:
    """Write ``loaded`` the way its publisher ships it: ``single`` (SpecForge / z-lab: model.safetensors),
    ``sharded`` (DeepSpec's save_pretrained: two shards and their index) or ``pickled`` (the EAGLE repository:
    pytorch_model.bin with the target's embedding inside)."""
    plan = plan_export(loaded, json.loads((target / "config.json").read_text()), layout, dtype=torch.float32)
    out.mkdir(parents=True)
    tensors = dict(plan.tensors)
    if style == "single":
        save_file(tensors, str(out / "model.safetensors"))
    elif style == "sharded":
        names = sorted(tensors)
        shards = {"model-00001-of-00002.safetensors": names[::2], "model-00002-of-00002.safetensors": names[1::2]}
        for shard, members in shards.items():
            save_file({n: tensors[n] for n in members}, str(out / shard))
        weight_map = {n: shard for shard, members in shards.items() for n in members}
        (out / SHARD_INDEX).write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    else:
        embed = loaded.module.embed_tokens.weight.detach().clone()
        torch.save({**tensors, EAGLE3_EMBEDDING: embed}, out / PICKLE_WEIGHTS)
    (out / "config.json").write_text(json.dumps(plan.config))
    return out


@pytest.fixture(scope="module")
def published(streaming_world, tmp_path_factory):
    """The tiny target and four published drafters for it, with the modules they were written from."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    root = tmp_path_factory.mktemp("published")
    target = Path(streaming_world["target"])
    model = AutoModelForCausalLM.from_pretrained(target, dtype=torch.float32).eval()
    tokenizer = AutoTokenizer.from_pretrained(target)
    half = model.config.vocab_size // 2
    sources = {
        "deepspec-dspark": (random_drafter(model, tokenizer, "dspark", seed=1), "dspark", "sharded"),
        "zlab-dflash": (dataclasses.replace(random_drafter(model, tokenizer, "dflash", seed=2), labels="zlab"),
                        "zlab-dflash", "single"),
        "specforge-eagle3": (random_drafter(model, tokenizer, "eagle3", seed=3, draft_vocab_size=half), "eagle3",
                             "single"),
        "eagle-repo-eagle3": (random_drafter(model, tokenizer, "eagle3", seed=4), "eagle3", "pickled"),
    }
    dirs = {name: publish(loaded, target, layout, root / name, style)
            for name, (loaded, layout, style) in sources.items()}
    return {"root": root, "target": target, "dirs": dirs, "modules": {n: s[0] for n, s in sources.items()},
            "world": streaming_world}


@pytest.mark.parametrize("name", ["deepspec-dspark", "zlab-dflash", "specforge-eagle3", "eagle-repo-eagle3"])
def test_each_published_layout_loads_with_its_weights(published, name):
    loaded = load_exported_drafter(published["dirs"][name], target_path=str(published["target"]))
    original = published["modules"][name].module.state_dict()
    state = loaded.module.state_dict()
    assert set(state) == set(original)
    for key, tensor in original.items():
        assert torch.equal(state[key].to(tensor.dtype), tensor), key
    assert loaded.labels == published["modules"][name].labels


def test_published_drafters_compared_on_the_suites_in_one_command(published, tmp_path):
    suites = prepare_all_suites(tmp_path, sample=1)
    out = tmp_path / "table1"
    argv = ["eval", "--target", str(published["target"]), "--out", str(out), "--no-progress", "--temperature", "0",
            "--max-new-tokens", "6", "--bootstrap-replicates", "50", "--baseline", "eagle-repo-eagle3"]
    argv += [a for name in ("gsm8k", "humaneval", "mt-bench") for a in ("--suite", f"{name}={suites[name]}")]
    argv += [a for name, path in published["dirs"].items() for a in ("--drafter", f"{name}={path}")]
    assert main(argv) == 0
    table = json.loads((out / "table1.json").read_text())["tables"][0]
    assert table["drafters"] == list(published["dirs"]) and table["suites"] == ["gsm8k", "humaneval", "mt-bench"]
    assert set(table["ratios"]) == {"deepspec-dspark", "zlab-dflash", "specforge-eagle3"}
    assert json.loads((out / "table1.json").read_text())["kinds"]["zlab-dflash"] == "dflash"


def test_a_drafter_for_another_vocabulary_fails_in_one_line(published, tmp_path, capsys):
    other = tmp_path / "other_target"
    shutil.copytree(published["target"], other)
    config = json.loads((other / "config.json").read_text())
    (other / "config.json").write_text(json.dumps({**config, "vocab_size": config["vocab_size"] + 64}))
    for name in ("deepspec-dspark", "specforge-eagle3", "eagle-repo-eagle3"):
        argv = ["eval", "--target", str(other), "--drafter", f"{name}={published['dirs'][name]}", "--suite",
                f"x={tmp_path / 'unused.jsonl'}", "--out", str(tmp_path / "o")]
        (tmp_path / "unused.jsonl").write_text(json.dumps({"id": 1, "turns": ["hi"]}) + "\n")
        assert main(argv) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "does not fit the target" in err[0] and "vocabulary" in err[0], (name, err)


def test_eagle3_without_taps_gets_the_engines_default_from_the_target_depth(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"num_hidden_layers": 36, "vocab_size": 10, "hidden_size": 4}))
    config, state = complete_eagle3_checkpoint({"architectures": ["LlamaForCausalLMEagle3"]},
                                               {EAGLE3_EMBEDDING: torch.zeros(10, 4), "fc.weight": torch.zeros(4, 12)},
                                               str(tmp_path))
    assert config["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [1, 17, 32]
    assert set(state) == {"fc.weight"}
    with pytest.raises(ValueError, match="does not fit the target"):
        complete_eagle3_checkpoint({}, {EAGLE3_EMBEDDING: torch.zeros(11, 4)}, str(tmp_path))


@pytest.mark.parametrize("name,kind,labels", [("deepspec-dspark", "dspark", "dspark"),
                                              ("zlab-dflash", "dflash", "zlab"),
                                              ("specforge-eagle3", "eagle3", "dspark")])
def test_init_from_copies_every_trained_tensor_into_the_recipes_drafter(published, name, kind, labels):
    source = published["modules"][name]
    cfg = drafter_recipe(kind, source.mask_token_id or 3, draft_vocab_size=source.module.d2t.shape[0]
                         if kind == "eagle3" else None)
    cfg.drafter = dataclasses.replace(cfg.drafter, labels=labels, init_from=str(published["dirs"][name]))
    cfg.target.path = str(published["target"])
    from transformers import AutoConfig

    geometry = geometry_from_target_config(AutoConfig.from_pretrained(published["target"]), intermediate_size=48)
    counts = torch.arange(geometry.vocab_size) if kind == "eagle3" else None
    drafter = build_drafter_for_geometry(cfg, geometry, counts)
    before = {n: p.detach().clone() for n, p in drafter.named_parameters() if p.requires_grad}
    assert initialise_from(drafter, cfg)
    expected = source.module.state_dict()
    for n, p in drafter.named_parameters():
        if p.requires_grad:
            assert torch.equal(p.detach(), expected[n]), n
    # The copy mattered: the fresh drafter's random matrices differed from the published ones.
    assert sum(not torch.equal(before[n], expected[n]) for n in before) >= len(before) // 2
    if kind == "eagle3":
        assert torch.equal(drafter.d2t, expected["d2t"]) and torch.equal(drafter.t2d, expected["t2d"])


def test_fine_tuning_a_published_dspark_starts_from_its_weights(published, tmp_path, capsys):
    world = published["world"]
    shapes = {"drafter.intermediate_size": 48, "drafter.markov_head_type": "vanilla", "train.max_steps": 1,
              "train.eval_every": 1000, "data.validation": "[]", "data.cache_dir": str(tmp_path / "cache"),
              "train.lr": 1e-9, "train.weight_decay": 0.0}
    init = {"drafter.init_from": str(published["dirs"]["deepspec-dspark"])}
    assert train_main(recipe_overrides(world, tmp_path / "run", **shapes, **init)) == 0
    tuned = load_exported_drafter(tmp_path / "run" / "drafter", target_path=world["target"]).module.state_dict()
    original = published["modules"]["deepspec-dspark"].module.state_dict()
    # One step at lr 1e-9 moves each weight by about 1e-9: the run started from the published weights.
    for key in ("layers.0.self_attn.q_proj.weight", "markov_head.markov_w1.weight", "confidence_head.proj.weight"):
        assert torch.allclose(tuned[key], original[key], atol=1e-6), key
    wrong = recipe_overrides(world, tmp_path / "run2", **shapes, **init, **{"drafter.num_layers": 2})
    assert train_main(wrong) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert len(err) == 1 and "drafter.init_from" in err[0] and "layers.1" in err[0], err


def test_init_from_must_name_a_directory(published, tmp_path):
    cfg = drafter_recipe("dspark", 3)
    cfg.run.output_dir, cfg.target.path = str(tmp_path / "run"), str(published["target"])
    cfg.drafter = dataclasses.replace(cfg.drafter, init_from=str(tmp_path / "nowhere"))
    assert any(p.startswith("drafter.init_from = ") and "no such directory" in p for p in recipe_problems(cfg))
    cfg.drafter = dataclasses.replace(cfg.drafter, init_from=str(published["dirs"]["deepspec-dspark"]))
    assert not any("init_from" in p for p in recipe_problems(cfg))
