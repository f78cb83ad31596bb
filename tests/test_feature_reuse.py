"""Feature reuse (``train.feature_reuse``: each target pass feeds several optimizer steps) and the drafter's start
from target layers (``drafter.init_from_target_layers``), against brute-force references:

- the plan: step ``s`` of a reuse-R plan trains on step ``s // R`` of the plan without reuse (same sequences, same
  anchors), an epoch is R times as many steps, and its data position round-trips;
- the colocated source runs the target once per pass and hands the pass's later steps the very same tensors;
  resuming in the middle of a pass builds it again, equal;
- a pass that does not fit ``train.feature_reuse_bytes`` stops the run in one line naming the setting;
- the target's layers land in the drafter tensor for tensor (read back from the HF model), EAGLE-3 takes what
  fits its one layer, and a layer the target lacks is refused in one line;
- streamed features equal colocated ones with both levers on (per-step losses bit for bit), and a streamed run
  stopped in the middle of a pass (``train.stop_at_step``) resumes to the uninterrupted run's losses (SIGTERM with
  reuse: ``test_preemption``, full tier);
- drafter groups with their own reuse each train as their recipe alone.
"""

from __future__ import annotations

import json

import pytest
import torch
from transformers import AutoModelForCausalLM

from deepspec_train.common.errors import UserError
from deepspec_train.jobs.assembly import chunk_builder, load_token_datasets, pass_replay, train_plan
from deepspec_train.commands.train_entry import main
from deepspec_train.jobs.run import run_training
from deepspec_train.jobs.target_init import TargetInitError, initialise_from_target
from deepspec_train.kinds.builder import build_drafter_from_files
from deepspec_train.packing.batch import PackedBatch
from deepspec_train.steps.plan import data_state, next_step_of
from deepspec_train.target.hidden_states import TargetTap
from deepspec_train.target.loading import load_target_model
from deepspec_train.training.distributed import DistContext
from deepspec_train.training.feature_source import InProcessFeatureSource
from deepspec_train.kinds.recipe_validation import load_recipe
from tests.helpers.run_history import assert_same_training
from tests.helpers.streaming_world import recipe_overrides, run_ranks, step_losses


def _cfg(world: dict[str, str], out, **extra):
    overrides = recipe_overrides(world, out, **extra)
    return load_recipe(overrides[0].split("=", 1)[1], overrides[1:])


def _same_batches(a: list[PackedBatch], b: list[PackedBatch]) -> bool:
    fields = PackedBatch.__dataclass_fields__
    return len(a) == len(b) and all(torch.equal(getattr(x, f), getattr(y, f)) for x, y in zip(a, b) for f in fields)


class CountingTap:
    """The real target tap, counting its forwards."""

    def __init__(self, tap: TargetTap):
        self.tap, self.calls = tap, 0

    def __call__(self, input_ids, attention_mask):
        self.calls += 1
        return self.tap(input_ids, attention_mask)


@pytest.fixture
def colocated_parts(streaming_world, tmp_path):
    cfg = _cfg(streaming_world, tmp_path, **{"train.feature_reuse": 3})
    ctx = DistContext(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"), group=None)
    rows = load_token_datasets(cfg, ctx)["train"]
    target = load_target_model(cfg.target, ctx.device)
    return cfg, rows, target


def test_a_reuse_plan_trains_each_pass_for_r_steps(colocated_parts) -> None:
    cfg, rows, _ = colocated_parts
    cfg.train.feature_reuse = 1
    plain = train_plan(cfg, rows, 0, 1)
    cfg.train.feature_reuse = 3
    reused = train_plan(cfg, rows, 0, 1)
    assert reused.steps_per_epoch == 3 * plain.steps_per_epoch
    for step in range(2 * reused.steps_per_epoch + 2):
        assert reused.sequence_indices(step) == plain.sequence_indices(step // 3)
        mine, theirs = reused.chunks(step), plain.chunks(step // 3)
        assert all(torch.equal(a, b) for c, d in zip(mine, theirs) for a, b in zip(c.anchors, d.anchors))
        assert reused.starts_pass(step) == (step % 3 == 0)
        assert next_step_of(data_state(step + 1, reused.steps_per_epoch), reused.steps_per_epoch) == step + 1


def test_the_colocated_source_runs_the_target_once_per_pass(colocated_parts) -> None:
    cfg, rows, target = colocated_parts
    tap = CountingTap(TargetTap(target, list(cfg.target.layer_ids)))
    source = InProcessFeatureSource(train_plan(cfg, rows, 0, 1), chunk_builder(cfg, tap, torch.device("cpu")),
                                    pass_replay(cfg))
    cfg.train.feature_reuse = 1
    plain = InProcessFeatureSource(train_plan(cfg, rows, 0, 1), chunk_builder(cfg, TargetTap(target, [0]), "cpu"))
    steps, reference = iter(source), iter(plain)
    forwards = 0
    for pass_index in range(3):
        expected = list(next(reference).batches)
        # One forward per chunk of the pass, none for its two replays.
        forwards += len(plain.plan.chunks(pass_index))
        for _ in range(3):
            assert _same_batches(list(next(steps).batches), expected)
            assert tap.calls == forwards

    cfg.train.feature_reuse = 3
    resumed = InProcessFeatureSource(train_plan(cfg, rows, 0, 1), chunk_builder(cfg, TargetTap(target, [0]), "cpu"),
                                     pass_replay(cfg))
    resumed.load_state_dict(data_state(4, resumed.plan.steps_per_epoch))
    plain.load_state_dict(data_state(1, plain.plan.steps_per_epoch))
    assert _same_batches(list(next(iter(resumed)).batches), list(next(iter(plain)).batches))


def test_a_pass_over_the_reuse_budget_is_refused_in_one_line(streaming_world, tmp_path) -> None:
    cfg = _cfg(streaming_world, tmp_path, **{"train.feature_reuse": 2, "train.feature_reuse_bytes": 1000})
    with pytest.raises(UserError) as refused:
        run_training(cfg)
    message = str(refused.value)
    assert "\n" not in message and message.startswith("train.feature_reuse_bytes = 1000:"), message


def test_target_layers_start_the_drafter(streaming_world, tmp_path) -> None:
    cfg = _cfg(streaming_world, tmp_path, **{"drafter.init_from_target_layers": "[1]"})
    torch.manual_seed(0)
    drafter, _ = build_drafter_from_files(cfg, None, torch.device("cpu"))
    before = {n: p.detach().clone() for n, p in drafter.named_parameters()}
    assert initialise_from_target(drafter, cfg)
    hf = AutoModelForCausalLM.from_pretrained(streaming_world["target"]).model.layers[1].state_dict()
    after = dict(drafter.named_parameters())
    copied = [n for n in after if n.startswith("layers.0.") and n.removeprefix("layers.0.") in hf]
    assert copied and all(torch.equal(after[n], hf[n.removeprefix("layers.0.")].float()) for n in copied)
    assert all(torch.equal(after[n], before[n]) for n in after if n not in copied)

    eagle = load_recipe("tiny-eagle3", [o for o in recipe_overrides(streaming_world, tmp_path)[1:]
                                        if not o.startswith(("drafter.", "target.layer_ids"))]
                        + ["drafter.init_from_target_layers=[0]", "target.layer_ids=[0,0,0]"])
    module, _ = build_drafter_from_files(eagle, None, torch.device("cpu"))
    assert initialise_from_target(module, eagle)
    layer0 = AutoModelForCausalLM.from_pretrained(streaming_world["target"]).model.layers[0].state_dict()
    assert torch.equal(module.midlayer.mlp.down_proj.weight, layer0["mlp.down_proj.weight"].float())
    assert not torch.equal(module.midlayer.self_attn.q_proj.weight[:, :layer0["self_attn.q_proj.weight"].shape[1]],
                           layer0["self_attn.q_proj.weight"].float())

    cfg.drafter.init_from_target_layers = [5]
    with pytest.raises(TargetInitError, match=r"^drafter.init_from_target_layers = \[5\]: .*outside"):
        initialise_from_target(drafter, cfg)


# Both levers on, streamed (1 target worker + 1 drafter rank), 12 steps: passes of 2 steps, validation every 4.
STREAMED = {"topology.target_workers": 1, "train.max_steps": 12, "train.feature_reuse": 2,
            "drafter.init_from_target_layers": "[1]", "train.eval_every": 4}


@pytest.fixture(scope="module")
def uninterrupted_streamed_run(streaming_world, tmp_path_factory):
    """One uninterrupted streamed run with ``STREAMED``, shared by the two streamed tests below (each launch of
    processes costs seconds, its 12 steps almost nothing): colocated must equal it, and a run stopped in the middle
    of a pass must resume to it."""
    out = tmp_path_factory.mktemp("uninterrupted") / "streamed"
    run_ranks(recipe_overrides(streaming_world, out, **STREAMED), 2, out / "logs")
    return out


@pytest.mark.slow
def test_streamed_features_equal_colocated_with_reuse_and_target_init(streaming_world, uninterrupted_streamed_run,
                                                                       tmp_path) -> None:
    colocated = tmp_path / "colocated"
    run_training(_cfg(streaming_world, colocated, **{k: v for k, v in STREAMED.items()
                                                     if k != "topology.target_workers"}))
    expected, got = step_losses(colocated), step_losses(uninterrupted_streamed_run)
    assert sorted(got) == list(range(1, 13)) and got == expected
    plain = tmp_path / "plain"
    run_training(_cfg(streaming_world, plain, **{"train.max_steps": 12, "train.eval_every": 4}))
    assert step_losses(plain) != expected


@pytest.mark.slow
def test_a_streamed_run_stopped_in_the_middle_of_a_pass_resumes_exactly(streaming_world, uninterrupted_streamed_run,
                                                                        tmp_path) -> None:
    split = tmp_path / "split"
    # Step 5 is the first step of the third pass: the resumed run must build that pass again for step 6.
    run_ranks(recipe_overrides(streaming_world, split, **STREAMED, **{"train.stop_at_step": 5}), 2, split / "logs1")
    run_ranks(recipe_overrides(streaming_world, split, **STREAMED, **{"train.resume": "auto"}), 2, split / "logs2")
    expected, resumed = step_losses(uninterrupted_streamed_run), step_losses(split)
    assert sorted(resumed) == list(range(1, 13)) and resumed == expected


@pytest.mark.slow
def test_groups_with_their_own_reuse_each_train_as_their_recipe_alone(streaming_world, tmp_path) -> None:
    """A DSpark group reusing each pass twice beside a DFlash group without reuse, over one target: each equals
    its recipe trained alone (the shared pass serves whichever inputs the groups ask for at a step)."""
    common = recipe_overrides(streaming_world, tmp_path / "run", **{"train.feature_reuse": 2})[1:]
    group = ["recipe=tiny-dspark", "compare=[tiny-dflash]", "seeds=1", *common,
             "tiny-dflash:drafter.markov_rank=0", "tiny-dflash:train.feature_reuse=1"]
    assert main(group) == 0
    listed = json.loads((tmp_path / "run" / "groups.json").read_text())["groups"]
    assert [g["label"] for g in listed] == ["tiny-dspark-seed0", "tiny-dflash-seed0"]
    for recipe, extra in (("tiny-dspark", []), ("tiny-dflash", ["drafter.markov_rank=0", "train.feature_reuse=1"])):
        alone = tmp_path / f"alone-{recipe}"
        overrides = recipe_overrides(streaming_world, alone, **{"train.feature_reuse": 2})[1:]
        run_training(load_recipe(recipe, overrides + extra + ["run.seed=0", "run.data_seed=0"]))
        assert_same_training(tmp_path / "run" / "groups" / f"{recipe}-seed0", alone)
