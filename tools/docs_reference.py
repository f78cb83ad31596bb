"""Generate the reference pages that must follow the code: every command's flags and every recipe key.

    python -m tools.docs_reference            # rewrite docs/reference/commands.md and recipe_keys.md
    python -m tools.docs_reference --check    # exit 1, naming the stale page, when either is out of date

``docs/reference/commands.md`` is built from the argparse parsers themselves (``commands.dispatch.VERBS``, each verb
module's ``add_arguments``, sub-verbs included) plus ``train.py``'s own command line;
``docs/reference/recipe_keys.md`` from the schema dataclasses (``config/schema.py``: key, type, default and the
comment above each field) and the rules ``config/rules.py`` states for a single key (ranges read from its checking
calls, refusals read from its message strings). Nothing is run: building the parsers imports each verb's module,
nothing more. ``tests/test_docs_truth.py`` renders both pages in memory and fails when the committed files differ.

Each page is written by hand above ``GENERATED_NOTE`` (the commands page's table of what each verb is for, with
examples) and generated below it: a regeneration keeps the hand-written part as committed, so one page can hold
both and the check covers only what the code decides.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import inspect
import re
import sys
import typing
from pathlib import Path
from typing import Any, Iterator, Literal, Union, get_args, get_origin

from deepspec_train.config import rules as rules_module
from deepspec_train.config.schema import RecipeConfig
from deepspec_train.commands.dispatch import VERBS
from deepspec_train.commands.train_entry import DRY_RUN, USAGE

REPO = Path(__file__).resolve().parents[1]
COMMANDS_PAGE = Path("docs/reference/commands.md")
RECIPE_KEYS_PAGE = Path("docs/reference/recipe_keys.md")
GENERATED_NOTE = "<!-- generated below by `python -m tools.docs_reference`: edit the code, not what follows -->"
# The range helpers of config/rules.py and the condition each states about its key.
_RANGE_HELPERS = {"_at_least": ">= {low}{what}", "_positive": "a positive number", "_non_negative": "a number >= 0"}
_KEY_AT_START = re.compile(r"^([a-z_][a-z0-9_]*(?:\.[a-z_][a-z0-9_]*)+)\b")


def _cell(text: object) -> str:
    """One markdown table cell: a single line, pipes escaped."""
    return " ".join(str(text).split()).replace("|", "\\|")


# ---------------------------------------------------------------------------------------------------- commands


def verb_parser(verb: str) -> argparse.ArgumentParser:
    """The parser ``deepspec VERB`` builds, exactly as ``commands.dispatch.main`` builds it (the verb's module
    imported)."""
    parser = argparse.ArgumentParser(prog=f"deepspec {verb}", description=VERBS[verb].help)
    VERBS[verb].load().add_arguments(parser)
    return parser


def subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    """A parser's sub-verbs (``deepspec recipes list|show|copy``), empty when it has none."""
    found: dict[str, argparse.ArgumentParser] = {}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            found.update(action.choices)
    return found


def options(parser: argparse.ArgumentParser) -> set[str]:
    """Every option string a parser accepts (``--help`` included)."""
    return {flag for action in parser._actions for flag in action.option_strings}


def _help_of(action: argparse.Action, prog: str) -> str:
    text = action.help or ""
    if "%" in text:
        # argparse expands %(default)s and friends the same way when it prints --help.
        text = text % {**vars(action), "prog": prog}
    return text


def _argument_rows(parser: argparse.ArgumentParser) -> Iterator[str]:
    for action in parser._actions:
        if isinstance(action, (argparse._HelpAction, argparse._SubParsersAction, argparse._VersionAction)):
            continue
        name = ", ".join(f"`{flag}`" for flag in action.option_strings) or f"`{action.metavar or action.dest}`"
        if action.nargs == 0:
            value = "(switch)"
        else:
            shown = action.metavar or (action.dest.upper() if action.option_strings else action.dest)
            value = {"+": f"{shown} ...", "*": f"[{shown} ...]", "?": f"[{shown}]",
                     argparse.REMAINDER: f"{shown} ..."}.get(action.nargs, shown)
            if action.choices:
                value = " | ".join(str(choice) for choice in action.choices)
        required = action.required or not action.option_strings
        if required and action.nargs != argparse.REMAINDER:
            default = "required"
        elif action.nargs == 0 or action.default is None or action.default is argparse.SUPPRESS:
            default = ""
        else:
            default = '`""`' if action.default == "" else f"`{action.default}`"
        yield f"| {name} | {_cell(value)} | {_cell(default)} | {_cell(_help_of(action, parser.prog))} |"


def _parser_section(parser: argparse.ArgumentParser, level: int) -> Iterator[str]:
    yield f"{'#' * level} `{parser.prog}`"
    yield ""
    if parser.description:
        yield _cell(parser.description)
        yield ""
    rows = list(_argument_rows(parser))
    if rows:
        yield "| argument | value | default | what it does |"
        yield "| --- | --- | --- | --- |"
        yield from rows
        yield ""
    for _, sub in sorted(subcommands(parser).items()):
        yield from _parser_section(sub, level + 1)


def render_commands() -> str:
    lines = [
        "Every `deepspec` verb and its arguments, read from the argparse definitions",
        "(`deepspec_train/commands/dispatch.py` and each verb's `add_arguments`). `--help` prints the same and exits 0",
        "everywhere; a bad argument exits 2.",
        "Exit statuses: `exit_statuses.md`.",
        "",
        "## `deepspec`",
        "",
        "| argument | what it does |",
        "| --- | --- |",
        "| `VERB` | one of: " + ", ".join(f"`{verb}`" for verb in VERBS) + " |",
        "| `--version` | the installed package's version |",
        "| `-h`, `--help` | the verbs, one line each |",
        "",
        "## `python train.py` (also `deepspec train`)",
        "",
        f"`{USAGE.removeprefix('usage: ')}`: a recipe name (or a YAML path), then `section.key=value` overrides",
        "of the keys in `recipe_keys.md`.",
        "",
        "| argument | what it does |",
        "| --- | --- |",
        "| `recipe=NAME` | the recipe: a name found by `deepspec recipes list`, or a path to a YAML file |",
        "| `section.key=value` | an override; an unknown key or a value of the wrong type exits 2 |",
        f"| `{DRY_RUN}` | run every check a run makes (the target's files and tokenizer, the data sources' first rows "
        "included), print the resolved config as YAML and what was found, train nothing; exit 0 only when a run "
        "would start, else 2 |",
        "| `-h`, `--help` | the usage, the recipes found and where they were found |",
        "",
    ]
    for verb in VERBS:
        lines.extend(_parser_section(verb_parser(verb), 2))
    return "\n".join(lines).rstrip() + "\n"


# ---------------------------------------------------------------------------------------------------- recipe keys


def _type_name(annotation: Any) -> str:
    origin = get_origin(annotation)
    if origin is Literal:
        return "one of " + ", ".join(f"`{value}`" for value in get_args(annotation))
    if origin is Union:
        kept = [arg for arg in get_args(annotation) if arg is not type(None)]
        return " or ".join(_type_name(arg) for arg in kept) + " or null"
    if origin in (list, tuple):
        return "list of " + ", ".join(_type_name(arg) for arg in get_args(annotation) if arg is not Ellipsis)
    return getattr(annotation, "__name__", str(annotation))


def _default_of(item: dataclasses.Field) -> Any:
    if item.default is not dataclasses.MISSING:
        return item.default
    return item.default_factory()  # type: ignore[misc]


def _shown_default(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return f'`"{value}"`' if value == "" else f"`{value}`"
    return f"`{value}`"


def field_comments(cls: type) -> dict[str, str]:
    """The comment lines right above each field of a schema dataclass, joined: the schema's own explanation."""
    comments: dict[str, str] = {}
    pending: list[str] = []
    for line in inspect.getsource(cls).splitlines()[1:]:
        stripped = line.strip()
        if stripped.startswith("#"):
            pending.append(stripped.lstrip("#").strip())
            continue
        match = re.match(r"([a-z_][a-z0-9_]*)\s*:", stripped)
        if match:
            comments[match.group(1)] = " ".join(pending)
        pending = []
    return comments


def _strings_of(node: ast.AST, loop_values: dict[str, tuple[str, ...]]) -> list[str]:
    """The texts a string node can take: a constant, or an f-string (a loop variable expanded over the loop's
    constant tuple, any other value shown as ``…``)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if not isinstance(node, ast.JoinedStr):
        return []
    texts = [""]
    for part in node.values:
        if isinstance(part, ast.Constant):
            texts = [text + str(part.value) for text in texts]
        elif isinstance(part.value, ast.Name) and part.value.id in loop_values:
            texts = [text + value for text in texts for value in loop_values[part.value.id]]
        else:
            texts = [text + "…" for text in texts]
    return texts


def stated_rules() -> dict[str, list[str]]:
    """What ``config/rules.py`` checks about one key: the range helpers' conditions, and every refusal message
    that starts with the key (read from the source, so the page cannot drift from the checks)."""
    tree = ast.parse(inspect.getsource(rules_module))
    loop_values: dict[str, tuple[str, ...]] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.For) and isinstance(node.target, ast.Name) and isinstance(node.iter, ast.Tuple):
            values = tuple(elt.value for elt in node.iter.elts if isinstance(elt, ast.Constant))
            loop_values[node.target.id] = values
    found: dict[str, list[str]] = {}
    inside_helper_calls: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in _RANGE_HELPERS:
            inside_helper_calls.update(id(child) for child in ast.walk(node))
            low = node.args[3].value if len(node.args) > 3 and isinstance(node.args[3], ast.Constant) else ""
            what = node.args[4].value if len(node.args) > 4 and isinstance(node.args[4], ast.Constant) else ""
            rule = _RANGE_HELPERS[node.func.id].format(low=low, what=what)
            for key in _strings_of(node.args[1], loop_values):
                found.setdefault(key, []).append(rule)
    inner: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.JoinedStr):
            inner.update(id(part) for part in node.values)
    for node in ast.walk(tree):
        if id(node) in inside_helper_calls or id(node) in inner:
            continue
        for text in _strings_of(node, loop_values):
            match = _KEY_AT_START.match(text)
            if match and "\n" not in text:
                found.setdefault(match.group(1), []).append(f"refused as `{text}`")
    return found


def _section_rows(prefix: str, cls: type, rules: dict[str, list[str]]) -> Iterator[str]:
    hints = typing.get_type_hints(cls)
    comments = field_comments(cls)
    for item in dataclasses.fields(cls):
        key = f"{prefix}.{item.name}"
        annotation = hints[item.name]
        if dataclasses.is_dataclass(annotation):
            yield from _section_rows(key, annotation, rules)
            continue
        checks = "; ".join(rules.get(key, []))
        yield (f"| `{key}` | {_cell(_type_name(annotation))} | {_cell(_shown_default(_default_of(item)))} | "
               f"{_cell(comments.get(item.name, ''))} | {_cell(checks)} |")


def render_recipe_keys() -> str:
    rules = stated_rules()
    lines = [
        "Every key a recipe (`recipes/*.yaml`) or a `section.key=value` override may set, read from the schema",
        "(`deepspec_train/config/schema.py`): its type, its default (what a recipe that does not name it gets) and",
        "the schema's comment. \"Checked\" lists what `deepspec_train/config/rules.py` states about that key alone;",
        "rules that tie keys to the drafter kind (`deepspec_train/kinds/`), to the target's `config.json` or to the",
        "launch are checked too, before anything loads. A recipe may also hold a `regenerate` section, read by",
        "`deepspec regenerate` (`deepspec regenerate --help`), and `base: NAME` to inherit another recipe.",
        "`deepspec recipes show NAME` prints a recipe with every key filled in.",
        "",
    ]
    for section in dataclasses.fields(RecipeConfig):
        lines += [f"## `{section.name}`", "",
                  "| key | type | default | meaning | checked |", "| --- | --- | --- | --- | --- |"]
        lines.extend(_section_rows(section.name, typing.get_type_hints(RecipeConfig)[section.name], rules))
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"


# ---------------------------------------------------------------------------------------------------- entry


def hand_written_part(page: Path) -> str:
    """What the committed ``page`` holds above ``GENERATED_NOTE``: written by hand, kept as it is."""
    head, note, _ = (REPO / page).read_text().partition(GENERATED_NOTE)
    if not note:
        # Without the note there is no telling the hand-written part from a stale generated one.
        raise SystemExit(f"{page}: the line {GENERATED_NOTE} is missing; put it back above the generated part")
    return head


def generated_pages() -> dict[Path, str]:
    """Each generated page's path (relative to the repository) and its text: hand-written part, note, generated."""
    renderers = {COMMANDS_PAGE: render_commands, RECIPE_KEYS_PAGE: render_recipe_keys}
    return {page: f"{hand_written_part(page)}{GENERATED_NOTE}\n\n{render()}" for page, render in renderers.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.docs_reference",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 if a page is out of date")
    args = parser.parse_args(argv)
    stale = []
    for path, text in generated_pages().items():
        target = REPO / path
        if target.read_text() == text:
            continue
        if args.check:
            stale.append(str(path))
        else:
            target.write_text(text)
            print(f"wrote {path}")
    if stale:
        print(f"out of date: {', '.join(stale)} (run python -m tools.docs_reference)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
