"""Every rule of ``config.rules``: a recipe value the pipeline cannot train as asked fails in ``load_recipe`` (or,
for the launch rules, in ``train.py`` before anything loads) with one line naming the key, the value and what is
allowed. One case per rule; each case starts from a valid tiny recipe pointed at the session's tiny world."""

from __future__ import annotations

import os
import resource
import subprocess
import sys
from pathlib import Path

import pytest

from deepspec_train.config.loader import ConfigError
from deepspec_train.kinds.recipe_validation import load_recipe
from deepspec_train.config.rules import launch_problems
from tests.helpers.tiny_world_overrides import LAYER_IDS, world_overrides

REPO = Path(__file__).resolve().parents[1]


def test_the_base_recipes_are_valid(tiny_world: Path, tmp_path: Path) -> None:
    for recipe in LAYER_IDS:
        load_recipe(recipe, world_overrides(tiny_world, recipe, tmp_path))


RECIPE_RULES = [
    ("tiny-dspark", "train.max_steps=-5", "train.max_steps = -5 must be >= 1"),
    ("tiny-dspark", "anchors.num_per_sequence=0", "anchors.num_per_sequence = 0 must be >= 1"),
    ("tiny-dspark", "drafter.num_layers=0", "drafter.num_layers = 0 must be >= 1"),
    ("tiny-dspark", "train.warmup_frac=2", "train.warmup_frac = 2.0 must be in [0, 1)"),
    ("tiny-eagle3", "drafter.markov_rank=256", "drafter.markov_rank must be 0"),
    ("tiny-eagle3", "drafter.confidence_head=true", "drafter.confidence_head false, got 0 and true"),
    ("tiny-dspark", "drafter.block_size=0", "drafter.block_size = 0 must be >= 1"),
    ("tiny-dspark", "train.checkpoint_every=0", "train.checkpoint_every = 0 must be >= 1"),
    ("tiny-dspark", "logging.log_every=0", "logging.log_every = 0 must be >= 1"),
    ("tiny-dspark", "train.micro_batch_sequences=0", "train.micro_batch_sequences = 0 must be >= 1"),
    ("tiny-dspark", "train.resume=bogus", "train.resume = 'bogus' must be 'none', 'auto' or a checkpoint directory"),
    ("tiny-dspark", "loss.chunk_size=0", "loss.chunk_size = 0 must be >= 1"),
    ("tiny-dspark", "target.layer_ids=[]", "target.layer_ids is empty"),
    ("tiny-dspark", "target.layer_ids=[1,0]", "target.layer_ids = [1, 0] must be decoder-layer ids >= 0 in increasing order"),
    ("tiny-dspark", "target.layer_ids=[-1]", "must be decoder-layer ids >= 0"),
    ("tiny-dspark", "data.train=[]", "data.train is empty"),
    ("tiny-dspark", "data.max_length=1", "data.max_length = 1 must be >= 2"),
    ("tiny-dspark", "data.num_workers=-1", "data.num_workers = -1 must be >= 0"),
    ("tiny-dspark", "run.output_dir=''", "run.output_dir is empty"),
    ("tiny-dspark", "drafter.markov_rank=-1", "drafter.markov_rank = -1 must be >= 0"),
    ("tiny-dspark", "drafter.mask_token_id=-1", "drafter.mask_token_id = -1 must be >= 0"),
    ("tiny-dspark", "drafter.intermediate_size=0", "drafter.intermediate_size = 0 must be >= 1"),
    ("tiny-dspark", "drafter.ttt_steps=0", "drafter.ttt_steps = 0 must be >= 1"),
    ("tiny-dspark", "anchors.token_budget=100", "anchors.token_budget = 100 must be >= data.max_length + drafter.block_size - 2 = 517"),
    ("tiny-dspark", "loss.alpha_ce=-1", "loss.alpha_ce = -1.0 must be a number >= 0"),
    ("tiny-dspark", "loss.alpha_tv=.nan", "loss.alpha_tv = nan must be a number >= 0"),
    ("tiny-dspark", "loss.alpha_conf=-0.5", "loss.alpha_conf = -0.5 must be a number >= 0"),
    ("tiny-dspark", ["loss.alpha_ce=0", "loss.alpha_tv=0"], "loss.alpha_ce and loss.alpha_tv are both 0"),
    ("tiny-dspark", "loss.gamma_decay=0", "loss.gamma_decay = 0.0 must be a positive number"),
    ("tiny-dspark", "loss.temperature=0", "loss.temperature = 0.0 must be a positive number"),
    ("tiny-dspark", "train.lr=0", "train.lr = 0.0 must be a positive number"),
    ("tiny-dspark", "train.weight_decay=-1", "train.weight_decay = -1.0 must be a number >= 0"),
    ("tiny-dspark", "train.grad_clip=0", "train.grad_clip = 0.0 must be a positive number"),
    ("tiny-dspark", "train.epochs=0", "train.epochs = 0.0 must be a positive number"),
    ("tiny-dspark", "train.global_batch_sequences=0", "train.global_batch_sequences = 0 must be >= 1"),
    ("tiny-dspark", "train.eval_every=0", "train.eval_every = 0 must be >= 1"),
    ("tiny-dspark", "train.eval_sequences=0", "train.eval_sequences = 0 must be >= 1"),
    ("tiny-dspark", "train.keep_last=-1", "train.keep_last = -1 must be >= 0"),
    ("tiny-dspark", "train.stop_at_step=0", "train.stop_at_step = 0 must be >= 1"),
    (
        "tiny-dspark", ["train.distributed=deepspeed", "train.deepspeed_config=no/such.json"],
        "train.deepspeed_config = 'no/such.json': no such file",
    ),
    ("tiny-dspark", "topology.target_workers=-1", "topology.target_workers = -1 must be >= 0"),
    ("tiny-dspark", "topology.target_tp=0", "topology.target_tp = 0 must be >= 1"),
    ("tiny-dspark", "topology.target_tp=2", "topology.target_tp = 2 needs streamed mode"),
    ("tiny-dspark", ["topology.target_tp=2", "topology.target_workers=3"],
     "topology.target_workers = 3 does not form groups of topology.target_tp = 2"),
    ("tiny-dspark", "stream.depth=0", "stream.depth = 0 must be >= 1"),
    ("tiny-dspark", "stream.timeout_s=0", "stream.timeout_s = 0.0 must be a positive number"),
    ("tiny-dspark", "drafter.markov_rank=0", "drafter.kind=dspark needs drafter.markov_rank > 0, got 0"),
    ("tiny-dspark", "drafter.labels=zlab", "drafter.labels=zlab is DFlash's own convention"),
    ("tiny-dspark", "drafter.ttt_steps=3", "drafter.ttt_steps = 3 is not used by drafter.kind=dspark"),
    ("tiny-dspark", "drafter.ttt_decay=0.5", "drafter.ttt_decay = 0.5 is not used by drafter.kind=dspark"),
    ("tiny-dflash", "drafter.draft_vocab_size=100", "drafter.draft_vocab_size = 100 is not used by drafter.kind=dflash"),
    ("tiny-dflash", "drafter.markov_rank=4", "drafter.kind=dflash needs drafter.markov_rank=0 and drafter.confidence_head=false, got 4"),
    ("tiny-dflash", "drafter.confidence_head=true", "got 0 and true"),
    ("tiny-dflash", ["drafter.labels=zlab", "drafter.block_size=1"], "drafter.block_size must be >= 2, got 1"),
    ("tiny-eagle3", "drafter.num_layers=2", "drafter.num_layers must be 1, got 2"),
    ("tiny-eagle3", "drafter.ttt_steps=5", "drafter.ttt_steps (5) must equal drafter.block_size (7)"),
    ("tiny-eagle3", "drafter.ttt_decay=0", "drafter.ttt_decay = 0.0 must be in (0, 1]"),
    ("tiny-eagle3", "drafter.labels=zlab", "drafter.labels=zlab is DFlash's own convention"),
    ("tiny-eagle3", "drafter.draft_vocab_size=0", "drafter.draft_vocab_size = 0 must be >= 1"),
    ("tiny-eagle3", "target.layer_ids=[0,0]", "fuses exactly 3 target layers: target.layer_ids has 2"),
    ("tiny-eagle3", "drafter.markov_head_type=gated", "drafter.markov_head_type = 'gated' is not used by drafter.kind=eagle3"),
    ("tiny-eagle3", "drafter.markov_init=normal", "drafter.markov_init = 'normal' is not used by drafter.kind=eagle3"),
    ("tiny-eagle3", "drafter.confidence_gradient=joint", "drafter.confidence_gradient = 'joint' is not used by drafter.kind=eagle3"),
    ("tiny-dflash", "drafter.markov_head_type=rnn", "drafter.markov_head_type = 'rnn' is not used by drafter.kind=dflash"),
    ("tiny-dflash", "drafter.markov_init=normal", "drafter.markov_init = 'normal' is not used by drafter.kind=dflash"),
    ("tiny-dflash", "drafter.confidence_gradient=joint", "drafter.confidence_gradient = 'joint' is not used by drafter.kind=dflash"),
    ("tiny-dspark", ["drafter.confidence_head=false", "drafter.confidence_gradient=joint"],
     "drafter.confidence_gradient = 'joint' is not used by drafter.kind=dspark"),
    ("tiny-dspark", "drafter.markov_head_type=lstm", "'drafter.markov_head_type' = 'lstm' is not one of 'vanilla', 'gated', 'rnn'"),
    ("tiny-dspark", "loss.normalizer=batch", "'loss.normalizer' = 'batch' is not one of 'token', 'sequence'"),
    ("tiny-dspark", "loss.distance=l2", "'loss.distance' = 'l2' is not one of 'tv', 'l1'"),
    ("tiny-dspark", "anchors.per_1k_tokens=0", "anchors.per_1k_tokens = 0.0 must be in (0, 1024]"),
    ("tiny-dspark", "anchors.per_1k_tokens=2048", "anchors.per_1k_tokens = 2048.0 must be in (0, 1024]"),
    # 8 per 1K at 511 valid positions is 4 anchors, under the floor of 32.
    ("tiny-dspark", "anchors.per_1k_tokens=8", "anchors.per_1k_tokens = 8 never adds an anchor: at data.max_length = 512"),
    ("tiny-dspark", "anchors.packing=best_fit", "'anchors.packing' = 'best_fit' is not one of 'in_order', 'first_fit'"),
    ("tiny-dflash2", "drafter.conv_kernel_size=0", "drafter.kind=dflash2 needs drafter.conv_kernel_size >= 1, got 0"),
    ("tiny-dflash2", "drafter.conv_group_size=0", "drafter.kind=dflash2 needs drafter.conv_group_size >= 1, got 0"),
    ("tiny-dflash2", "drafter.selector_rank=0", "drafter.kind=dflash2 needs drafter.selector_rank >= 1, got 0"),
    ("tiny-dflash2", "drafter.selector_top_k=1", "drafter.kind=dflash2 needs drafter.selector_top_k >= 2"),
    ("tiny-dflash2", "drafter.selector_loss_weight=-1", "drafter.selector_loss_weight = -1.0 must be >= 0"),
]


@pytest.mark.parametrize("recipe,override,message", RECIPE_RULES, ids=[f"{r}:{o}" for r, o, _ in RECIPE_RULES])
def test_recipe_rule(tiny_world: Path, tmp_path: Path, recipe: str, override, message: str) -> None:
    extra = override if isinstance(override, list) else [override]
    with pytest.raises(ConfigError) as info:
        load_recipe(recipe, world_overrides(tiny_world, recipe, tmp_path) + extra)
    text = str(info.value)
    assert message in text and "\n" not in text, text


TARGET_RULES = [
    ("tiny-dspark", "target.path=/nonexistent", "target.path = '/nonexistent': no such directory"),
    ("tiny-dspark", "target.layer_ids=[99]", "target.layer_ids = [99]: the target has 2 decoder layers, so a tap must be in 0..0"),
    ("tiny-dspark", "target.layer_ids=[1]", "so a tap must be in 0..0 (never the last layer"),
    ("tiny-dspark", "drafter.mask_token_id=99999", "drafter.mask_token_id = 99999 is outside the target's vocabulary (0..511)"),
    ("tiny-eagle3", "drafter.draft_vocab_size=600", "drafter.draft_vocab_size = 600 exceeds the target's vocabulary (512)"),
    # The test preset's target is 64 wide: groups of 24 channels do not split it.
    ("tiny-dflash2", "drafter.conv_group_size=24",
     "drafter.conv_group_size = 24 must divide the target's hidden width (hidden_size = 64)"),
    ("tiny-dflash2", "drafter.selector_top_k=600", "drafter.selector_top_k = 600 exceeds the target's vocabulary (512)"),
    # The test preset's target has 2 query heads and 1 key/value head: no group of 2 can split it.
    (
        "tiny-dspark", ["topology.target_workers=2", "topology.target_tp=2"],
        "topology.target_tp = 2 cannot split the target's heads over a group of 2 ranks: num_key_value_heads = 1 "
        "not a multiple of 2 (target_tp values that split it: [1])",
    ),
]


@pytest.mark.parametrize("recipe,override,message", TARGET_RULES, ids=[str(o) for _, o, _ in TARGET_RULES])
def test_target_rule(tiny_world: Path, tmp_path: Path, recipe: str, override, message: str) -> None:
    extra = override if isinstance(override, list) else [override]
    with pytest.raises(ConfigError) as info:
        load_recipe(recipe, world_overrides(tiny_world, recipe, tmp_path) + extra)
    assert message in str(info.value) and "\n" not in str(info.value), str(info.value)


def test_target_directory_without_config_and_with_a_broken_one(tiny_world: Path, tmp_path: Path) -> None:
    empty = tmp_path / "empty_target"
    empty.mkdir()
    base = world_overrides(tiny_world, "tiny-dspark", tmp_path)
    with pytest.raises(ConfigError, match="no config.json there"):
        load_recipe("tiny-dspark", base + [f"target.path={empty}"])
    (empty / "config.json").write_text("{not json")
    with pytest.raises(ConfigError, match="config.json is not valid JSON"):
        load_recipe("tiny-dspark", base + [f"target.path={empty}"])


def test_an_unused_kind_setting_is_fine_at_its_neutral_value(tiny_world: Path, tmp_path: Path) -> None:
    base = world_overrides(tiny_world, "tiny-eagle3", tmp_path)
    assert load_recipe("tiny-eagle3", base + ["drafter.markov_rank=0"]).drafter.markov_rank == 0
    assert load_recipe("tiny-eagle3", base + ["drafter.markov_head_type=vanilla"]).drafter.markov_head_type == "vanilla"


def test_the_parity_switches_load(tiny_world: Path, tmp_path: Path) -> None:
    switches = ["loss.normalizer=sequence", "loss.distance=l1", "drafter.markov_head_type=rnn",
                "drafter.markov_init=normal", "drafter.confidence_gradient=joint"]
    cfg = load_recipe("tiny-dspark", world_overrides(tiny_world, "tiny-dspark", tmp_path) + switches)
    assert (cfg.loss.normalizer, cfg.loss.distance) == ("sequence", "l1")
    assert (cfg.drafter.markov_head_type, cfg.drafter.markov_init, cfg.drafter.confidence_gradient) == (
        "rnn", "normal", "joint")
    eagle3 = load_recipe("tiny-eagle3", world_overrides(tiny_world, "tiny-eagle3", tmp_path) + switches[:2])
    assert eagle3.loss.normalizer == "sequence"


@pytest.mark.parametrize(
    "targets,world,message",
    [
        (0, 9, "train.global_batch_sequences = 8 is fewer than the 9 drafter rank(s) of this launch"),
        (1, 10, "train.global_batch_sequences = 8 is fewer than the 9 drafter rank(s) of this launch"),
        (2, 2, "topology.target_workers = 2 needs at least 3 processes"),
    ],
)
def test_launch_rule(tiny_world: Path, tmp_path: Path, targets: int, world: int, message: str) -> None:
    base = world_overrides(tiny_world, "tiny-dspark", tmp_path)
    cfg = load_recipe("tiny-dspark", base + [f"topology.target_workers={targets}"])
    assert [p for p in launch_problems(cfg, world) if message in p]
    # Drafter counts that do not divide the 8 sequences per step are fine (uneven shares).
    assert launch_problems(cfg, targets + 3 if targets else 3) == []


def test_a_bad_value_fails_train_py_in_one_line_within_two_seconds_without_torch(tiny_world: Path, tmp_path: Path) -> None:
    args = ["recipe=tiny-dspark", *world_overrides(tiny_world, "tiny-dspark", tmp_path), "train.max_steps=-5"]
    probe = (
        "import sys; from deepspec_train.commands.train_entry import main; code = main(sys.argv[1:]); "
        "print('torch imported' if 'torch' in sys.modules else 'torch not imported'); sys.exit(code)"
    )
    # The child's CPU time, not wall time: on a shared 2-core machine the wall time also counts the other
    # processes' turns, while importing torch alone would take the child over two CPU-seconds.
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    proc = subprocess.run([sys.executable, "-c", probe, *args], cwd=REPO, capture_output=True, text=True, timeout=60)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    seconds = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    assert proc.returncode == 2
    assert proc.stdout.strip() == "torch not imported"
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "train.max_steps = -5 must be >= 1" in lines[0], proc.stderr
    assert seconds < 2.0, seconds


def test_train_py_refuses_a_launch_with_more_drafters_than_sequences(tiny_world: Path, tmp_path: Path) -> None:
    args = ["recipe=tiny-dspark", *world_overrides(tiny_world, "tiny-dspark", tmp_path)]
    env = {**os.environ, "WORLD_SIZE": "9", "RANK": "0"}
    proc = subprocess.run([sys.executable, "train.py", *args], cwd=REPO, capture_output=True, text=True, timeout=60, env=env)
    assert proc.returncode == 2
    assert "is fewer than the 9 drafter rank(s)" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1


def test_train_py_refuses_a_dflash2_recipe_that_does_not_fit_the_target_in_one_line(tiny_world: Path,
                                                                                     tmp_path: Path) -> None:
    # The target rules of a kind run where a user meets them: `python train.py recipe=... key=value`, before
    # anything loads (the test preset's target is 64 wide, so groups of 24 channels cannot split it).
    args = ["recipe=tiny-dflash2", *world_overrides(tiny_world, "tiny-dflash2", tmp_path), "drafter.conv_group_size=24"]
    proc = subprocess.run([sys.executable, "train.py", *args], cwd=REPO, capture_output=True, text=True, timeout=60)
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr
    assert "drafter.conv_group_size = 24 must divide the target's hidden width (hidden_size = 64)" in lines[0]
    assert not (tmp_path / "run").exists()
