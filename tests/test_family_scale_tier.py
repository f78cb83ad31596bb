"""Scale-model tier of the target families beyond Qwen3: every family production recipe (``FAMILY_TIER`` in
``tests/family_world.py``: Llama 3.1-8B DSpark / DFlash / EAGLE-3, Llama 3.3-70B, Gemma 3 12B, GPT-OSS 20B and
120B, DeepSeek-V3, Kimi-K2) trains on a random-weight copy of its target that keeps the published architecture
(layer count, vocabulary, special ids, heads, RoPE, sliding windows, experts, MLA ranks) with its widths shrunk
(``models.scale_targets``), next to a tokenizer laid out like the real one (``tests/family_tokenizers.py``: real
special ids, the real chat format; GPT-OSS in harmony, an answer's reasoning in the analysis channel).

For each recipe, as ``tests/test_scale_tier.py`` does for Qwen3: the recipe changes only in paths, sizes and step
count; it trains 2 steps colocated; in the `full` tier (``-m full``) also 2 steps streamed (one target worker, one
drafter worker, two real processes over gloo through ``train.py``'s entry, all recipes in one launch), with equal
losses and equal final weights (the default run checks streamed = colocated once per drafter kind and topology:
the wire carries the same tensors whatever family computed them);
``deepspec export`` writes the default layout, the loader reloads it and its outputs on a validation batch of real
target features equal the trained drafter's; and the engine readings are the family's: every engine that
serves the layout for the architecture captures exactly the trained taps (as at the real shapes), every other
one is named as not serving it while the export is still written (Gemma 3: vLLM captures no layers for it,
SGLang's DFLASH / DSPARK refuse it).

What the tier leaves out is what ``test_scale_tier`` leaves out (real widths, bf16 autocast, NCCL, the engines
themselves); in addition the experts of GPT-OSS and DeepSeek-V3 / Kimi-K2 are narrower than one width factor
(``scale_targets.shrink_family``) and the sliding windows (128 / 1024 tokens) are longer than the tier's
160-token sequences, so only the evaluator's tests (``test_family_targets``) decode past a window.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from deepspec_train.config.loader import config_to_dict
from deepspec_train.export.engine_rules import ENGINES, check_export_dir
from deepspec_train.export.production_plans import FAMILY_RECIPES, production_readings
from deepspec_train.families.catalog import family_of
from deepspec_train.formats.drafter_loader import load_exported_drafter
from deepspec_train.formats.trained_drafter import read_trained_drafter
from deepspec_train.jobs.assembly import chunk_builder, load_token_datasets, validation_pass, validation_plan
from deepspec_train.commands.dispatch import main as deepspec
from deepspec_train.jobs.run import run_training
from deepspec_train.serving_layouts.layout_registry import layout_of_config, serving_layout
from deepspec_train.models.scale_targets import scale_target_config
from deepspec_train.target.hidden_states import TargetTap
from deepspec_train.target.loading import load_target_model
from deepspec_train.training.distributed import DistContext
from deepspec_train.kinds.recipe_validation import load_recipe
from tests.helpers.tiny_drafter import drafter_outputs
from tests.helpers.family_world import FAMILY_TIER, build_family_world
from tests.helpers.opt_in_markers import selected_params
from tests.helpers.scale_world import scale_overrides
from tests.helpers.streaming_world import free_port, read_logs, start_ranks, step_losses, wait_all
from tests.helpers.scale_checks import CHANGED_KEYS, assert_parses_as_the_drafter, drop_final_checkpoint, flat_config

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_torch_thread")]
STREAMED_TIMEOUT_S = 1500
# Longer than the Qwen3 tier's 96: harmony's default system message alone is about 50 tokens.
MAX_LENGTH = 160


@pytest.fixture(scope="module")
def family_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("family_tier")


# Trained colocated in the full tier only: each shares its architecture, tokenizer and chat format with a recipe
# the default run trains (Kimi-K2 with DeepSeek-V3: 61 layers, MLA, routed experts; GPT-OSS 120B with 20B: harmony,
# sinks, sliding windows), and Kimi-K2's own vocabulary and special ids are read in the default run by
# tests/test_family_targets.py. docs/contributors/testing.md pairs them.
FULL_TIER_ONLY = ("kimi-k2", "gpt-oss-120b")


def _tier_params() -> list:
    return [pytest.param(r, marks=pytest.mark.full) if r in FULL_TIER_ONLY else r for r in FAMILY_TIER]


@pytest.fixture(scope="module")
def family_worlds(request: pytest.FixtureRequest, family_root: Path) -> dict[str, dict[str, str]]:
    """The worlds of the recipes this run trains: a recipe left to the full tier costs a default run nothing."""
    tests = ("test_family_recipe_trains_exports_reloads_and_passes_the_engine_rules",
             "test_family_streamed_run_matches_colocated")
    recipes = {r for name in tests for r in selected_params(request.session, name, "recipe")}
    return {name: build_family_world(family_root / name, name) for name in sorted({FAMILY_TIER[r] for r in recipes})}


def _overrides(worlds: dict, root: Path, recipe: str, mode: str, target_workers: int) -> list[str]:
    world = worlds[FAMILY_TIER[recipe]]
    return scale_overrides(world, root / "runs" / recipe / mode, **{
        "data.cache_dir": f"{world['cache']}-{mode}", "topology.target_workers": target_workers,
        "topology.target_tp": 1, "data.max_length": MAX_LENGTH})


@pytest.fixture(scope="module")
def streamed(request: pytest.FixtureRequest, family_root: Path, family_worlds: dict):
    """The recipes this pytest run streams (full tier) in one 2-process launch, started before the colocated runs;
    ``wait()`` joins it."""
    recipes = selected_params(request.session, "test_family_streamed_run_matches_colocated", "recipe")
    if not recipes:
        yield None
        return
    runs = [{"port": free_port(), "argv": [f"recipe={r}", *_overrides(family_worlds, family_root, r, "streamed", 1)]}
            for r in recipes]
    runs_file = family_root / "streamed_runs.json"
    runs_file.write_text(json.dumps(runs))
    log_dir = family_root / "streamed_logs"
    procs = start_ranks(["-m", "tests.helpers.scale_streamed_ranks", str(runs_file)], 2, log_dir)
    codes: list[int] = []

    def wait() -> None:
        if not codes:
            codes.extend(wait_all(procs, STREAMED_TIMEOUT_S))
        assert codes == [0, 0], f"exit codes {codes}\n{read_logs(log_dir, 2)[-6000:]}"

    yield wait
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.fixture(scope="module")
def colocated(family_root: Path, family_worlds: dict):
    done: dict[str, object] = {}

    def run(recipe: str):
        if recipe not in done:
            cfg = load_recipe(recipe, _overrides(family_worlds, family_root, recipe, "colocated", 0))
            assert run_training(cfg).steps == 2
            done[recipe] = cfg
        return done[recipe]

    return run


def test_tier_covers_every_family_recipe() -> None:
    assert sorted(FAMILY_TIER) == sorted(FAMILY_RECIPES)


def _validation_batch(cfg):
    ctx = DistContext(0, 1, 0, torch.device("cpu"), None)
    rows = load_token_datasets(cfg, ctx)["validation"]
    tap = TargetTap(load_target_model(cfg.target, ctx.device), cfg.target.layer_ids)
    return validation_pass(validation_plan(cfg, rows, 0, 1), chunk_builder(cfg, tap, ctx.device))()[0]


@pytest.mark.parametrize("recipe", _tier_params())
def test_family_recipe_trains_exports_reloads_and_passes_the_engine_rules(recipe: str, colocated, streamed,
                                                                          capsys) -> None:
    production = load_recipe(recipe, check_target=False)
    cfg = colocated(recipe)
    original, scaled = flat_config(config_to_dict(production)), flat_config(config_to_dict(cfg))
    assert {key for key in original if original[key] != scaled[key]} <= CHANGED_KEYS
    run_dir = Path(cfg.run.output_dir)
    assert sorted(step_losses(run_dir)) == [1, 2]
    drop_final_checkpoint(run_dir)

    target = cfg.target.path
    export_dir = run_dir.parent / "export"
    assert deepspec(["export", "--drafter", str(run_dir / "drafter"), "--target", target, "--out",
                     str(export_dir)]) == 0
    printed = capsys.readouterr().out
    trained = load_exported_drafter(run_dir / "drafter", target).module.to(torch.bfloat16).float()
    reloaded = load_exported_drafter(export_dir, target, dtype=torch.float32).module
    batch = _validation_batch(cfg)
    expected, got = drafter_outputs(trained, batch), drafter_outputs(reloaded, batch)
    assert expected.keys() == got.keys() and all(torch.equal(expected[k], got[k]) for k in expected)

    config = json.loads((export_dir / "config.json").read_text())
    assert_parses_as_the_drafter(config, reloaded.state_dict(), reloaded.geometry)
    target_config = scale_target_config(FAMILY_TIER[recipe])
    assert (config["vocab_size"], config["num_target_layers"]) == (target_config.vocab_size,
                                                                   target_config.num_hidden_layers)
    layout = layout_of_config(config)
    if layout == "dspark":
        assert config["mask_token_id"] == cfg.drafter.mask_token_id
    family = family_of(target_config.to_dict())
    readings = {r.engine: r for r in check_export_dir(export_dir, target)}
    real_shapes = {r.engine: r for r in production_readings(recipe)}
    rank_zero = layout == "dspark" and config["markov_rank"] == 0
    for engine in ENGINES:
        reading = readings[engine]
        serves = family.engines[engine].unserved(serving_layout(layout).capture) is None and not (rank_zero and engine == "sglang")
        assert (reading.unserved is None) == serves == (real_shapes[engine].unserved is None), (engine, reading)
        if serves:
            assert reading.captured_layers == cfg.target.layer_ids == real_shapes[engine].captured_layers
            taps = " ".join(map(str, reading.captured_layers))
            assert f"{engine}: captures the outputs of target decoder layers {taps}" in printed
        else:
            assert f"{engine}: not served: {reading.unserved}" in printed


@pytest.mark.full
@pytest.mark.parametrize("recipe", list(FAMILY_TIER))
def test_family_streamed_run_matches_colocated(recipe: str, colocated, streamed, family_root: Path) -> None:
    local = Path(colocated(recipe).run.output_dir)
    streamed()
    remote = family_root / "runs" / recipe / "streamed"
    assert step_losses(remote) == step_losses(local) and sorted(step_losses(remote)) == [1, 2]
    got, expected = read_trained_drafter(remote / "drafter"), read_trained_drafter(local / "drafter")
    assert got.weights.keys() == expected.weights.keys()
    assert all(torch.equal(got.weights[name], expected.weights[name]) for name in expected.weights)
    drop_final_checkpoint(remote)
    shutil.rmtree(remote.parent)
