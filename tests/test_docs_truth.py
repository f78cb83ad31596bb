"""The docs name only what exists: every `deepspec` verb and flag, recipe key, recipe and repository path.

A scan reads the code in README.md and docs/ (fenced blocks, with `\\` continuations joined, and inline code
spans) and reports each name the code does not have: verbs and flags against the parsers `deepspec` builds
(``commands.dispatch.VERBS`` and each verb's ``add_arguments``; nothing is run), `train.py`'s options, `section.key`
recipe keys against the schema dataclasses, recipe names against `recipes/*.yaml`, and repository paths against
the working tree. The history pages (docs/contributors/lab_notebook.md, measurement_history.md) are held to the
path check only: their commands are dated records of what ran then. A self-check plants one wrong name of each
sort, so the scan cannot pass by finding nothing; and the generated reference pages must equal what
``tools.docs_reference`` renders now.
"""

from __future__ import annotations

import dataclasses
import re
import shlex
import typing
from functools import lru_cache
from pathlib import Path

from tools import docs_reference
from deepspec_train.config.schema import RecipeConfig
from deepspec_train.commands.dispatch import VERBS
from deepspec_train.commands.train_entry import DRY_RUN, HELP_OPTIONS

REPO = Path(__file__).resolve().parents[1]
CONTRIBUTORS = REPO / "docs" / "contributors"
HISTORY = {CONTRIBUTORS / "lab_notebook.md", CONTRIBUTORS / "measurement_history.md"}
TRAIN_PY_OPTIONS = {DRY_RUN, *HELP_OPTIONS}
# A path is checked when it names a file of one of these kinds; the repository holds no data or results, so a
# `.jsonl` or `.json` outside launch/ is a user's file or an output, never one of ours.
CHECKED_SUFFIXES = {".py", ".md", ".yaml", ".yml", ".sh", ".sbatch", ".toml"}
# Folders named with a trailing slash are checked under these roots (data/ also names users' output folders).
CHECKED_FOLDERS = {"deepspec_train", "tests", "bench", "launch", "recipes", "docs"}
# Markdown files that commands write (an eval table, a comparison, the quality report): named, never shipped.
OUTPUT_PAGES = {"table1.md", "comparison.md", "quality.md"}
# Words the docs write for "the name you choose" inside a path (`recipes/NAME.yaml`, `RUN/drafter`).
# What a user's commands make (ignored by git): a path under them names an output, whether or not this checkout
# happens to hold one.
USER_OUTPUTS = {"runs", "artifacts", "exports"}
PLACEHOLDERS = {"NAME", "RUN", "DIR", "OUT", "FILE", "PATH", "WORLD", "TW", "EXPORT", "RECIPE", "T", "P", "O"}
RECIPE_LIKE = re.compile(r"(tiny|qwen3|llama|gemma|gpt-oss|deepseek|kimi)-[a-z0-9.-]*[a-z0-9](\.yaml)?")
# Words after which a command names a recipe: bench/quality.py's --recipes, `deepspec recipes show|copy`, the
# Slurm scripts' first argument.
RECIPE_ARGUMENTS = ("--recipe", "--recipes", "show", "copy", ".sbatch")
PATH_LIKE = re.compile(r"(?<![\w./-])([\w.-]+(?:/[\w.*{}<>,-]*)+|[\w-]+\.md)")


@lru_cache(maxsize=None)
def verb_options() -> dict[str, tuple[set[str], dict[str, set[str]]]]:
    """Per verb: its own options and each sub-verb's."""
    found = {}
    for verb in VERBS:
        parser = docs_reference.verb_parser(verb)
        subs = {name: docs_reference.options(sub) for name, sub in docs_reference.subcommands(parser).items()}
        found[verb] = (docs_reference.options(parser), subs)
    return found


@lru_cache(maxsize=None)
def recipe_keys() -> tuple[set[str], set[str]]:
    """Every `section.key` and `section.key.sub` of the schema, and the keys that are themselves sections."""
    keys: set[str] = set()
    nested: set[str] = set()

    def walk(prefix: str, cls: type) -> None:
        for name, annotation in typing.get_type_hints(cls).items():
            key = f"{prefix}.{name}" if prefix else name
            if dataclasses.is_dataclass(annotation):
                nested.add(key)
                walk(key, annotation)
            keys.add(key)

    walk("", RecipeConfig)
    return keys, nested


SECTIONS = tuple(field.name for field in dataclasses.fields(RecipeConfig))
KEY_LIKE = re.compile(rf"(?<![\w./-])({'|'.join(SECTIONS)})\.([a-z_][a-z0-9_]*)(?:\.([a-z_][a-z0-9_]*))?(?![\w(/])")
FILE_SUFFIXES = {"py", "md", "yaml", "yml", "json", "jsonl", "sh", "txt", "sbatch", "log", "png", "safetensors"}


def recipe_names() -> set[str]:
    return {path.stem for path in (REPO / "recipes").glob("*.yaml")}


def code_of(text: str) -> list[str]:
    """The code of a page: each fenced block's lines (continuations joined) and each inline code span."""
    pieces: list[str] = []
    outside: list[str] = []
    fenced = re.split(r"^```[^\n]*\n", text, flags=re.M)
    # split() alternates outside / inside a fence; a fence's end is the next ``` line.
    for index, part in enumerate(fenced):
        if index % 2:
            block, _, rest = part.partition("```")
            pieces.extend(block.replace("\\\n", " ").splitlines())
            outside.append(rest)
        else:
            outside.append(part)
    for part in outside:
        pieces.extend(" ".join(span.split()) for span in re.findall(r"`([^`]+)`", part))
    return [piece.replace("\\|", "|") for piece in pieces]


def _tokens(command: str) -> list[str]:
    try:
        return shlex.split(command, comments=True)
    except ValueError:
        return command.split()


def _flag(token: str) -> str:
    return token.split("=", 1)[0].rstrip(",.;:)]")


def command_problems(code: str) -> list[str]:
    """Unknown `deepspec` verbs and flags, and `train.py` options that do not exist, in one piece of code."""
    problems = []
    for command in re.split(r"&&|;|\|\||(?<![\\])\|(?![a-z-]*\s*\|)", code):
        tokens = _tokens(command)
        for start, token in enumerate(tokens):
            if token == "deepspec" and start + 1 < len(tokens):
                problems.extend(_verb_problems(tokens[start + 1:]))
            if token.endswith("train.py"):
                problems.extend(f"train.py has no option {_flag(t)}" for t in tokens[start + 1:]
                                if t.startswith("-") and _flag(t) not in TRAIN_PY_OPTIONS)
    return problems


def _verb_problems(words: list[str]) -> list[str]:
    verb = words[0].rstrip(",.;:)'")
    if not re.fullmatch(r"[a-z][a-z-]*", verb):
        return []  # a placeholder (VERB), an alternative list or prose
    if verb not in VERBS:
        return [f"deepspec has no verb {verb!r}"]
    own, subs = verb_options()[verb]
    allowed = set(own)
    if subs:
        sub = words[1] if len(words) > 1 else ""
        if sub in subs:
            allowed |= subs[sub]
        elif re.fullmatch(r"[a-z][a-z-]*", sub):
            return [f"deepspec {verb} has no sub-verb {sub!r}"]
        else:
            allowed |= set().union(*subs.values())
    return [f"deepspec {verb} has no flag {_flag(word)}" for word in words[1:]
            if re.match(r"--?[a-z]", word) and _flag(word) not in allowed]


def key_problems(code: str) -> list[str]:
    keys, nested = recipe_keys()
    problems = []
    for section, key, sub in KEY_LIKE.findall(code):
        if key in FILE_SUFFIXES and not sub:
            continue  # a file such as data.md or train.py
        name = f"{section}.{key}"
        if name not in keys:
            problems.append(f"no recipe key {name}")
        elif sub and name in nested and f"{name}.{sub}" not in keys:
            problems.append(f"no recipe key {name}.{sub}")
    for recipe in re.findall(r"(?<![\w/])([a-z0-9][\w.-]*):(?:" + "|".join(SECTIONS) + r")\.", code):
        if recipe not in recipe_names():
            problems.append(f"no recipe {recipe!r}")
    return problems


def recipe_problems(code: str) -> list[str]:
    names = recipe_names()
    problems = []
    for value in re.findall(r"\brecipe=([^\s`'\"),]+)", code):
        if not value.endswith((".yaml", ".yml")) and not re.search(r"[A-Z]", value) and value not in names:
            problems.append(f"no recipe {value!r}")
    # A code span that is one recipe-like word (`qwen3-8b-dflash`), and the words that follow a recipe argument.
    named = [code] if RECIPE_LIKE.fullmatch(code) else []
    tokens = _tokens(code)
    for index, token in enumerate(tokens[:-1]):
        if token.endswith(RECIPE_ARGUMENTS):
            for word in tokens[index + 1:]:
                if word.startswith("-") or "=" in word or not RECIPE_LIKE.fullmatch(word):
                    break
                named.append(word)
    problems.extend(f"no recipe {value!r}" for value in named if value.removesuffix(".yaml") not in names)
    return problems


def path_problems(code: str, page: Path) -> list[str]:
    problems = []
    for raw in PATH_LIKE.findall(code):
        path = raw.rstrip(".,;:)")
        if re.search(r"[<>{}*$]|\.\.\.", path) or (raw.endswith(".") and "/" not in path.rstrip(".")):
            continue
        if PLACEHOLDERS & {part.split(".")[0] for part in path.split("/")}:
            continue
        first = path.split("/", 1)[0]
        bases = [REPO, REPO / "deepspec_train", page.parent, REPO / "docs"]
        if "/" not in path:
            if path in OUTPUT_PAGES or not path.endswith(".md"):
                continue
        elif path.endswith("/"):
            if first not in CHECKED_FOLDERS:
                continue
        elif not (Path(path).suffix in CHECKED_SUFFIXES or (first == "launch" and path.endswith(".json"))):
            continue
        if first in USER_OUTPUTS or "/" in path and not any((base / first).exists() for base in bases):
            continue  # runs/, exports/, models/Qwen3-8B ...: what a user makes, not what the repository ships
        if not any((base / path).exists() for base in bases):
            problems.append(f"no such path {path}")
    return problems


def scan(text: str, page: Path, history: bool = False) -> list[str]:
    """Every wrong name in a page's code; a history (or generated) page is held to its paths only."""
    problems = []
    for code in code_of(text):
        problems.extend(path_problems(code, page))
        if not history:
            problems.extend(command_problems(code) + key_problems(code) + recipe_problems(code))
    return problems


def doc_pages() -> list[Path]:
    return [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]


def test_every_name_in_the_docs_exists() -> None:
    found: dict[str, list[str]] = {}
    for page in doc_pages():
        # What a reference page holds below the generated note comes from the code itself (checked below to be up
        # to date): its keys and flags are the code's by construction, and the schema's comments name modules
        # (``data.loss_mask``) that read like keys. The hand-written part above the note is checked in full.
        written, _, generated = page.read_text().partition(docs_reference.GENERATED_NOTE)
        problems = scan(written, page, history=page in HISTORY) + scan(generated, page, history=True)
        if problems:
            found[str(page.relative_to(REPO))] = sorted(set(problems))
    assert not found, found


def test_the_scan_reports_a_planted_wrong_name_of_every_sort() -> None:
    planted = "\n".join([
        "Check with `deepspec eval --target DIR --no-such-flag 3` and `deepspec nosuchverb --out X`,",
        "then `deepspec recipes shw qwen3-8b`.",
        "```bash",
        "python train.py recipe=no-such-recipe train.no_such_key=1 \\",
        "    --no-such-option",
        "```",
        "Recipes: `qwen3-9b-dspark`, keys such as `drafter.nonexistent`; see `deepspec_train/no_such_module.py`",
        "and `no_such_page.md`.",
    ])
    problems = scan(planted, REPO / "docs" / "planted.md")
    for expected in ["deepspec eval has no flag --no-such-flag", "deepspec has no verb 'nosuchverb'",
                     "deepspec recipes has no sub-verb 'shw'", "no recipe 'no-such-recipe'",
                     "no recipe key train.no_such_key", "train.py has no option --no-such-option",
                     "no recipe 'qwen3-9b-dspark'", "no recipe key drafter.nonexistent",
                     "no such path deepspec_train/no_such_module.py", "no such path no_such_page.md"]:
        assert expected in problems, (expected, problems)
    # The same names, all real, report nothing.
    real = ("`deepspec eval --target DIR --out r.json`, `deepspec recipes show qwen3-8b`, `train.lr=1e-4`, "
            "`python train.py recipe=tiny-dspark --dry-run`, `deepspec_train/commands/dispatch.py`, `howto/data.md`")
    assert scan(real, REPO / "docs" / "planted.md") == []
    # A history page answers for its paths only.
    assert scan(planted, CONTRIBUTORS / "planted.md", history=True) == [
        "no such path deepspec_train/no_such_module.py", "no such path no_such_page.md"]


def test_the_generated_reference_pages_are_up_to_date() -> None:
    for path, text in docs_reference.generated_pages().items():
        assert (REPO / path).read_text() == text, f"{path} is stale: run python -m tools.docs_reference"
