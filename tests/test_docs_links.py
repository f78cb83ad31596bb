"""Every page the repository names exists where it is named: the docs move between the folders of their kinds
(``docs/README.md`` maps them), and a mention left behind is a dead end for the reader who follows it.

Three sorts of mention are read. In a markdown file, a link ``[text](target)`` resolves from the page's own folder,
as a renderer resolves it, and a page path in the text (``../reference/training.md``, ``data.md``) from the page's
folder or from the repository's root (``docs/howto/data.md``, ``data/README.md``): the docs' own style, checked
strictly, where ``tests/test_docs_truth.py`` accepts a path under any of several roots. In code, recipes, scripts
and pages alike, a ``docs/...`` path resolves from the root. A self-check plants a broken mention of each sort.
"""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# Where the repository's own text lives; runs/, artifacts/ and the like hold a user's outputs.
SCANNED = [REPO / "README.md", REPO / "train.py", REPO / "pyproject.toml",
           *(REPO / folder for folder in ("bench", "data", "deepspec_train", "docs", "launch", "recipes", "tests",
                                          "tools"))]
SUFFIXES = {".py", ".md", ".yaml", ".yml", ".sh", ".sbatch", ".toml"}
# This file plants broken mentions on purpose (below); scanning it would report them.
SELF = Path(__file__).resolve()
LINK = re.compile(r"\[[^\]\n]*\]\(([^)\s]+)\)")
PAGE = re.compile(r"(?<![\w/.<>{}$-])((?:\.\./)*(?:[\w.-]+/)*[\w-]+\.md)(?![\w/])")
DOCS_PATH = re.compile(r"(?<![\w/.-])(docs/[\w./-]*)")
# Markdown files that commands write (a report, a table): named in the docs as outputs, never shipped.
OUTPUT_PAGES = {"table1.md", "comparison.md", "quality.md"}


def scanned_files() -> list[Path]:
    files = []
    for root in SCANNED:
        candidates = [root] if root.is_file() else root.rglob("*")
        files.extend(path for path in candidates if path.suffix in SUFFIXES and "__pycache__" not in path.parts)
    return sorted(path for path in files if path != SELF)


def link_problems(text: str, page: Path) -> list[str]:
    """Link targets of a markdown page that do not exist from its folder (web addresses and anchors skipped)."""
    problems = []
    for target in LINK.findall(text):
        if re.match(r"[a-z]+:|#", target):
            continue
        path = target.split("#", 1)[0]
        if not (page.parent / path).exists():
            problems.append(f"link to a missing {target}")
    return problems


def page_problems(text: str, page: Path) -> list[str]:
    """Markdown page paths in a page's text that exist neither from its folder nor from the repository's root."""
    problems = []
    # A link's target is held to the link rule alone, a docs/ path to the root rule.
    for path in PAGE.findall(LINK.sub("", text)):
        if path.startswith("docs/") or path.rsplit("/", 1)[-1] in OUTPUT_PAGES:
            continue
        if not ((page.parent / path).exists() or (REPO / path).exists()):
            problems.append(f"no page {path}")
    return problems


def docs_path_problems(text: str) -> list[str]:
    """``docs/...`` paths that do not exist from the repository's root."""
    return [f"no such path {path}" for path in (raw.rstrip(".,;:") for raw in DOCS_PATH.findall(text))
            if not (REPO / path).exists()]


def mention_problems(text: str, file: Path) -> list[str]:
    problems = docs_path_problems(text)
    if file.suffix == ".md":
        problems += link_problems(text, file) + page_problems(text, file)
    return problems


def test_every_named_page_exists() -> None:
    found = {}
    for file in scanned_files():
        problems = mention_problems(file.read_text(), file)
        if problems:
            found[str(file.relative_to(REPO))] = sorted(set(problems))
    assert not found, found


def test_the_check_reports_a_planted_broken_mention_of_every_sort() -> None:
    page = REPO / "docs" / "howto" / "planted.md"
    planted = "\n".join([
        "See [the data page](../reference/data.md) and [its shapes](data.md#row-shapes),",
        "then `../training.md` and `reference/exit_statuses.md` (the docs' root, not this folder),",
        "and docs/testing.md from the root.",
    ])
    assert sorted(mention_problems(planted, page)) == [
        "link to a missing ../reference/data.md", "no page ../training.md", "no page reference/exit_statuses.md",
        "no such path docs/testing.md"]
    # A Python file is read for docs/ paths only.
    assert mention_problems('raise SystemExit("see docs/data.md")', REPO / "deepspec_train" / "planted.py") == [
        "no such path docs/data.md"]
    # The same mentions, all resolved, report nothing: from the page's folder, from the root, the web, an output.
    real = ("See [the data page](data.md#row-shapes), [training](../reference/training.md), "
            "[DSpark](https://example.org/a.md), `../reference/exit_statuses.md`, `docs/contributors/testing.md`, "
            "`data/README.md`, `runs/demo/quality.md` and docs/howto/.")
    assert mention_problems(real, page) == []
