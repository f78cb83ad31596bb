"""Long-context tier: the 32K production recipes train at length on scale copies of Qwen3-8B.

- (a) Full depth at 8,192 tokens: the Qwen3-8B scale copy (all 36 decoder layers, 32/8 heads, vocabulary
  151,936, widths shrunk as in ``tests/test_scale_tier.py``) trains 2 steps with ``qwen3-8b-32k`` changed only in
  paths, sizes and steps (``data.max_length`` 8,192, one sequence a step, the anchor rule scaled down); colocated and streamed (1
  target + 1 drafter process over gloo) give equal losses and bit-identical weights; the export reloads to the
  trained drafter and passes both engines' rules.
- (b) 32,768 tokens: a 4-layer copy with the same heads and vocabulary (three taps, the most 4 layers hold) trains
  ``qwen3-8b-32k`` 2 steps on one long thinking conversation (short prompt, a reasoning trace and answer that
  reach the end of the sequence), colocated and streamed, with equal losses and weights.
- (c) At 32,768 context rows and the scale copy's widths, activation checkpointing on and off give the same loss
  and gradients for both recipes' drafters, DSpark and EAGLE-3 (the tiny-shape check of every kind is
  ``test_activation_checkpointing``); ``qwen3-8b-eagle3-32k`` also trains 2 steps colocated on the 4-layer copy at
  32,768 tokens, exports and is served by both engines (at full depth only in the scale tier's ``qwen3-8b-eagle3``
  at short length: another 36-layer forward at 8,192 tokens would add about 80 CPU-seconds).

Every run keeps ``drafter.activation_checkpointing`` on, as the recipes do. The cost is the target's causal
attention, 32 heads x L^2 / 2 scores per layer (``tests/helpers/long_context_world.py``); docs/testing.md has the
times.
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
from deepspec_train.jobs.cli import main as deepspec
from deepspec_train.jobs.run import run_training
from deepspec_train.kinds.engine_reading import ENGINES
from deepspec_train.kinds.registry import kind_spec
from deepspec_train.models.geometry import geometry_from_target_config
from deepspec_train.models.scale_targets import scale_target_config
from deepspec_train.training.batch_loss import DrafterLoss
from deepspec_train.training.distributed import DistContext
from deepspec_train.validation import load_recipe
from tests.helpers.long_context_world import (
    HEADROOM, LONG_CONTEXT_TIER, SHORT_COPY_LAYERS, SHORT_COPY_TAPS, build_long_world, long_overrides,
)
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
    """One long-context run: the recipe, the world it trains on and whether it also runs streamed."""

    recipe: str
    world: str
    streamed: bool
    extra: tuple[tuple[str, object], ...] = ()


CASES = {
    "dspark-8k": Case("qwen3-8b-32k", "full-depth", True),
    "dspark-32k": Case("qwen3-8b-32k", "four-layers", True, (("target.layer_ids", SHORT_COPY_TAPS),)),
    # EAGLE-3's three taps are the three the 4-layer copy holds; colocated only (the wire is DSpark's, tested above).
    "eagle3-32k": Case("qwen3-8b-eagle3-32k", "four-layers", False, (("target.layer_ids", SHORT_COPY_TAPS),)),
}
WORLDS = {"full-depth": (FULL_DEPTH_LENGTH, 0), "four-layers": (LONG_LENGTH, SHORT_COPY_LAYERS)}
# Beyond the scale tier's paths, sizes and steps: the anchor floor and rate (sizes) and, on the 4-layer copy
# only, the taps.
LONG_CHANGED_KEYS = CHANGED_KEYS | {"anchors.num_per_sequence", "anchors.per_1k_tokens"}


@pytest.fixture(scope="module")
def long_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("long_context_tier")


@pytest.fixture(scope="module")
def long_worlds(long_root: Path) -> dict[str, dict[str, str]]:
    return {name: build_long_world(long_root / name, length, layers) for name, (length, layers) in WORLDS.items()}


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
def streamed_launch(long_root: Path, long_worlds: dict):
    runs = {
        name: {"port": free_port(), "argv": [f"recipe={case.recipe}", *_overrides(long_worlds, long_root, name,
                                                                                  "streamed", 1)],
               "output_dir": long_root / "runs" / name / "streamed"}
        for name, case in CASES.items() if case.streamed
    }
    launch = launch_streamed(runs, long_root, timeout_s=2 * STREAM_TIMEOUT_S)
    yield launch
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


def test_32k_sequence_trains_on_the_four_layer_copy(colocated_runs) -> None:
    cfg = colocated_runs("dspark-32k")
    _check_run("dspark-32k", cfg)
    # Only the depth differs from the full scale copy: the heads, vocabulary and widths are Qwen3-8B's.
    saved, full = AutoConfig.from_pretrained(cfg.target.path).to_dict(), scale_target_config("Qwen3-8B").to_dict()
    depth_and_records = {"num_hidden_layers", "layer_types", "transformers_version", "dtype", "_name_or_path"}
    assert {key for key in full if saved.get(key) != full[key]} <= depth_and_records
    assert (saved["num_hidden_layers"], saved["num_attention_heads"], saved["vocab_size"]) == (4, 32, 151936)


def test_eagle3_32k_trains_exports_and_is_served_at_length(colocated_runs, capsys) -> None:
    cfg = colocated_runs("eagle3-32k")
    _check_run("eagle3-32k", cfg)
    _, export_dir = _export(cfg, capsys)
    for reading in check_export_dir(export_dir, cfg.target.path):
        assert reading.unserved is None and reading.captured_layers == cfg.target.layer_ids
    shutil.rmtree(export_dir)


@pytest.mark.parametrize("name", [name for name, case in CASES.items() if case.streamed])
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


def _steps_with_and_without(recipe: str) -> list[tuple[float, dict[str, torch.Tensor]]]:
    """Loss and gradients of one forward / backward of the recipe's drafter at the scale copy's widths on one
    32K-row batch, with the recipe's activation checkpointing (on), then with it off on the same module."""
    cfg = load_recipe(recipe, check_target=False)
    geometry = geometry_from_target_config(scale_target_config("Qwen3-8B"))
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


@pytest.mark.parametrize("recipe", sorted(LONG_CONTEXT_TIER))
def test_checkpointing_keeps_losses_and_gradients_at_length(recipe: str) -> None:
    (loss, grads), (plain_loss, plain) = _steps_with_and_without(recipe)
    assert loss == pytest.approx(plain_loss, rel=1e-6)
    assert grads.keys() == plain.keys()
    for key in plain:
        torch.testing.assert_close(grads[key], plain[key], rtol=1e-5, atol=1e-7, msg=key)
