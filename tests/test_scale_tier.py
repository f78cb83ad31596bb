"""Scale-model tier: every production recipe trains, exports, reloads and passes the serving engines' rules on a
random-weight copy of its target that keeps the target's whole architecture except its widths.

For each recipe of ``SCALE_TIER`` (``recipes/qwen3-{4b,8b,14b}{,-dflash,-eagle3}.yaml``, ``qwen3-8b-dflash2``, in
``tests/helpers/scale_world.py``):

- the target is the scale copy of ``deepspec_train.models.scale_targets`` (``Qwen3ForCausalLM``, 36 / 36 / 40
  decoder layers, vocabulary 151,936, Qwen3's special ids, 32/8, 32/8, 40/8 query/KV heads, head_dim * heads /
  hidden 1.6 / 1.0 / 1.0, tied embeddings for 4B, the published RoPE; head_dim 4, so hidden 80 / 128 / 160),
  saved with ``save_pretrained`` and loaded with ``from_pretrained``, with a tokenizer laid out like Qwen3's
  (``tests/helpers/qwen3_tokenizer.py``) loaded through ``AutoTokenizer``; the conversations go through the real
  data path (chat template with thinking off, loss mask, token shards);
- the recipe changes only in paths, sizes and step count (checked key by key against the recipe file), so its
  taps, block size 7, 512 anchors per sequence, Markov rank 256, mask id 151669, draft vocabulary 32,000, loss
  weights, target dtype bf16 and learning-rate schedule are the production ones;
- it trains 2 steps colocated (in this process); streamed = colocated is checked once per drafter kind in the
  default run (``STREAMED_BY_DEFAULT``: DSpark, DFlash and EAGLE-3 on the Qwen3-8B copy; DFlash2's wire is
  DFlash's, streamed at tiny scale by ``tests/test_dflash2_streamed.py``) and for every other recipe in the `full`
  tier (``-m full``): 1 target worker + 1 drafter worker, two real processes over gloo going through
  ``train.py``'s entry; the selected streamed runs share one launch of the two processes
  (``tests/helpers/scale_streamed_ranks.py``) to pay the interpreter start-up once, and run while the colocated
  runs do. Per-step losses and the final weights of both modes are equal (the topology differences, TP, MoE and
  uneven splits, are streamed in ``test_streaming_payloads``, ``test_target_groups`` and
  ``test_streaming_launch``);
- ``deepspec export`` writes its default layout, the loader reloads it, and the reloaded module's slot logits (and
  DSpark confidences) on a validation batch of real target features equal the trained module's (at the export's
  bf16 weights);
- ``engine_rules.check_export_dir`` passes for every engine that serves the layout, and what each engine captures
  is the trained taps and the same as at the real shapes (``production_plans``, drafters on the meta device);
- DSpark with the gated and the RNN Markov head (SGLang's ``markov_head_type``; the RNN run also with the other
  training parity switches: L1 distance, per-sequence normaliser, normal Markov init, joint confidence gradient)
  trains colocated on the Qwen3-4B copy, exports, reloads equal, is served by SGLang as trained and refused for
  vLLM, whose DSpark model has only the vanilla head.

What the tier cannot reach, and why:

- real widths: a real target is 8-28 GB of weights; the widths are the only thing shrunk, and
  ``test_production_recipes`` / ``test_export`` build the real-width drafters and export plans on the meta device;
- bf16 autocast, NCCL and flex attention: CUDA only (``train.mixed_precision=bf16`` is kept but is a no-op on CPU,
  where the dense-mask SDPA path runs); the ``gpu`` tier covers them where a GPU exists;
- 512 blocks per sequence: the recipe keeps ``anchors.num_per_sequence: 512``, but sequences of at most 96 tokens
  have fewer valid anchors, so every valid position is an anchor (512 real blocks need ~520 supervised tokens per
  sequence and V-sized logits at ~3,600 slots, minutes per step on 2 CPU cores);
- vLLM and SGLang themselves: not installed here (they need a GPU); ``export/engine_rules.py`` states their rules;
- W&B and tokenisation worker processes: ``logging.wandb=false`` and ``data.num_workers=0`` because each costs a
  process start per run; ``test_logging_sinks`` and ``test_data_token_shards`` cover them.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from transformers import AutoConfig, AutoTokenizer

from deepspec_train.commands.dispatch import main as deepspec
from deepspec_train.config.loader import config_to_dict
from deepspec_train.kinds.recipe_validation import load_recipe
from deepspec_train.config.schema import RecipeConfig
from deepspec_train.export.engine_rules import EngineRuleError, check_export_dir
from deepspec_train.serving_layouts.engine_reading import ENGINES
from deepspec_train.serving_layouts.layout_registry import layout_of_config
from deepspec_train.formats.drafter_loader import load_exported_drafter
from deepspec_train.export.production_plans import PRODUCTION_RECIPES, production_readings
from deepspec_train.formats.trained_drafter import read_trained_drafter
from deepspec_train.jobs.assembly import load_token_datasets
from deepspec_train.jobs.run import run_training
from deepspec_train.models.scale_targets import SCALE_HEAD_DIM, SCALE_TARGETS, scale_target_config
from deepspec_train.training.distributed import DistContext
from tests.helpers.qwen3_tokenizer import QWEN3_TOKEN_IDS
from tests.helpers.long_context_world import LONG_CONTEXT_TIER
from tests.helpers.opt_in_markers import selected_params
from tests.helpers.scale_checks import (
    CHANGED_KEYS, assert_export_reloads, drop_final_checkpoint, flat_config, validation_batch,
)
from tests.helpers.scale_world import (
    SCALE_TIER, TRAIN_CONVERSATIONS, VALIDATION_CONVERSATIONS, build_scale_world, scale_overrides,
)
from tests.helpers.scale_streamed_ranks import launch_streamed
from tests.helpers.streaming_world import free_port, step_losses

# One intra-op thread here, as in the streamed ranks: the colocated and streamed runs then reduce in the same order
# and their final weights are bit-identical, not only their losses.
pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_torch_thread")]

# Config entries that record where and how a config was saved, not the architecture.
SAVE_RECORDS = {"_name_or_path", "dtype", "transformers_version"}
# Streamed = colocated in the default run: one recipe per drafter kind, on one target. Streaming reads the kind
# (what crosses the wire) and the topology, not the target's depth or vocabulary, which the colocated runs of every
# recipe cover; the other recipes stream in the full tier. DFlash2 sends DFlash's tensors: its streamed = colocated
# check in the default run is the tiny one of tests/test_dflash2_streamed.py, the Qwen3-8B copy's is in the full tier.
STREAMED_BY_DEFAULT = ("qwen3-8b", "qwen3-8b-dflash", "qwen3-8b-eagle3")
# Trained colocated in the full tier only: Qwen3-235B-A22B is Qwen3-30B-A3B's MoE architecture (routed experts,
# 4 KV heads) at 94 layers, which the default run still reads in its copy (the published-architecture test below)
# and in its recipe's real-shape export (tests/test_engine_rules.py); docs/contributors/testing.md pairs them.
TRAINED_IN_FULL_TIER_ONLY = ("qwen3-235b-a22b",)


@pytest.fixture(scope="session")
def scale_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("scale_tier")


@pytest.fixture(scope="session")
def scale_worlds(scale_root: Path) -> dict[str, dict[str, str]]:
    """One world per scale target, shared by the recipes that train on it."""
    return {name: build_scale_world(scale_root / name, name) for name in sorted(set(SCALE_TIER.values()))}


def _overrides(worlds: dict, root: Path, recipe: str, mode: str, **extra: object) -> list[str]:
    world = worlds[SCALE_TIER[recipe]]
    # One shard cache per mode: the streamed target worker and this process tokenise at the same time.
    return scale_overrides(world, root / "runs" / recipe / mode, **{"data.cache_dir": f"{world['cache']}-{mode}"},
                           **extra)


@pytest.fixture(scope="session")
def streamed_launch(request: pytest.FixtureRequest, scale_root: Path, scale_worlds: dict):
    """One launch of the streamed runs this pytest run compares (none: no launch)."""
    runs = {}
    for recipe in selected_params(request.session, "test_streamed_run_matches_colocated", "recipe"):
        argv = [f"recipe={recipe}", *_overrides(scale_worlds, scale_root, recipe, "streamed",
                                                **{"topology.target_workers": 1, "topology.target_tp": 1})]
        runs[recipe] = {"port": free_port(), "argv": argv, "output_dir": scale_root / "runs" / recipe / "streamed"}
    launch = launch_streamed(runs, scale_root) if runs else None
    yield launch
    if launch is not None:
        launch.stop()


@pytest.fixture(scope="session")
def colocated_runs(scale_root: Path, scale_worlds: dict):
    """``run(recipe)``: the recipe's colocated run (its validated config), trained once per session."""
    done: dict[str, RecipeConfig] = {}

    def run(recipe: str) -> RecipeConfig:
        if recipe not in done:
            overrides = _overrides(scale_worlds, scale_root, recipe, "colocated",
                                   **{"topology.target_workers": 0, "topology.target_tp": 1})
            cfg = load_recipe(recipe, overrides)
            summary = run_training(cfg)
            assert summary is not None and summary.steps == 2
            done[recipe] = cfg
        return done[recipe]

    return run


def test_tier_covers_every_production_recipe() -> None:
    # The 32K recipes train at length in the long-context tier (tests/test_long_context_tier.py).
    assert sorted(SCALE_TIER | LONG_CONTEXT_TIER) == sorted(PRODUCTION_RECIPES)
    assert not SCALE_TIER.keys() & LONG_CONTEXT_TIER.keys()
    for recipe, target in SCALE_TIER.items():
        assert Path(load_recipe(recipe, check_target=False).target.path).name == target


def _architecture(config: dict) -> dict:
    return {key: value for key, value in config.items() if key not in SAVE_RECORDS}


@pytest.mark.parametrize("name", sorted(set(SCALE_TIER.values())))
def test_scale_target_keeps_the_published_architecture(scale_worlds: dict, name: str) -> None:
    target = SCALE_TARGETS[name]
    reference = target.reference().to_dict()
    widths = target.shrink(target.reference())
    saved = AutoConfig.from_pretrained(scale_worlds[name]["target"])
    # Saved in bf16 like the published checkpoints; nothing else differs from the derived config.
    assert str(saved.dtype).removeprefix("torch.") == "bfloat16"
    scaled = _architecture(saved.to_dict())
    assert scaled == _architecture(scale_target_config(name).to_dict())
    # Only the widths differ, all by one factor, so head_dim * heads / hidden and the MLP ratio are the published.
    assert {key for key in _architecture(reference) if reference[key] != scaled.get(key)} == set(widths)
    assert len({reference[key] / scaled[key] for key in widths}) == 1
    assert saved.head_dim == SCALE_HEAD_DIM
    heads = saved.num_attention_heads
    assert saved.head_dim * heads / saved.hidden_size == reference["head_dim"] * heads / reference["hidden_size"]
    tokenizer = AutoTokenizer.from_pretrained(scale_worlds[name]["target"])
    assert {token: tokenizer.convert_tokens_to_ids(token) for token in QWEN3_TOKEN_IDS} == QWEN3_TOKEN_IDS
    assert (tokenizer.eos_token_id, tokenizer.pad_token_id) == (saved.eos_token_id, saved.bos_token_id)
    # Like Qwen3: 151,669 tokenizer entries, the mask id 151669 the first unused one of 151,936 embedding rows.
    assert len(tokenizer) == 151669 < saved.vocab_size == 151936
    text = tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False,
                                         add_generation_prompt=True, enable_thinking=False)
    assert text == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"


def _validation_batch(cfg):
    """A validation micro-batch of real target features, as the trainer's validation builds it."""
    ctx = DistContext(0, 1, 0, torch.device("cpu"), None)
    datasets = load_token_datasets(cfg, ctx)
    # The data path kept every conversation (none refused by the template or cut by data.max_length).
    assert (len(datasets["train"]), len(datasets["validation"])) == (TRAIN_CONVERSATIONS, VALIDATION_CONVERSATIONS)
    return validation_batch(cfg, datasets["validation"])


@pytest.mark.parametrize("recipe", [pytest.param(r, marks=pytest.mark.full) if r in TRAINED_IN_FULL_TIER_ONLY else r
                                    for r in SCALE_TIER])
def test_recipe_trains_exports_reloads_and_passes_the_engine_rules(
    recipe: str, colocated_runs, streamed_launch, capsys
) -> None:
    """(``streamed_launch`` is asked for only to start the streamed runs early, beside the colocated ones.)"""
    production = load_recipe(recipe, check_target=False)
    cfg = colocated_runs(recipe)
    run_dir = Path(cfg.run.output_dir)
    original, scaled = flat_config(config_to_dict(production)), flat_config(config_to_dict(cfg))
    assert {key for key in original if original[key] != scaled[key]} <= CHANGED_KEYS
    assert sorted(step_losses(run_dir)) == [1, 2]
    drop_final_checkpoint(run_dir)

    target = cfg.target.path
    export_dir = run_dir.parent / "export"
    argv = ["export", "--drafter", str(run_dir / "drafter"), "--target", target, "--out", str(export_dir)]
    assert deepspec(argv) == 0
    printed = capsys.readouterr().out

    assert_export_reloads(run_dir / "drafter", export_dir, target, _validation_batch(cfg))

    config = json.loads((export_dir / "config.json").read_text())
    _check_export_fields(config, cfg)
    readings = {r.engine: r for r in check_export_dir(export_dir, target)}
    served = [engine for engine in ENGINES if readings[engine].unserved is None]
    # SGLang's DSPARK needs a Markov head: the DSpark-label DFlash (rank 0 in the DSpark layout) is vLLM's only, and
    # so is a DSpark over a reduced draft vocabulary (the speculators layout).
    rank_zero_dspark = layout_of_config(config) == "dspark" and config["markov_rank"] == 0
    vllm_only = rank_zero_dspark or layout_of_config(config) == "speculators-dspark"
    assert served == (["vllm"] if vllm_only else list(ENGINES))
    real_shapes = {r.engine: r for r in production_readings(recipe)}
    for engine in ENGINES:
        reading = readings[engine]
        assert (reading.unserved is None) == (real_shapes[engine].unserved is None)
        if reading.unserved is None:
            assert reading.captured_layers == cfg.target.layer_ids == real_shapes[engine].captured_layers
            taps = " ".join(map(str, reading.captured_layers))
            assert f"{engine}: captures the outputs of target decoder layers {taps}" in printed


def _check_export_fields(config: dict, cfg: RecipeConfig) -> None:
    """The production settings an engine reads from the export's config.json."""
    layout = layout_of_config(config)
    target_layers = scale_target_config(SCALE_TIER[cfg.run.name]).num_hidden_layers
    assert (config["vocab_size"], config["num_target_layers"]) == (151936, target_layers)
    if layout in ("dspark", "speculators-dspark"):
        assert (config["block_size"], config["markov_rank"], config["mask_token_id"]) == (
            cfg.drafter.block_size, cfg.drafter.markov_rank, 151669)
        assert config["enable_confidence_head"] == cfg.drafter.confidence_head
    if layout == "speculators-dspark":
        assert config["draft_vocab_size"] == cfg.drafter.draft_vocab_size == 32000
        assert config["aux_hidden_state_layer_ids"] == [k + 1 for k in cfg.target.layer_ids]
    elif layout == "dflash2":
        d = cfg.drafter
        assert config["dflash_config"] == {
            "mask_token_id": 151669, "target_layer_ids": cfg.target.layer_ids, "block_size": d.block_size,
            "sample_from_anchor": False, "conv_kernel_size": d.conv_kernel_size, "conv_group_size": d.conv_group_size,
            "selector_rank": d.selector_rank, "selector_top_k": d.selector_top_k,
        }
        assert config["block_size"] == d.block_size == 8
    elif layout != "dspark":
        assert layout == "eagle3" and config["draft_vocab_size"] == cfg.drafter.draft_vocab_size == 32000


@pytest.mark.parametrize("recipe", [pytest.param(recipe, marks=() if recipe in STREAMED_BY_DEFAULT else pytest.mark.full)
                                    for recipe in SCALE_TIER])
def test_streamed_run_matches_colocated(recipe: str, colocated_runs, streamed_launch) -> None:
    colocated = Path(colocated_runs(recipe).run.output_dir)
    streamed = streamed_launch.output_dir(recipe)
    assert step_losses(streamed) == step_losses(colocated)
    assert sorted(step_losses(streamed)) == [1, 2]
    records = [json.loads(line) for line in (streamed / "metrics.jsonl").read_text().splitlines()]
    assert len([r for r in records if "stream/wire_bytes_per_supervised_token" in r]) == 2
    got, expected = read_trained_drafter(streamed / "drafter"), read_trained_drafter(colocated / "drafter")
    assert got.weights.keys() == expected.weights.keys()
    assert all(torch.equal(got.weights[name], expected.weights[name]) for name in expected.weights)
    drop_final_checkpoint(streamed)
    # Both runs and the export passed every check: free the recipe's ~1 GB of DSpark drafter files.
    shutil.rmtree(streamed.parent)


PARITY_SWITCHES = {"loss.distance": "l1", "loss.normalizer": "sequence", "drafter.markov_init": "normal",
                   "drafter.confidence_gradient": "joint"}


@pytest.mark.parametrize("head_type", ["gated", "rnn"])
def test_sequential_markov_heads_export_for_sglang_only(head_type: str, scale_root: Path, scale_worlds: dict,
                                                        capsys) -> None:
    recipe = "qwen3-4b"
    world = scale_worlds[SCALE_TIER[recipe]]
    run_dir = scale_root / "runs" / f"{recipe}-{head_type}"
    extra = {"drafter.markov_head_type": head_type, "topology.target_workers": 0, "topology.target_tp": 1,
             "data.cache_dir": f"{world['cache']}-colocated", **(PARITY_SWITCHES if head_type == "rnn" else {})}
    cfg = load_recipe(recipe, scale_overrides(world, run_dir / "colocated", **extra))
    assert run_training(cfg).steps == 2
    trained_dir = Path(cfg.run.output_dir)
    drop_final_checkpoint(trained_dir)
    export_dir = run_dir / "export"
    argv = ["export", "--drafter", str(trained_dir / "drafter"), "--target", cfg.target.path, "--out", str(export_dir)]
    assert deepspec(argv) == 0
    printed = capsys.readouterr().out
    assert "vllm: not served: vLLM's qwen3_dspark builds only the vanilla Markov head" in printed

    config = json.loads((export_dir / "config.json").read_text())
    assert config["markov_head_type"] == head_type
    _check_export_fields(config, cfg)
    reloaded = load_exported_drafter(export_dir, cfg.target.path, dtype=torch.float32).module
    assert reloaded.markov_head.head_type == head_type
    assert_export_reloads(trained_dir / "drafter", export_dir, cfg.target.path, _validation_batch(cfg))

    readings = {r.engine: r for r in check_export_dir(export_dir, cfg.target.path)}
    assert readings["sglang"].unserved is None and readings["sglang"].captured_layers == cfg.target.layer_ids
    assert "serve it with SGLang" in readings["vllm"].unserved
    with pytest.raises(EngineRuleError, match=f"vllm: does not serve this export: .*a {head_type} head"):
        check_export_dir(export_dir, cfg.target.path, engines=["vllm"])
    shutil.rmtree(run_dir)
