"""Long-context tier: the 32K production recipes train at length on scale copies of Qwen3-8B.

Default run (length at its production value with minimal width, heads and depth):

- (m) 32,768 tokens on the minimal copy: 4 decoder layers (three taps, the most 4 layers hold), 2 query heads on
  1 key-value head, Qwen3-8B's vocabulary 151,936 and widths (``MINIMAL_HEADS``). ``qwen3-8b-32k`` trains 2
  steps on one long thinking conversation (short prompt, a reasoning trace and answer that reach the end of the
  sequence), colocated and streamed (1 target + 1 drafter process over gloo) with equal losses and bit-identical
  weights, exports, reloads to the trained drafter and passes both engines' rules; ``qwen3-8b-eagle3-32k`` trains
  2 steps colocated, exports and is served by both engines.
- (c) At 32,768 context rows, activation checkpointing on and off give the same loss and gradients for both
  recipes' drafters, DSpark and EAGLE-3, at the minimal copy's heads (the tiny-shape check of every kind is
  ``test_activation_checkpointing``).

`full` tier (``-m full``), the cross product with the production heads and depth:

- (a) Full depth at 8,192 tokens: the Qwen3-8B scale copy (all 36 decoder layers, 32/8 heads, widths shrunk as in
  ``tests/test_scale_tier.py``), ``qwen3-8b-32k`` colocated and streamed, equal; export, reload, engine rules.
- (b) 32,768 tokens on a 4-layer copy with the production heads (32/8): ``qwen3-8b-32k`` colocated and streamed,
  equal; ``qwen3-8b-eagle3-32k`` colocated, exported and served; (c) at 32 heads.

Every run is ``qwen3-8b-32k`` / ``qwen3-8b-eagle3-32k`` changed only in paths, sizes and steps (``data.max_length``,
one sequence a step, the anchor rule scaled down) and, on the 4-layer copies, the taps. Every run keeps
``drafter.activation_checkpointing`` on, as the recipes do. The cost is the target's causal attention, heads x
L^2 / 2 scores per layer (``tests/helpers/long_context_world.py``); docs/contributors/testing.md has the times.
"""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

import pytest
import torch
from transformers import AutoConfig

from bench.activation_checkpointing import long_context_batch
from deepspec_train.config.loader import config_to_dict
from deepspec_train.config.schema import RecipeConfig
from deepspec_train.export.engine_rules import check_export_dir
from deepspec_train.export.production_plans import PRODUCTION_RECIPES, production_readings
from deepspec_train.formats.trained_drafter import read_trained_drafter
from deepspec_train.jobs.assembly import load_token_datasets
from deepspec_train.commands.dispatch import main as deepspec
from deepspec_train.jobs.run import run_training
from deepspec_train.serving_layouts.engine_reading import ENGINES
from deepspec_train.kinds.registry import kind_spec
from deepspec_train.models.geometry import geometry_from_target_config
from deepspec_train.models.scale_targets import scale_target_config
from deepspec_train.training.batch_loss import DrafterLoss
from deepspec_train.training.distributed import DistContext
from deepspec_train.kinds.recipe_validation import load_recipe
from tests.helpers.long_context_world import (
    HEADROOM, LONG_CONTEXT_TIER, MINIMAL_HEADS, SHORT_COPY_LAYERS, SHORT_COPY_TAPS, build_long_world, long_overrides,
)
from tests.helpers.opt_in_markers import selected_params
from tests.helpers.scale_checks import (
    CHANGED_KEYS, assert_export_reloads, drop_final_checkpoint, flat_config, validation_batch,
)
from tests.helpers.scale_streamed_ranks import launch_streamed
from tests.helpers.streaming_world import free_port, step_losses

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_torch_thread")]

FULL_DEPTH_LENGTH = 8192
LONG_LENGTH = 32768
STREAM_TIMEOUT_S = 1800


@dataclasses.dataclass(frozen=True)
class Case:
    """One long-context run: the recipe, the world it trains on, whether it also runs streamed and whether the
    default run has it (else the `full` tier)."""

    recipe: str
    world: str
    streamed: bool
    default: bool
    extra: tuple[tuple[str, object], ...] = ()


SHORT_TAPS = (("target.layer_ids", SHORT_COPY_TAPS),)
CASES = {
    "dspark-32k-minimal": Case("qwen3-8b-32k", "minimal", True, True, SHORT_TAPS),
    # EAGLE-3's three taps are the three a 4-layer copy holds; colocated only (the wire is DSpark's, tested above).
    "eagle3-32k-minimal": Case("qwen3-8b-eagle3-32k", "minimal", False, True, SHORT_TAPS),
    "dspark-8k": Case("qwen3-8b-32k", "full-depth", True, False),
    "dspark-32k": Case("qwen3-8b-32k", "four-layers", True, False, SHORT_TAPS),
    "eagle3-32k": Case("qwen3-8b-eagle3-32k", "four-layers", False, False, SHORT_TAPS),
}
# World -> (length, layers (0: all 36), heads (None: the copy's 32/8)).
WORLDS = {"minimal": (LONG_LENGTH, SHORT_COPY_LAYERS, MINIMAL_HEADS), "full-depth": (FULL_DEPTH_LENGTH, 0, None),
          "four-layers": (LONG_LENGTH, SHORT_COPY_LAYERS, None)}


def _cases(keep) -> list:
    """``pytest.param`` of each case name ``keep(case)`` accepts, the `full` tier's ones marked."""
    return [pytest.param(name, marks=() if case.default else pytest.mark.full)
            for name, case in CASES.items() if keep(case)]


# Beyond the scale tier's paths, sizes and steps: the anchor floor and rate (sizes) and, on the 4-layer copy
# only, the taps.
LONG_CHANGED_KEYS = CHANGED_KEYS | {"anchors.num_per_sequence", "anchors.per_1k_tokens"}


@pytest.fixture(scope="module")
def long_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("long_context_tier")


@pytest.fixture(scope="module")
def long_worlds(long_root: Path) -> dict[str, dict[str, str]]:
    """Each world on first use (a default run never writes the 36-layer copy)."""

    class Worlds(dict):
        def __missing__(self, name: str) -> dict[str, str]:
            length, layers, heads = WORLDS[name]
            self[name] = build_long_world(long_root / name, length, layers, heads=heads)
            return self[name]

    return Worlds()


def _overrides(worlds: dict, root: Path, name: str, mode: str, workers: int) -> list[str]:
    case = CASES[name]
    world = worlds[case.world]
    extra = {"data.cache_dir": f"{world['cache']}-{mode}", "topology.target_workers": workers,
             "topology.target_tp": 1, **dict(case.extra)}
    if workers:
        # One long target forward takes a CPU a minute or two (several under load): not a hung peer.
        extra["stream.timeout_s"] = STREAM_TIMEOUT_S
    return long_overrides(world, root / "runs" / name / mode, WORLDS[case.world][0], **extra)


@pytest.fixture(scope="module")
def streamed_launch(request: pytest.FixtureRequest, long_root: Path, long_worlds: dict):
    """One launch of the streamed runs this pytest run compares (none: no launch)."""
    runs = {
        name: {"port": free_port(), "argv": [f"recipe={CASES[name].recipe}", *_overrides(long_worlds, long_root,
                                                                                         name, "streamed", 1)],
               "output_dir": long_root / "runs" / name / "streamed"}
        for name in selected_params(request.session, "test_streamed_run_matches_colocated_at_length", "name")
    }
    launch = launch_streamed(runs, long_root, timeout_s=2 * STREAM_TIMEOUT_S) if runs else None
    yield launch
    if launch is not None:
        launch.stop()


@pytest.fixture(scope="module")
def colocated_runs(long_root: Path, long_worlds: dict, streamed_launch):
    """``run(name)``: the case's colocated run (its validated config), trained once per module while the streamed
    launch runs beside it."""
    done: dict[str, RecipeConfig] = {}

    def run(name: str) -> RecipeConfig:
        if name not in done:
            cfg = load_recipe(CASES[name].recipe, _overrides(long_worlds, long_root, name, "colocated", 0))
            summary = run_training(cfg)
            assert summary is not None and summary.steps == 2
            done[name] = cfg
        return done[name]

    return run


def test_tier_covers_the_long_context_recipes() -> None:
    assert sorted(LONG_CONTEXT_TIER) == sorted(r for r in PRODUCTION_RECIPES if r.endswith("-32k"))
    assert {CASES[name].recipe for name in CASES} <= set(LONG_CONTEXT_TIER)


def _check_run(name: str, cfg: RecipeConfig) -> list[dict]:
    """The recipe changed only where the tier may, and the data holds one sequence at the tier's length whose
    supervised span runs from a short prompt to the far end; returns the training token rows."""
    case = CASES[name]
    production = flat_config(config_to_dict(load_recipe(case.recipe, check_target=False)))
    scaled = flat_config(config_to_dict(cfg))
    allowed = LONG_CHANGED_KEYS | {key for key, _ in case.extra}
    assert {key for key in production if production[key] != scaled[key]} <= allowed
    assert cfg.drafter.activation_checkpointing and cfg.data.enable_thinking
    assert sorted(step_losses(Path(cfg.run.output_dir))) == [1, 2]
    datasets = load_token_datasets(cfg, DistContext(0, 1, 0, torch.device("cpu"), None))
    length = WORLDS[case.world][0]
    masks = [torch.as_tensor(row["loss_mask"]).bool() for row in datasets["train"]]
    longest = max(masks, key=len)
    assert length - 2 * HEADROOM <= len(longest) <= length
    supervised = torch.nonzero(longest).squeeze(1)
    assert int(supervised[0]) < 64 and int(supervised[-1]) >= len(longest) - 8
    return datasets


def _export(cfg: RecipeConfig, capsys) -> tuple[Path, Path]:
    """``deepspec export`` of the run's drafter (its final checkpoint dropped first): (run dir, export dir)."""
    run_dir = Path(cfg.run.output_dir)
    drop_final_checkpoint(run_dir)
    export_dir = run_dir.parent / "export"
    argv = ["export", "--drafter", str(run_dir / "drafter"), "--target", cfg.target.path, "--out", str(export_dir)]
    assert deepspec(argv) == 0
    capsys.readouterr()
    return run_dir, export_dir


@pytest.mark.full
def test_full_depth_copy_trains_exports_and_passes_the_engine_rules(colocated_runs, capsys) -> None:
    name = "dspark-8k"
    cfg = colocated_runs(name)
    datasets = _check_run(name, cfg)
    run_dir, export_dir = _export(cfg, capsys)
    assert_export_reloads(run_dir / "drafter", export_dir, cfg.target.path,
                          validation_batch(cfg, datasets["validation"]))
    readings = {r.engine: r for r in check_export_dir(export_dir, cfg.target.path)}
    real_shapes = {r.engine: r for r in production_readings(CASES[name].recipe)}
    # DSpark in the DeepSpec layout: both engines serve it, capturing the trained taps.
    for engine in ENGINES:
        assert readings[engine].unserved is None and real_shapes[engine].unserved is None
        assert readings[engine].captured_layers == cfg.target.layer_ids == real_shapes[engine].captured_layers
    shutil.rmtree(export_dir)


def test_32k_dspark_trains_exports_and_passes_the_engine_rules_on_the_minimal_copy(colocated_runs, capsys) -> None:
    name = "dspark-32k-minimal"
    cfg = colocated_runs(name)
    datasets = _check_run(name, cfg)
    # Only the depth and the heads differ from the full scale copy: the vocabulary and widths are Qwen3-8B's.
    saved, full = AutoConfig.from_pretrained(cfg.target.path).to_dict(), scale_target_config("Qwen3-8B").to_dict()
    depth_heads_and_records = {"num_hidden_layers", "num_attention_heads", "num_key_value_heads", "layer_types",
                               "transformers_version", "dtype", "_name_or_path"}
    assert {key for key in full if saved.get(key) != full[key]} <= depth_heads_and_records
    assert (saved["num_hidden_layers"], saved["num_attention_heads"], saved["num_key_value_heads"],
            saved["vocab_size"], saved["hidden_size"]) == (4, *MINIMAL_HEADS, 151936, full["hidden_size"])
    run_dir, export_dir = _export(cfg, capsys)
    assert_export_reloads(run_dir / "drafter", export_dir, cfg.target.path,
                          validation_batch(cfg, datasets["validation"]))
    # DSpark in the DeepSpec layout: both engines serve it, capturing the trained taps.
    for reading in check_export_dir(export_dir, cfg.target.path):
        assert reading.unserved is None and reading.captured_layers == cfg.target.layer_ids
    shutil.rmtree(export_dir)


@pytest.mark.full
def test_32k_sequence_trains_on_the_four_layer_copy(colocated_runs) -> None:
    cfg = colocated_runs("dspark-32k")
    _check_run("dspark-32k", cfg)
    # Only the depth differs from the full scale copy: the heads, vocabulary and widths are Qwen3-8B's.
    saved, full = AutoConfig.from_pretrained(cfg.target.path).to_dict(), scale_target_config("Qwen3-8B").to_dict()
    depth_and_records = {"num_hidden_layers", "layer_types", "transformers_version", "dtype", "_name_or_path"}
    assert {key for key in full if saved.get(key) != full[key]} <= depth_and_records
    assert (saved["num_hidden_layers"], saved["num_attention_heads"], saved["vocab_size"]) == (4, 32, 151936)


@pytest.mark.parametrize("name", _cases(lambda case: case.recipe.endswith("eagle3-32k")))
def test_eagle3_32k_trains_exports_and_is_served_at_length(name: str, colocated_runs, capsys) -> None:
    cfg = colocated_runs(name)
    _check_run(name, cfg)
    _, export_dir = _export(cfg, capsys)
    for reading in check_export_dir(export_dir, cfg.target.path):
        assert reading.unserved is None and reading.captured_layers == cfg.target.layer_ids
    shutil.rmtree(export_dir)


@pytest.mark.parametrize("name", _cases(lambda case: case.streamed))
def test_streamed_run_matches_colocated_at_length(name: str, colocated_runs, streamed_launch) -> None:
    colocated = Path(colocated_runs(name).run.output_dir)
    streamed = streamed_launch.output_dir(name)
    assert step_losses(streamed) == step_losses(colocated)
    got, expected = read_trained_drafter(streamed / "drafter"), read_trained_drafter(colocated / "drafter")
    assert got.weights.keys() == expected.weights.keys()
    assert all(torch.equal(got.weights[key], expected.weights[key]) for key in expected.weights)
    shutil.rmtree(streamed.parent)


# (c): few anchors keep the dense-mask attention of the check small (4 blocks x 32K keys x 32 heads per layer).
CHECK_ANCHORS = 4


def _steps_with_and_without(recipe: str, heads: tuple[int, int] | None) -> list[tuple[float, dict[str, torch.Tensor]]]:
    """Loss and gradients of one forward / backward of the recipe's drafter at the scale copy's widths (with
    ``heads`` = (query, key-value) heads, or the copy's 32/8) on one 32K-row batch, with the recipe's activation
    checkpointing (on), then with it off on the same module."""
    cfg = load_recipe(recipe, check_target=False)
    hf_config = scale_target_config("Qwen3-8B")
    if heads is not None:
        hf_config.num_attention_heads, hf_config.num_key_value_heads = heads
    geometry = geometry_from_target_config(hf_config)
    # Blocks at the sequence's end: they see nearly all 32K context rows.
    batch = long_context_batch(cfg, geometry, LONG_LENGTH, CHECK_ANCHORS)
    torch.manual_seed(0)
    counts = torch.ones(geometry.vocab_size, dtype=torch.long)
    # One module for both passes: building the vocabulary-sized heads twice would double the check's time.
    model = kind_spec(cfg.drafter.kind).build(cfg.drafter, geometry, cfg.target.layer_ids, counts).train()
    assert model.activation_checkpointing
    head = torch.randn(geometry.vocab_size, geometry.hidden_size, generator=torch.Generator().manual_seed(1))
    loss_of = DrafterLoss.for_recipe(cfg, head * 0.1, "sdpa")
    results = []
    for checkpointing in (True, False):
        model.activation_checkpointing = checkpointing
        model.zero_grad(set_to_none=True)
        loss = loss_of(model, batch, float(batch.num_supervised)).loss.loss
        loss.backward()
        results.append((float(loss.detach()),
                        {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}))
    return results


@pytest.mark.parametrize("heads", [pytest.param(MINIMAL_HEADS, id="minimal-heads"),
                                   pytest.param(None, id="32-heads", marks=pytest.mark.full)])
@pytest.mark.parametrize("recipe", sorted(LONG_CONTEXT_TIER))
def test_checkpointing_keeps_losses_and_gradients_at_length(recipe: str, heads: tuple[int, int] | None) -> None:
    (loss, grads), (plain_loss, plain) = _steps_with_and_without(recipe, heads)
    assert loss == pytest.approx(plain_loss, rel=1e-6)
    assert grads.keys() == plain.keys()
    for key in plain:
        torch.testing.assert_close(grads[key], plain[key], rtol=1e-5, atol=1e-7, msg=key)
