"""The tutorial's laptop path (docs/tutorial/laptop_to_gpu.md, part 1) stays runnable as written: its commands parse
with the parsers `deepspec` builds, each reads what the one before it writes, the laptop recipe validates against
SmolLM2's config and tokenizer and fits every shipped prompt with a full-length answer, and the shipped prompt set
(``builtin:gsm8k-train``) loads, splits into disjoint parts the evaluator reads, and shares no prompt with the
benchmark suites (GSM8K test, HumanEval; their fingerprints are kept in tests/data). Fast: nothing is trained.
"""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest

from tools import docs_reference
from deepspec_train.config.loader import load_recipe_section
from deepspec_train.regenerate.settings import RegenerateConfig
from deepspec_train.evaluation.suites import read_suite_file
from deepspec_train.commands.dispatch import main as deepspec
from deepspec_train.realworld.builtin_prompts import BUILTIN_PROMPT_SETS, prompt_fingerprint, resolve_prompt_source
from deepspec_train.kinds.recipe_validation import load_recipe
from tests.helpers.real_world import real_config_target  # noqa: F401 (a fixture)

REPO = Path(__file__).resolve().parents[1]
TUTORIAL = REPO / "docs" / "tutorial" / "laptop_to_gpu.md"
FINGERPRINTS = Path(__file__).parent / "data" / "benchmark_prompt_fingerprints.txt"
LAPTOP_RECIPE = "smollm2-135m-laptop"
# GSM8K's test split and HumanEval, as published.
BENCHMARK_SIZES = {"gsm8k-test": 1319, "humaneval": 164}


def laptop_commands() -> list[list[str]]:
    """The words of each command of part 1's first code block (continuations joined, comments dropped)."""
    part = TUTORIAL.read_text(encoding="utf-8").split("\n## 2.")[0]
    block = re.search(r"```bash\n(.*?)```", part, flags=re.S).group(1).replace("\\\n", " ")
    commands = []
    for line in block.splitlines():
        for command in line.split("&&"):
            words = shlex.split(command, comments=True)
            if words:
                commands.append(words)
    return commands


def option(words: list[str], name: str) -> str:
    return words[words.index(name) + 1]


def deepspec_command(commands: list[list[str]], verb: str, sub: str | None = None) -> list[str]:
    (found,) = [w for w in commands if w[:2] == ["deepspec", verb] and (sub is None or w[2] == sub)]
    return found


def test_the_tutorial_laptop_commands_parse_and_each_reads_what_the_one_before_wrote() -> None:
    commands = laptop_commands()
    for words in commands:
        if words[0] == "deepspec":
            docs_reference.verb_parser(words[1]).parse_args(words[2:])  # a bad flag exits (status 2)
    (train,) = [w for w in commands if w[:2] == ["python", "train.py"]]
    assert train[2] == f"recipe={LAPTOP_RECIPE}"
    cfg = load_recipe(LAPTOP_RECIPE, train[3:], check_target=False)

    build = deepspec_command(commands, "realworld", "build")
    prompts = deepspec_command(commands, "realworld", "prompts")
    regenerate = deepspec_command(commands, "regenerate")
    export = deepspec_command(commands, "export")
    evaluate = deepspec_command(commands, "eval")
    target = option(build, "--out")
    assert cfg.target.path == target == option(export, "--target") == option(evaluate, "--target")
    assert option(prompts, "--source").startswith("builtin:")
    assert option(regenerate, "--input") == f"{option(prompts, '--out')}/train.jsonl"
    assert option(regenerate, "--recipe") == LAPTOP_RECIPE
    assert cfg.data.train == [option(regenerate, "--out")] and cfg.data.validation == []
    assert option(export, "--drafter") == f"{cfg.run.output_dir}/drafter"
    assert option(evaluate, "--drafter") == option(export, "--out")
    assert option(evaluate, "--suite") == f"{option(prompts, '--out')}/suite.jsonl"
    assert int(option(prompts, "--suite")) >= 1


def test_the_laptop_recipe_validates_and_fits_every_shipped_prompt_with_a_full_answer(
        real_config_target: Path) -> None:  # noqa: F811 (the fixture)
    from transformers import AutoTokenizer

    cfg = load_recipe(LAPTOP_RECIPE, [f"target.path={real_config_target}"])
    assert cfg.drafter.init_from_target_layers == [25, 26, 27, 28, 29] and cfg.train.feature_reuse > 1
    regenerate = load_recipe_section(LAPTOP_RECIPE, "regenerate", RegenerateConfig)
    tokenizer = AutoTokenizer.from_pretrained(real_config_target)
    questions = [json.loads(line)["question"] for line in resolve_prompt_source("builtin:gsm8k-train").open()]
    longest = max(len(tokenizer.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True,
                                                    tokenize=True, return_dict=False)) for q in questions)
    # The answer's turn end and the newline after it follow the last generated token.
    assert longest + regenerate.max_new_tokens + 2 <= cfg.data.max_length


def test_the_shipped_prompt_set_shares_no_prompt_with_the_benchmark_suites() -> None:
    rows = [json.loads(line) for line in resolve_prompt_source("builtin:gsm8k-train").open(encoding="utf-8")]
    assert len(rows) == 128 and len({row["id"] for row in rows}) == 128
    assert all(re.fullmatch(r"gsm8k-train-\d+", row["id"]) and row["question"].strip() for row in rows)
    benchmark: dict[str, set[str]] = {}
    for line in FINGERPRINTS.read_text().splitlines():
        suite, fingerprint = line.split()
        benchmark.setdefault(suite, set()).add(fingerprint)
    assert {suite: len(prints) for suite, prints in benchmark.items()} == BENCHMARK_SIZES
    shared = {prompt_fingerprint(row["question"]) for row in rows} & set().union(*benchmark.values())
    assert shared == set()


def test_a_fingerprint_folds_case_and_spacing_only() -> None:
    assert prompt_fingerprint("Natalia sold  clips\nto 48 friends.") == prompt_fingerprint("natalia sold clips to 48 "
                                                                                         "FRIENDS.")
    assert prompt_fingerprint("Natalia sold clips to 48 friends.") != prompt_fingerprint("Natalia sold clips to 49 "
                                                                                         "friends.")


def test_builtin_prompts_split_into_disjoint_parts_and_a_suite_the_evaluator_reads(tmp_path: Path, capsys) -> None:
    out = tmp_path / "prompts"
    assert deepspec(["realworld", "prompts", "--source", "builtin:gsm8k-train", "--out", str(out), "--train", "32",
                     "--validation", "4", "--suite", "8"]) == 0
    assert "32 train, 4 validation and 8 suite" in capsys.readouterr().out
    parts = {name: [json.loads(line) for line in (out / f"{name}.jsonl").open()] for name in ("train", "validation")}
    suite = read_suite_file(out / "suite.jsonl")
    ids = [row["id"] for row in parts["train"] + parts["validation"]] + [prompt.id for prompt in suite.prompts]
    assert [len(parts["train"]), len(parts["validation"]), len(suite.prompts)] == [32, 4, 8]
    assert len(set(ids)) == len(ids)
    shipped = {row["id"]: row["question"] for row in map(json.loads, BUILTIN_PROMPT_SETS["gsm8k-train"].path.open())}
    assert all(prompt.turns == (shipped[prompt.id],) for prompt in suite.prompts)


@pytest.mark.parametrize("argv, message", [
    (["--source", "builtin:gsm8k-test"], "no such built-in prompt set; built-in: builtin:gsm8k-train"),
    (["--source", "builtin:gsm8k-train", "--train", "120", "--validation", "8", "--suite", "8"],
     "--train 120 + --validation 8 + --suite 8 exceed the 128 rows of builtin:gsm8k-train"),
])
def test_a_wrong_builtin_request_ends_in_one_line(tmp_path: Path, capsys, argv: list[str], message: str) -> None:
    assert deepspec(["realworld", "prompts", "--out", str(tmp_path / "p"), *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1
