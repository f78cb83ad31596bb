"""Serving-format export and the exported-drafter loader.

Round trips (train-output dir -> fp32 export -> loader) must give bit-identical slot logits and confidences in
every layout; the exporter must refuse incomplete checkpoints and mismatched label conventions; and the key /
shape plan for Qwen3-8B-sized drafters (built on the meta device, nothing written) must match the serving layouts.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from deepspec_train.config.schema import DrafterConfig
from deepspec_train.export.engine_rules import check_export_dir
from deepspec_train.export.exporter import export_drafter, plan_export, write_confidence_temperatures
from deepspec_train.serving_layouts.dspark_layout import DSPARK_LAYOUT
from deepspec_train.serving_layouts.engine_reading import EngineReading, captured_decoder_layers
from deepspec_train.serving_layouts.eagle3_layout import layer_ids_from_eagle3_config, vllm_eagle3_layer_ids
from deepspec_train.serving_layouts.layout_checks import ConfigCheck
from deepspec_train.serving_layouts.layout_registry import LAYOUTS, validate_layout
from deepspec_train.kinds.parallel import DSPARK
from deepspec_train.kinds.registry import KINDS
from deepspec_train.serving_layouts.layout_spec import LayoutError
from deepspec_train.formats.drafter_loader import LoadedDrafter, load_exported_drafter, read_tensor_specs
from deepspec_train.models.draft_vocab import DraftVocab
from deepspec_train.models.eagle3_drafter import Eagle3Drafter, eagle3_target_layer_ids
from deepspec_train.models.geometry import geometry_from_target_config
from deepspec_train.models.parallel_drafter import ParallelDrafter
from deepspec_train.models.reference_configs import REFERENCE_LAYER_IDS
from deepspec_train.target.head_weights import load_head_weights
from deepspec_train.formats.trained_drafter import write_trained_drafter
from tests.helpers.meta_drafters import QWEN3_8B, meta_parallel
from tests.helpers.tiny_drafter import drafter_outputs
from tests.helpers.tiny_geometry import BLOCK, HIDDEN, MASK_ID, VOCAB
from tests.helpers.trained_drafters import (
    LAYER_IDS, exported_dspark, random_batch, save_tiny_target, tiny_recipe, trained_drafter, write_training_output,
)


@pytest.fixture(scope="module")
def target_dir(tmp_path_factory) -> str:
    return save_tiny_target(tmp_path_factory.mktemp("target"))


CASES = [("dspark", "dspark", "dspark"), ("dflash", "dspark", "dspark"), ("dflash", "zlab", "zlab-dflash"),
         ("eagle3", "dspark", "eagle3")]


@pytest.mark.parametrize("kind,labels,layout", CASES)
def test_round_trip_is_bit_identical(tmp_path, target_dir, kind, labels, layout):
    cfg = tiny_recipe(kind, target_dir, labels)
    drafter = trained_drafter(cfg)
    run = write_training_output(drafter, cfg, tmp_path / "run")
    out = export_drafter(run, target_dir, tmp_path / "export", dtype=torch.float32)
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == [{"dspark": "Qwen3DSparkModel", "zlab-dflash": "DFlashDraftModel",
                                        "eagle3": "LlamaForCausalLMEagle3"}[layout]]
    extra = ["dflash.py"] if layout == "zlab-dflash" else []
    assert sorted(p.name for p in out.iterdir()) == sorted(["README.md", "config.json", "model.safetensors", *extra])
    # Only the export and the target go in: the training output must not be needed any more.
    for f in run.iterdir():
        f.unlink()
    loaded = load_exported_drafter(out, target_path=target_dir)
    assert (loaded.kind, loaded.labels, loaded.source) == (kind, labels, layout)
    assert loaded.block_size == BLOCK and loaded.target_layer_ids == LAYER_IDS[kind]
    assert loaded.mask_token_id == (None if kind == "eagle3" else MASK_ID)
    assert not loaded.module.training and not any(p.requires_grad for p in loaded.module.parameters())
    for seed in range(2):
        batch = random_batch(kind, seed, labels)
        want, got = drafter_outputs(drafter, batch), drafter_outputs(loaded.module, batch)
        assert want.keys() == got.keys()
        for name in want:
            assert torch.equal(want[name], got[name]), (kind, name)
    if kind == "eagle3":
        assert torch.equal(loaded.module.d2t, drafter.d2t) and torch.equal(loaded.module.t2d, drafter.t2d)
        assert not bool(drafter.t2d.all())


def _toy_engine(config, tensors, target, paths) -> EngineReading:
    points = [i + 1 for i in config["target_layer_ids"]]
    return EngineReading("vllm", "toy", captured_decoder_layers(points, target.num_layers), serve_commands=["toy"])


def _without_heads(check: ConfigCheck):
    tensors = DSPARK_LAYOUT.check(check)
    return None if tensors is None else {k: v for k, v in tensors.items() if k not in TOY_FROM_TARGET}


TOY_FROM_TARGET = ("embed_tokens.weight", "lm_head.weight")
# A layout made of a record only: DSpark's fields, its heads taken from the target, one engine (vLLM) and a file.
TOY_LAYOUT = dataclasses.replace(
    DSPARK_LAYOUT, name="toy", architecture="ToyDraftModel", from_target=TOY_FROM_TARGET, copies_target_heads=False,
    unwritten=lambda module: frozenset(TOY_FROM_TARGET), check=_without_heads, engines={"vllm": _toy_engine},
    companion_files=lambda: {"TOY.md": "toy\n"}, readme_section=lambda config: ["## Toy", ""],
)
TOY_KIND = dataclasses.replace(DSPARK, name="toy-kind", layouts=lambda labels: (TOY_LAYOUT.name,),
                               holds_export=lambda drafter: True)


def test_a_new_kind_and_layout_are_one_record_each(tmp_path, target_dir, monkeypatch):
    """Registering a kind record and a layout record is all the exporter, the engine rules and the loader need."""
    monkeypatch.setitem(KINDS, TOY_KIND.name, TOY_KIND)
    monkeypatch.setitem(LAYOUTS, TOY_LAYOUT.name, TOY_LAYOUT)
    cfg = tiny_recipe("dspark", target_dir)
    cfg = dataclasses.replace(cfg, drafter=dataclasses.replace(cfg.drafter, kind=TOY_KIND.name))
    drafter = trained_drafter(cfg)
    run = write_training_output(drafter, cfg, tmp_path / "run")
    out = export_drafter(run, target_dir, tmp_path / "export", dtype=torch.float32)
    assert sorted(p.name for p in out.iterdir()) == ["README.md", "TOY.md", "config.json", "model.safetensors"]
    assert json.loads((out / "config.json").read_text())["architectures"] == ["ToyDraftModel"]
    assert not set(TOY_FROM_TARGET) & set(read_tensor_specs(out / "model.safetensors"))
    assert "## Toy" in (out / "README.md").read_text()
    vllm, sglang = check_export_dir(out, target_dir)
    assert vllm.captured_layers == LAYER_IDS["dspark"] and vllm.serve_commands == ["toy"]
    assert sglang.unserved == "sglang has no loader for the toy layout"
    loaded = load_exported_drafter(out, target_path=target_dir)
    assert (loaded.kind, loaded.source, loaded.target_layer_ids) == (TOY_KIND.name, "toy", LAYER_IDS["dspark"])
    batch = random_batch("dspark")
    want, got = drafter_outputs(drafter, batch), drafter_outputs(loaded.module, batch)
    assert want.keys() == got.keys() and all(torch.equal(want[name], got[name]) for name in want)


@pytest.mark.parametrize("head_type", ["gated", "rnn"])
def test_sequential_markov_heads_round_trip(tmp_path, target_dir, head_type):
    cfg = tiny_recipe("dspark", target_dir, markov_head_type=head_type)
    drafter = trained_drafter(cfg)
    run = write_training_output(drafter, cfg, tmp_path / "run")
    out = export_drafter(run, target_dir, tmp_path / "export", dtype=torch.float32)
    config = json.loads((out / "config.json").read_text())
    assert config["markov_head_type"] == head_type
    loaded = load_exported_drafter(out, target_path=target_dir)
    assert loaded.module.markov_head.head_type == head_type
    batch = random_batch("dspark", 1)
    want, got = drafter_outputs(drafter, batch), drafter_outputs(loaded.module, batch)
    for name in want:
        assert torch.equal(want[name], got[name]), name
    config["markov_head_type"] = "lstm"
    with pytest.raises(LayoutError, match="markov_head_type = 'lstm'"):
        validate_layout("dspark", config, read_tensor_specs(out / "model.safetensors"))
    config["markov_head_type"] = "vanilla"
    with pytest.raises(LayoutError, match="unexpected tensor markov_head"):
        validate_layout("dspark", config, read_tensor_specs(out / "model.safetensors"))


def test_training_dir_loads_directly(tmp_path, target_dir):
    cfg = tiny_recipe("dspark", target_dir)
    drafter = trained_drafter(cfg)
    write_training_output(drafter, cfg, tmp_path / "run")
    # The run directory itself is accepted too; the target comes from the recorded recipe.
    loaded = load_exported_drafter(tmp_path / "run")
    assert loaded.source == "training" and loaded.confidence_temperatures is None
    batch = random_batch("dspark", 3)
    for name, value in drafter_outputs(drafter, batch).items():
        assert torch.equal(value, drafter_outputs(loaded.module, batch)[name])


def test_calibrated_confidences_round_trip(tmp_path, target_dir):
    temps = [0.5, 1.0, 2.0, 4.0]
    out, drafter = exported_dspark(tmp_path, target_dir, temps)
    loaded = load_exported_drafter(out)
    assert loaded.confidence_temperatures == temps
    z = drafter_outputs(drafter, random_batch("dspark", 1))["confidence"]
    assert torch.equal(loaded.confidences(z), torch.sigmoid(z / torch.tensor(temps)))
    # Re-exporting an export keeps its temperatures.
    again = export_drafter(out, target_dir, tmp_path / "again", dtype=torch.float32)
    assert json.loads((again / "config.json").read_text())["confidence_temperatures"] == temps


def test_bf16_default_and_heads_equal_the_target(tmp_path, target_dir):
    cfg = tiny_recipe("dspark", target_dir)
    run = write_training_output(trained_drafter(cfg), cfg, tmp_path / "run")
    out = export_drafter(run, target_dir, tmp_path / "export")
    tensors = load_file(str(out / "model.safetensors"))
    assert {t.dtype for t in tensors.values()} == {torch.bfloat16}
    embed, lm_head = load_head_weights(target_dir)
    assert not torch.equal(embed, lm_head)
    assert torch.equal(tensors["embed_tokens.weight"], embed.to(torch.bfloat16))
    assert torch.equal(tensors["lm_head.weight"], lm_head.to(torch.bfloat16))
    config = json.loads((out / "config.json").read_text())
    assert config["dtype"] == config["torch_dtype"] == "bfloat16"
    assert load_exported_drafter(out).module.fc.weight.dtype == torch.bfloat16


def test_eagle3_config_layer_ids_and_vocab_maps(tmp_path, target_dir):
    cfg = tiny_recipe("eagle3", target_dir)
    run = write_training_output(trained_drafter(cfg), cfg, tmp_path / "run")
    out = export_drafter(run, target_dir, tmp_path / "export")
    config = json.loads((out / "config.json").read_text())
    # Decoder layers [0, 1, 2]: vLLM reads the top level as hidden_states indices [1, 2, 3], SGLang reads
    # eagle_config's as decoder layers (Qwen3 target: it captures before layer id + 1).
    assert config["eagle_aux_hidden_state_layer_ids"] == [1, 2, 3]
    assert config["eagle_config"] == {"eagle_aux_hidden_state_layer_ids": [0, 1, 2], "use_aux_hidden_state": True}
    assert config["draft_vocab_size"] == 40 and config["num_hidden_layers"] == 1
    tensors = load_file(str(out / "model.safetensors"))
    assert tensors["d2t"].dtype == torch.int64 and tensors["t2d"].dtype == torch.bool
    assert "embed_tokens.weight" not in tensors and tensors["lm_head.weight"].shape == (40, HIDDEN)


def test_full_vocab_eagle3_export_has_no_maps_and_loads(tmp_path, target_dir):
    cfg = tiny_recipe("eagle3", target_dir, draft_vocab_size=None)
    drafter = trained_drafter(cfg)
    run = write_training_output(drafter, cfg, tmp_path / "run")
    out = export_drafter(run, target_dir, tmp_path / "export", dtype=torch.float32)
    tensors = load_file(str(out / "model.safetensors"))
    assert "d2t" not in tensors and "t2d" not in tensors and tensors["lm_head.weight"].shape == (VOCAB, HIDDEN)
    assert json.loads((out / "config.json").read_text())["draft_vocab_size"] == VOCAB
    loaded = load_exported_drafter(out, target_path=target_dir)
    assert torch.equal(loaded.module.d2t, torch.zeros(VOCAB, dtype=torch.long)) and bool(loaded.module.t2d.all())
    batch = random_batch("eagle3", 1)
    assert torch.equal(drafter_outputs(drafter, batch)["logits"], drafter_outputs(loaded.module, batch)["logits"])


def test_eagle3_layer_id_conversion():
    assert vllm_eagle3_layer_ids([1, 17, 32]) == [2, 18, 33]
    both = {"eagle_aux_hidden_state_layer_ids": [2, 18, 33],
            "eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 17, 32]}}
    assert layer_ids_from_eagle3_config(both) == [1, 17, 32]
    assert layer_ids_from_eagle3_config({"eagle_aux_hidden_state_layer_ids": [1, 2, 3]}) == [0, 1, 2]


def test_reduced_eagle3_vocab_needs_its_maps(tmp_path, target_dir):
    cfg = tiny_recipe("eagle3", target_dir)
    reduced = trained_drafter(cfg)
    run_dir = tmp_path / "run" / "drafter"
    write_trained_drafter(reduced, cfg, run_dir)
    loaded_reduced = load_exported_drafter(run_dir)
    assert torch.equal(loaded_reduced.module.d2t, reduced.d2t) and torch.equal(loaded_reduced.module.t2d, reduced.t2d)
    weights = load_file(str(run_dir / "drafter.safetensors"))
    save_file({k: v for k, v in weights.items() if k not in ("d2t", "t2d")}, str(run_dir / "drafter.safetensors"))
    with pytest.raises(ValueError, match="no d2t/t2d"):
        load_exported_drafter(run_dir)
    full = tiny_recipe("eagle3", target_dir, draft_vocab_size=None)
    drafter = trained_drafter(full)
    write_trained_drafter(drafter, full, tmp_path / "full" / "drafter")
    loaded = load_exported_drafter(tmp_path / "full" / "drafter")
    batch = random_batch("eagle3", 0)
    assert torch.equal(drafter_outputs(drafter, batch)["logits"], drafter_outputs(loaded.module, batch)["logits"])


@pytest.mark.parametrize(
    "kind,labels,layout,message",
    [
        ("dflash", "zlab", "dspark", "with zlab labels exports only as zlab-dflash, not dspark"),
        ("dflash", "dspark", "zlab-dflash", "dflash drafter trained with dspark labels exports only as dspark, not zlab"),
        ("dspark", "dspark", "zlab-dflash",
         "dspark drafter trained with dspark labels exports only as dspark / speculators-dspark, not zlab"),
        ("dspark", "dspark", "eagle3", "exports only as dspark / speculators-dspark, not eagle3"),
    ],
)
def test_exporter_refuses_mismatched_label_convention(tmp_path, target_dir, kind, labels, layout, message):
    cfg = tiny_recipe(kind, target_dir, labels)
    run = write_training_output(trained_drafter(cfg), cfg, tmp_path / "run")
    with pytest.raises(LayoutError, match=message):
        export_drafter(run, target_dir, tmp_path / "export", layout=layout)
    assert not (tmp_path / "export").exists()


def test_exporter_refuses_unsorted_or_repeated_eagle3_taps(tmp_path, target_dir):
    cfg = tiny_recipe("eagle3", target_dir)
    # Recipes refuse unsorted taps (config.rules); a drafter trained with them anyway is refused at export.
    cfg.target.layer_ids = [2, 0, 1]
    run = write_training_output(trained_drafter(cfg), cfg, tmp_path / "unsorted")
    with pytest.raises(ValueError, match=r"not in increasing order.*target.layer_ids=\[0, 1, 2\]"):
        export_drafter(run, target_dir, tmp_path / "export")
    # Repeated taps train, but every engine captures a layer once: the export is refused, nothing written.
    cfg.target.layer_ids = [1, 1, 2]
    run = write_training_output(trained_drafter(cfg), cfg, tmp_path / "run")
    with pytest.raises(ValueError, match=r"vllm: captures decoder-layer outputs \[1, 2\].*trained on \[1, 1, 2\]"):
        export_drafter(run, target_dir, tmp_path / "export")
    assert not (tmp_path / "export").exists()


def _tampered_export(tmp_path: Path, target: str, drop_tensor: str | None = None, drop_field: str | None = None):
    out, _ = exported_dspark(tmp_path, target)
    if drop_tensor:
        state = load_file(str(out / "model.safetensors"))
        del state[drop_tensor]
        save_file(state, str(out / "model.safetensors"))
    if drop_field:
        config = json.loads((out / "config.json").read_text())
        del config[drop_field]
        (out / "config.json").write_text(json.dumps(config))
    return out


@pytest.mark.parametrize(
    "tensor,field,message",
    [
        ("markov_head.markov_w2.weight", None, "tensor markov_head.markov_w2.weight is missing"),
        ("confidence_head.proj.bias", None, "tensor confidence_head.proj.bias is missing"),
        (None, "markov_rank", "config field markov_rank is missing"),
        (None, "mask_token_id", "config field mask_token_id is missing"),
    ],
)
def test_exporter_refuses_missing_tensor_or_field(tmp_path, target_dir, tensor, field, message):
    source = _tampered_export(tmp_path / "src", target_dir, tensor, field)
    with pytest.raises(LayoutError, match=message):
        export_drafter(source, target_dir, tmp_path / "export")
    assert not (tmp_path / "export").exists()


def test_loader_refuses_a_confidence_head_without_markov_head(tmp_path, target_dir):
    """The DSpark layout allows that head, no drafter kind has it: the loader refuses the export's config in one
    line (it checks the export's own fields, it builds no recipe from them)."""
    cfg = tiny_recipe("dflash", target_dir)
    run = write_training_output(trained_drafter(cfg), cfg, tmp_path / "run")
    out = export_drafter(run, target_dir, tmp_path / "export", dtype=torch.float32)
    config = json.loads((out / "config.json").read_text())
    assert config["markov_rank"] == 0
    config |= {"enable_confidence_head": True, "confidence_head_with_markov": False}
    (out / "config.json").write_text(json.dumps(config))
    state = load_file(str(out / "model.safetensors"))
    state |= {"confidence_head.proj.weight": torch.zeros(1, HIDDEN), "confidence_head.proj.bias": torch.zeros(1)}
    save_file(state, str(out / "model.safetensors"))
    with pytest.raises(ValueError, match="enable_confidence_head with markov_rank 0 does not load") as err:
        load_exported_drafter(out, target_path=target_dir)
    assert "\n" not in str(err.value)


def test_validation_names_every_problem(tmp_path, target_dir):
    out, _ = exported_dspark(tmp_path, target_dir)
    loaded = load_exported_drafter(out)
    target_config = json.loads((Path(target_dir) / "config.json").read_text())
    plan = plan_export(loaded, target_config, dtype=torch.float32)
    tensors = dict(plan.tensors)
    tensors["fc.weight"] = torch.zeros(HIDDEN, 3 * HIDDEN)
    tensors["model.norm.weight"] = tensors.pop("norm.weight")
    config = {k: v for k, v in plan.config.items() if k != "markov_head_type"}
    with pytest.raises(LayoutError) as err:
        validate_layout("dspark", config, tensors)
    assert "config field markov_head_type is missing" in err.value.problems
    validate_layout("dspark", plan.config, plan.tensors)
    with pytest.raises(LayoutError) as err:
        validate_layout("dspark", plan.config, tensors)
    assert set(err.value.problems) == {
        "tensor norm.weight is missing",
        "unexpected tensor model.norm.weight",
        f"tensor fc.weight has shape [{HIDDEN}, {3 * HIDDEN}], expected [{HIDDEN}, {2 * HIDDEN}]",
    }
    with pytest.raises(LayoutError, match="entries, block_size is 4"):
        write_confidence_temperatures(out, [1.0, 1.0])


# ---------------------------------------------------------------- Qwen3-8B plan on the meta device (serving layouts)

D, V, I, H, G, HD = 4096, 151936, 12288, 32, 8, 128


def formats_decoder_layer(prefix: str, attn_in: int, qk_norm: bool) -> dict[str, tuple]:
    shapes = {
        f"{prefix}input_layernorm.weight": (D,),
        f"{prefix}post_attention_layernorm.weight": (D,),
        f"{prefix}self_attn.q_proj.weight": (H * HD, attn_in),
        f"{prefix}self_attn.k_proj.weight": (G * HD, attn_in),
        f"{prefix}self_attn.v_proj.weight": (G * HD, attn_in),
        f"{prefix}self_attn.o_proj.weight": (D, H * HD),
        f"{prefix}mlp.gate_proj.weight": (I, D),
        f"{prefix}mlp.up_proj.weight": (I, D),
        f"{prefix}mlp.down_proj.weight": (D, I),
    }
    if qk_norm:
        shapes.update({f"{prefix}self_attn.q_norm.weight": (HD,), f"{prefix}self_attn.k_norm.weight": (HD,)})
    return shapes


def formats_parallel(rank: int, confidence: bool, heads: bool) -> dict[str, tuple]:
    shapes = {"fc.weight": (D, 5 * D), "hidden_norm.weight": (D,), "norm.weight": (D,)}
    for i in range(5):
        shapes.update(formats_decoder_layer(f"layers.{i}.", D, qk_norm=True))
    if heads:
        shapes.update({"embed_tokens.weight": (V, D), "lm_head.weight": (V, D)})
    if rank:
        shapes.update({"markov_head.markov_w1.weight": (V, rank), "markov_head.markov_w2.weight": (V, rank)})
    if confidence:
        shapes.update({"confidence_head.proj.weight": (1, D + rank), "confidence_head.proj.bias": (1,)})
    return shapes


def plan_shapes(plan) -> dict[str, tuple]:
    assert all(t.is_meta for t in plan.tensors.values())
    return {name: tuple(t.shape) for name, t in plan.tensors.items()}


def test_qwen3_8b_dspark_plan_matches_formats():
    plan = plan_export(meta_parallel("dspark"), QWEN3_8B.to_dict(), confidence_temperatures=[1.0] * 7)
    assert plan.layout == "dspark"
    assert plan_shapes(plan) == formats_parallel(256, True, heads=True)
    assert {t.dtype for t in plan.tensors.values()} == {torch.bfloat16}
    expected = {
        "architectures": ["Qwen3DSparkModel"], "num_hidden_layers": 5, "num_target_layers": 36, "block_size": 7,
        "layer_types": ["full_attention"] * 5, "tie_word_embeddings": False, "mask_token_id": 151669,
        "target_layer_ids": [1, 9, 17, 25, 33], "num_anchors": 512, "enable_confidence_head": True,
        "confidence_head_with_markov": True, "markov_rank": 256, "markov_head_type": "vanilla",
        "confidence_temperatures": [1.0] * 7, "hidden_size": D, "intermediate_size": I, "vocab_size": V,
    }
    assert {k: plan.config[k] for k in expected} == expected


@pytest.mark.parametrize("head_type,extra", [
    ("gated", {"markov_head.gate_proj.weight": (256, D + 256), "markov_head.gate_proj.bias": (256,)}),
    ("rnn", {"markov_head.joint_proj.weight": (3 * 256, 2 * 256 + D), "markov_head.joint_proj.bias": (3 * 256,)}),
])
def test_qwen3_8b_sequential_markov_plans_match_sglang(head_type, extra):
    """SGLang's GatedMarkovHead / RNNHead tensors (names and [out, in] shapes) at Qwen3-8B's production shape."""
    cfg = DrafterConfig(kind="dspark", num_layers=5, block_size=7, markov_rank=256, confidence_head=True,
                        markov_head_type=head_type)
    with torch.device("meta"):
        module = ParallelDrafter(geometry_from_target_config(QWEN3_8B), cfg, REFERENCE_LAYER_IDS["Qwen3-8B"])
    loaded = LoadedDrafter(module, "dspark", 7, REFERENCE_LAYER_IDS["Qwen3-8B"], 151669, None, "dspark", "training")
    plan = plan_export(loaded, QWEN3_8B.to_dict())
    assert plan.config["markov_head_type"] == head_type
    assert plan_shapes(plan) == formats_parallel(256, True, heads=True) | extra


def test_qwen3_8b_dspark_label_dflash_plan_is_rank_zero_dspark_layout():
    plan = plan_export(meta_parallel("dflash"), QWEN3_8B.to_dict())
    assert plan.layout == "dspark" and plan.config["markov_rank"] == 0
    assert plan.config["enable_confidence_head"] is False
    assert plan_shapes(plan) == formats_parallel(0, False, heads=True)


def test_qwen3_8b_zlab_dflash_plan_matches_formats():
    plan = plan_export(meta_parallel("dflash", labels="zlab"), QWEN3_8B.to_dict())
    assert plan.layout == "zlab-dflash"
    assert plan_shapes(plan) == formats_parallel(0, False, heads=False)
    assert plan.config["architectures"] == ["DFlashDraftModel"] and plan.config["model_type"] == "qwen3"
    assert plan.config["dflash_config"] == {"mask_token_id": 151669, "target_layer_ids": [1, 9, 17, 25, 33]}
    assert (plan.config["block_size"], plan.config["num_target_layers"], plan.config["num_hidden_layers"]) == (7, 36, 5)


def test_qwen3_8b_eagle3_plan_matches_formats():
    layer_ids = eagle3_target_layer_ids(36)
    vocab = DraftVocab(d2t=torch.zeros(32000, dtype=torch.long), t2d=torch.zeros(V, dtype=torch.bool))
    cfg = DrafterConfig(kind="eagle3", num_layers=1, block_size=7, ttt_steps=7, draft_vocab_size=32000)
    with torch.device("meta"):
        module = Eagle3Drafter(geometry_from_target_config(QWEN3_8B), cfg, layer_ids, vocab)
    plan = plan_export(LoadedDrafter(module, "eagle3", 7, layer_ids, None, None, "dspark", "training"),
                       QWEN3_8B.to_dict())
    expected = formats_decoder_layer("midlayer.", 2 * D, qk_norm=False)
    expected.update({"midlayer.hidden_norm.weight": (D,), "fc.weight": (D, 3 * D), "norm.weight": (D,),
                     "lm_head.weight": (32000, D), "d2t": (32000,), "t2d": (V,)})
    assert plan_shapes(plan) == expected
    assert plan.tensors["d2t"].dtype == torch.int64 and plan.tensors["t2d"].dtype == torch.bool
    # The engines' default hidden-state indices for 36 layers, [2, L//2, L-3], are decoder layers [1, 17, 32].
    assert plan.config["eagle_aux_hidden_state_layer_ids"] == [2, 18, 33]
    assert plan.config["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [1, 17, 32]
    assert (plan.config["architectures"], plan.config["model_type"]) == (["LlamaForCausalLMEagle3"], "llama")
    assert (plan.config["draft_vocab_size"], plan.config["target_hidden_size"], plan.config["rope_theta"]) == (
        32000, D, 1e6)
    assert plan.config["tie_word_embeddings"] is False and plan.config["num_hidden_layers"] == 1


def test_export_cli_with_calibration_and_refusal(tmp_path, target_dir, capsys):
    from deepspec_train.commands.dispatch import main
    from deepspec_train.export.engine_files import STS_FILENAME, read_sts, strict_json_loads

    cfg = tiny_recipe("dspark", target_dir)
    run = write_training_output(trained_drafter(cfg), cfg, tmp_path / "run")
    calib = tmp_path / "calib" / "calibration.json"
    calib.parent.mkdir()
    sts = {"temperatures": [1.5, 2.0, 2.5, 3.0], "num_samples": 100, "ece_before": [0.1] * 4, "ece_after": [0.01] * 4}
    calib.write_text(json.dumps({"temperatures": [9.0] * 4}))
    (calib.parent / STS_FILENAME).write_text(json.dumps(sts))
    argv = ["export", "--drafter", str(run), "--target", target_dir, "--out", str(tmp_path / "out"), "--dtype", "fp32"]
    assert main(argv + ["--calibration", str(calib), "--sps", "sps.sglang.json"]) == 0
    printed = capsys.readouterr().out
    assert "1.500 2.000 2.500 3.000" in printed
    # The 4-layer target's taps [0, 2] are what both engines capture; the serve lines use the export's paths.
    assert "vllm: captures the outputs of target decoder layers 0 2" in printed
    assert "sglang: captures the outputs of target decoder layers 0 2" in printed
    assert '"enable_adaptive_verification":true' in printed and "SGLANG_RAGGED_VERIFY_MODE=compact" in printed
    assert f"--speculative-dspark-confidence-sts-path {tmp_path / 'out' / STS_FILENAME}" in printed
    assert "--speculative-dspark-sps-table-path sps.sglang.json" in printed
    assert load_exported_drafter(tmp_path / "out").confidence_temperatures == [1.5, 2.0, 2.5, 3.0]
    assert read_sts(tmp_path / "out" / STS_FILENAME) == sts
    strict_json_loads((tmp_path / "out" / STS_FILENAME).read_text())
    readme = (tmp_path / "out" / "README.md").read_text()
    assert "--speculative-algorithm DSPARK" in readme and '"method":"dspark"' in readme
    assert main(argv[:-2] + ["--layout", "eagle3", "--out", str(tmp_path / "bad")]) == 2
    assert "export refused" in capsys.readouterr().err and not (tmp_path / "bad").exists()
    assert main(argv[:-2] + ["--out", str(tmp_path / "bad"), "--calibration", str(tmp_path / "none.json")]) == 2
    assert "no sglang_sts.json beside it" in capsys.readouterr().err and not (tmp_path / "bad").exists()
