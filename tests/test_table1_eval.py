"""``deepspec eval`` comparing several drafters on the prepared benchmark suites: the Table-1 numbers against a
brute-force recount of the traces, the W&B runs read back from their offline files, the one-line failures, and
losslessness at T = 0 on one prompt of every suite. The drafters are one of each kind (DSpark, DFlash, EAGLE-3,
DFlash2), each drafting the same number of tokens per round (DFlash2's 1 + N block one slot longer)."""

from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from deepspec_train.commands.dispatch import main
from deepspec_train.evaluation.report import conditional_acceptance
from deepspec_train.evaluation.speculative_decoder import CHAT_TEMPLATE_KWARGS, SpeculativeDecoder
from deepspec_train.evaluation.suites import load_suite
from deepspec_train.evaluation.table1 import TableSettings, build_table1
from deepspec_train.formats.eval_traces import TraceRound, read_traces
from deepspec_train.formats.figures import read_drawn
from deepspec_train.formats.trained_drafter import write_trained_drafter
from deepspec_train.suites.benchmarks import BENCHMARK_SUITES
from tests.helpers.benchmark_suites import prepare_all_suites
from tests.helpers.chat_model_drafters import drafter_recipe, load_tiny_target, random_drafter

pytestmark = pytest.mark.usefixtures("one_torch_thread")
KINDS = ("dspark", "dflash", "eagle3", "dflash2")
# The drafters a table divides by the EAGLE-3 baseline, in the order they are given.
RATIOS = tuple(kind for kind in KINDS if kind != "eagle3")
# The paper's Table-1 order, then AIME 2024.
SUITE_ORDER = ("gsm8k", "math500", "aime25", "humaneval", "mbpp", "livecodebench", "mt-bench", "alpaca", "arena-hard",
               "aime24")


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """The tiny random target, one random drafter of each kind saved as a training output for it, and every
    suite prepared from files in its published schema (two prompts each)."""
    root = tmp_path_factory.mktemp("table1_world")
    model, tokenizer = load_tiny_target(root / "target")
    drafters = {}
    for seed, kind in enumerate(KINDS):
        loaded = random_drafter(model, tokenizer, kind, seed=seed)
        cfg = drafter_recipe(kind, loaded.mask_token_id)
        cfg.target.path = str(root / "target")
        drafters[kind] = write_trained_drafter(loaded.module, cfg, root / kind / "drafter")
    return {"root": root, "model": model, "tokenizer": tokenizer, "drafters": drafters,
            "suites": prepare_all_suites(root, sample=2)}


def _trace(suite: str, prompt: str, emitted: int, drafted: int = 3, seed: int = 0) -> TraceRound:
    return TraceRound(suite=suite, category=suite, prompt_id=prompt, turn=0, round=0, drafted=drafted,
                      accepted=emitted - 1, emitted=emitted, confidence_logits=None, confidences=None,
                      target_accept_probs=(1.0,) * drafted, draft_seconds=0.002, draft_cpu_seconds=0.001, seed=seed)


def test_table1_numbers_match_a_brute_force_recount():
    rng = np.random.default_rng(3)
    rows = {d: [_trace(s, f"p{p}", int(rng.integers(1, 5)), seed=seed)
                for s in ("math", "code") for p in range(4) for seed in (0, 1) for _ in range(int(rng.integers(1, 4)))]
            for d in ("a", "b", "c")}
    table = build_table1(rows, {d: 3 for d in rows}, {"a": 2, "b": 2, "c": 7},
                         TableSettings("c", 1.0, (0, 1), ("math", "code"), replicates=200))
    assert table.suites == ("math", "code") and table.prompts == {"math": 4, "code": 4}
    for d in rows:
        for s in table.suites:
            mine = [r for r in rows[d] if r.suite == s]
            assert table.tau[d][s] == pytest.approx(sum(r.emitted for r in mine) / len(mine))
            assert table.acceptance[d][s] == conditional_acceptance(mine, 3)
            assert table.acceptance_rounds[d][s] == [sum(r.drafted >= k and r.accepted >= k - 1 for r in mine)
                                                     for k in (1, 2, 3)]
            own = table.tau_interval[d][s]
            assert own.value == pytest.approx(table.tau[d][s]) and own.low < own.value < own.high
        assert table.macro_tau[d] == pytest.approx(np.mean([table.tau[d][s] for s in table.suites]))
        assert table.cost[d].cpu_ms.value == pytest.approx(1.0) and table.cost[d].wall_ms.value == pytest.approx(2.0)
    assert set(table.ratios) == {"a", "b"} and table.cost["c"].sequential_layer_passes == 7
    for d in ("a", "b"):
        ratios = [table.tau[d][s] / table.tau["c"][s] for s in table.suites]
        assert [table.ratios[d][s].value for s in table.suites] == pytest.approx(ratios)
        assert table.ratios[d]["geomean"].value == pytest.approx(math.prod(ratios) ** (1 / len(ratios)))
        assert all(e.low <= e.high and e.se >= 0 for e in table.ratios[d].values())


def _comparison(world, out: Path, *extra: str) -> list[str]:
    argv = ["eval", "--target", str(world["root"] / "target"), "--out", str(out), "--no-progress",
            "--max-new-tokens", "6", "--bootstrap-replicates", "100"]
    argv += [a for name in SUITE_ORDER for a in ("--suite", f"{name}={world['suites'][name]}")]
    argv += [a for kind in KINDS for a in ("--drafter", f"{kind}={world['drafters'][kind]}")]
    return argv + list(extra)


def test_one_command_compares_every_kind_on_every_suite(world, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    monkeypatch.setenv("WANDB_MODE", "offline")
    out = tmp_path / "table1"
    # Two decoding processes: every assertion below recounts their rows against the tables built from them.
    argv = _comparison(world, out, "--baseline", "eagle3", "--temperature", "1", "0", "--seed", "0", "1",
                       "--max-prompts", "1", "--wandb", "--wandb-group", "tiny-target", "--workers", "2")
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert "| dspark / eagle3 |" in printed and "| dflash2 / eagle3 |" in printed and "| tau dflash2 |" in printed
    report = json.loads((out / "table1.json").read_text())
    assert [t["temperature"] for t in report["tables"]] == [1.0, 0.0]
    for table in report["tables"]:
        tag = f"T{table['temperature']:g}"
        assert table["suites"] == list(SUITE_ORDER) and set(table["prompts"].values()) == {1}
        assert table["seeds"] == ([0, 1] if table["temperature"] else [0])
        for kind in KINDS:
            traces = read_traces([out / "traces" / f"{kind}_{tag}.jsonl"])
            assert {t.seed for t in traces} == set(table["seeds"])
            for suite in SUITE_ORDER:
                mine = [t for t in traces if t.suite == suite]
                assert table["tau"][kind][suite] == pytest.approx(sum(t.emitted for t in mine) / len(mine))
                assert table["conditional_acceptance"][kind][suite] == conditional_acceptance(mine, 4)
            results = json.loads((out / kind / f"results_{tag}.json").read_text())
            assert results["suites"]["gsm8k"]["tau"] == pytest.approx(table["tau"][kind]["gsm8k"])
        for kind in RATIOS:
            ratio = table["tau"][kind]["mbpp"] / table["tau"]["eagle3"]["mbpp"]
            assert table["ratios"][kind]["mbpp"]["value"] == pytest.approx(ratio)
        assert table["draft_cost"]["eagle3"]["sequential_layer_passes"] == 4
        # Each drafter's production counterpart is modeled from the settings its training directory records.
        assert all(table["draft_cost"][kind]["modeled_us_h200_batch1"] > 0 for kind in KINDS)
        # The bars carry the table's intervals; the acceptance curves the rounds behind each rate.
        bars = read_drawn(out / f"tau_per_suite_{tag}.png")
        assert bars["title"].endswith(f"T = {tag[1:]}, seed{'s 0, 1' if table['temperature'] else ' 0'}")
        assert [s["label"] for s in bars["series"]] == list(KINDS)
        for series in bars["series"]:
            own = table["tau_interval"][series["label"]]
            assert series["interval"][:len(SUITE_ORDER)] == [pytest.approx([own[s]["low"], own[s]["high"]])
                                                             for s in SUITE_ORDER]
        curves = read_drawn(out / f"conditional_acceptance_gsm8k_{tag}.png")["series"]
        assert [c["counts"] for c in curves] == [table["acceptance_rounds"][k]["gsm8k"] for k in KINDS]
    assert "## T = 0 (seeds 0; baseline eagle3)" in (out / "table1.md").read_text()

    runs = sorted((tmp_path / "wandb").glob("offline-run-*"))
    assert len(runs) == len(KINDS), "one W&B run per drafter"
    for run in runs:
        log = next(run.glob("run-*.wandb"))
        # W&B's service process may still be flushing the run's protobuf log.
        deadline = time.monotonic() + 30
        while b"eval/T0/tau/macro_avg" not in log.read_bytes() and time.monotonic() < deadline:
            time.sleep(0.5)
        assert b"tiny-target" in log.read_bytes() and b"eval/T0/tau/macro_avg" in log.read_bytes()
        # The longest name found: "eval dflash" is also in the log of dflash2's run.
        drafter = max((k for k in KINDS if f"eval {k}".encode() in log.read_bytes()), key=len)
        bars = json.loads(next(run.rglob("T1/tau_per_suite_table_*.table.json")).read_text())
        assert bars["columns"] == ["suite", "tau"]
        assert {s: v for s, v in bars["data"]} == pytest.approx(report["tables"][0]["tau"][drafter])
        whole = json.loads(next(run.rglob("T1/table1_*.table.json")).read_text())
        assert [row[0] for row in whole["data"]] == [f"tau {k}" for k in KINDS] + [f"{k} / eagle3" for k in RATIOS]
        assert list(run.rglob("T0/acceptance_curves_table_*.table.json"))
        assert list(run.rglob("tau_per_suite_T1_*.png"))


def test_comparison_inputs_fail_in_one_line(world, tmp_path, capsys):
    cases = [
        (_comparison(world, tmp_path / "a", "--baseline", "medusa"), "--baseline 'medusa'"),
        (_comparison(world, tmp_path / "b", "--block-size", "2"), "--block-size"),
        (_comparison(world, tmp_path / "w", "--workers", "0"), "--workers must be at least 1"),
        (_comparison(world, tmp_path / "c", "--drafter", f"dspark={world['drafters']['dflash']}"), "distinct"),
        (["eval", "--target", str(world["root"] / "target"), "--drafter", str(world["drafters"]["dspark"]),
          "--suite", f"gsm8k={world['suites']['gsm8k']}", "--temperature", "1", "0", "--out", str(tmp_path / "r.json")],
         "several --temperature"),
        (_comparison(world, tmp_path / "d", "--suite", f"extra={tmp_path / 'nope.jsonl'}"), "does not exist"),
        (_comparison(world, tmp_path / "e", "--suite", f"gsm8k={world['suites']['mbpp']}"), "suite names must be"),
    ]
    for argv, message in cases:
        assert main(argv) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("error: ") and message in err[0], (message, err)


@pytest.mark.parametrize("kind", KINDS)
def test_greedy_decoding_of_every_suite_equals_the_target_greedy_output(world, kind):
    model, tokenizer = world["model"], world["tokenizer"]
    loaded = random_drafter(model, tokenizer, kind, seed=5)
    drafter = loaded.block_drafter()
    decoder = SpeculativeDecoder(model, tokenizer, drafter, loaded.target_layer_ids, drafter.max_block_size, 0.0)
    for name in BENCHMARK_SUITES:
        prompt = load_suite(f"{name}={world['suites'][name]}", max_prompts=1).prompts[0]
        (turn,), _ = decoder.decode_conversation(prompt.turns, 12)
        rendered = tokenizer.apply_chat_template([{"role": "user", "content": prompt.turns[0]}], tokenize=False,
                                                 add_generation_prompt=True, **CHAT_TEMPLATE_KWARGS)
        ids = tokenizer(rendered, add_special_tokens=False)["input_ids"]
        greedy = model.generate(torch.tensor([ids]), max_new_tokens=12, do_sample=False)[0, len(ids):].tolist()
        assert turn.tokens == greedy, name


def test_old_single_drafter_invocation_still_writes_results_json(world, tmp_path):
    out = tmp_path / "results.json"
    assert main(["eval", "--target", str(world["root"] / "target"), "--drafter", str(world["drafters"]["dspark"]),
                 "--suite", f"humaneval={world['suites']['humaneval']}", "--temperature", "0", "--seed", "3",
                 "--max-new-tokens", "4", "--out", str(out), "--no-progress"]) == 0
    results = json.loads(out.read_text())
    assert results["temperature"] == 0.0 and results["seed"] == 3 and set(results["suites"]) == {"humaneval"}
    assert os.path.basename(results["drafter"]) == "drafter"


# Full tier: the same command, suites, kinds, intervals and W&B runs on the random tiny target are
# test_one_command_compares_every_kind_on_every_suite's.
@pytest.mark.slow
@pytest.mark.full
def test_table1_on_the_tiny_world_target_from_the_shared_datasets(tiny_world, tmp_path, monkeypatch):
    """The issue's acceptance run: suites prepared from ``../shared/datasets`` (or their fixtures) and the other
    schemas, DSpark, DFlash, EAGLE-3 and DFlash2 for the tiny world's target, one command, intervals and W&B runs."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    target = tiny_world / "target"
    model = AutoModelForCausalLM.from_pretrained(target, dtype=torch.float32).eval()
    tokenizer = AutoTokenizer.from_pretrained(target)
    world = {"root": tmp_path, "suites": prepare_all_suites(tmp_path, sample=2), "drafters": {}}
    (tmp_path / "target").symlink_to(target, target_is_directory=True)
    for seed, kind in enumerate(KINDS):
        loaded = random_drafter(model, tokenizer, kind, seed=seed)
        cfg = drafter_recipe(kind, loaded.mask_token_id)
        cfg.target.path = str(target)
        world["drafters"][kind] = write_trained_drafter(loaded.module, cfg, tmp_path / kind / "drafter")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    monkeypatch.setenv("WANDB_MODE", "offline")
    out = tmp_path / "table1"
    assert main(_comparison(world, out, "--baseline", "eagle3", "--seed", "0", "1", "--wandb")) == 0
    table = json.loads((out / "table1.json").read_text())["tables"][0]
    assert table["suites"] == list(SUITE_ORDER) and set(table["prompts"].values()) == {2}
    for kind in RATIOS:
        for estimate in table["ratios"][kind].values():
            assert estimate["low"] <= estimate["high"]
    assert len(list((tmp_path / "wandb").glob("offline-run-*"))) == len(KINDS)


def test_modeled_draft_cost_is_the_production_counterparts() -> None:
    """A comparison's modeled draft time per round is the serving-cost model's for the drafter's structure at
    Qwen3-8B widths; DSpark's tiny recipe is under EAGLE-3's there (the cost rule), and a drafter whose settings
    are unknown has none."""
    from deepspec_train.evaluation.drafter_comparison import BenchDrafter
    from deepspec_train.formats.drafter_loader import LoadedDrafter
    from deepspec_train.costs.gpu_specs import gpu_spec
    from deepspec_train.costs.serving_cost import production_counterpart, round_times
    from deepspec_train.kinds.recipe_validation import load_recipe

    modeled = {}
    for recipe in ("tiny-dspark", "tiny-eagle3", "tiny-dflash2"):
        cfg = load_recipe(recipe, check_target=False)
        taps = list(cfg.target.layer_ids)
        loaded = LoadedDrafter(torch.nn.Module(), cfg.drafter.kind, cfg.drafter.block_size, taps, None, None,
                               cfg.drafter.labels, "training", settings=cfg.drafter)
        modeled[recipe] = BenchDrafter(recipe, loaded, None).modeled_draft_us()
        expected = round_times(production_counterpart(cfg.drafter, len(taps), recipe), gpu_spec("H200"), 1).draft_s
        assert modeled[recipe] == pytest.approx(1e6 * expected, rel=1e-12)
    assert modeled["tiny-dspark"] < modeled["tiny-eagle3"]
    unknown = LoadedDrafter(torch.nn.Module(), "dspark", 7, [1], None, None, "dspark", "training")
    assert BenchDrafter("x", unknown, None).modeled_draft_us() is None
