"""Layout rules of the test suite, checked on its source: no file under ``tests/`` imports a test module
(``tests/test_*.py``), so what several test files share lives in ``tests/helpers/``; and the `slurm` and `full` tiers
run only when ``-m`` opts in to them."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.helpers.opt_in_markers import names_marker

TESTS = Path(__file__).resolve().parent


def imported_test_modules(tree: ast.AST) -> list[str]:
    """The test modules (``tests.test_*``) that the import statements anywhere in ``tree`` name, lazy ones too."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module == "tests":
            names = [f"tests.{alias.name}" for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module]
        else:
            continue
        parts = [name.split(".") for name in names]
        found += [".".join(p[:2]) for p in parts if len(p) >= 2 and p[0] == "tests" and p[1].startswith("test_")]
    return found


def test_no_test_file_imports_a_test_module() -> None:
    offenders = {}
    for path in sorted(TESTS.rglob("*.py")):
        imported = imported_test_modules(ast.parse(path.read_text()))
        if imported:
            offenders[str(path.relative_to(TESTS))] = imported
    assert offenders == {}


def test_the_import_check_finds_test_imports() -> None:
    """The scan above must catch each form of importing a test module (else it would pass on anything)."""
    source = (
        "from tests.test_export import random_batch\n"
        "import tests.test_recipe_rules\n"
        "from tests import test_moe_target\n"
        "def f():\n    from tests.test_regenerate import SAMPLING\n"
        "from tests.helpers.tiny_geometry import BLOCK\n"
    )
    assert imported_test_modules(ast.parse(source)) == [
        "tests.test_export", "tests.test_recipe_rules", "tests.test_moe_target", "tests.test_regenerate",
    ]


def test_the_slurm_tier_runs_only_when_named() -> None:
    assert names_marker("slurm", "slurm") and names_marker("slow or slurm", "slurm")
    assert not names_marker("", "slurm") and not names_marker("slow", "slurm") and not names_marker("not gpu", "slurm")


def test_the_full_tier_runs_only_when_named() -> None:
    assert names_marker("full", "full") and names_marker("full or not slurm", "full")
    assert not names_marker("", "full") and not names_marker("slow", "full") and not names_marker("fully", "full")
