"""Structural rules of the package, checked on its source: imports go one way between modules and between packages (no
module or package imports itself back through others; function-level and type-checking imports count), and down the rows
of the package map that ``docs/contributors/architecture.md`` draws (the page is the layer table: a package or module
imports only its own row and the rows under it, and every one of them is drawn); decisions on the drafter kind go
through the kind registry (``deepspec_train/kinds``) instead of ``kind == ...`` switches on any registered kind and
``isinstance`` tests on drafter classes scattered over the code, decisions on the serving layout go through the layout
records instead of ``layout == ...`` switches, decisions on the Markov head's form go through its records
(``models/markov_forms.py``); the recipe schema's enumerations agree with the registries, and no function of the package
or of ``bench/`` takes more than eight parameters (related ones travel as one record)."""

from __future__ import annotations

import ast
import re
from collections.abc import Callable
from pathlib import Path
from typing import get_args

from deepspec_train.config.schema import LABEL_CONVENTIONS, MARKOV_HEAD_TYPES, DrafterKindName
from deepspec_train.serving_layouts.engine_reading import ENGINES
from deepspec_train.serving_layouts.layout_registry import LAYOUTS
from deepspec_train.kinds.registry import KINDS
from deepspec_train.models.markov_forms import MARKOV_FORMS

PACKAGE = Path(__file__).resolve().parents[1] / "deepspec_train"
BENCH = PACKAGE.parent / "bench"
MAX_PARAMETERS = 8
ARCHITECTURE_PAGE = PACKAGE.parent / "docs" / "contributors" / "architecture.md"
# Every registered kind: a switch on a kind added later is caught as soon as its record is registered.
KIND_NAMES = set(KINDS)
DRAFTER_CLASSES = {"ParallelDrafter", "Eagle3Drafter", "DFlash2Drafter"}
# The only modules that may name a drafter kind: the recipe schema (its allowed values) and the kind records.
KIND_PLACES = {"config/schema.py", "kinds/parallel.py", "kinds/eagle3.py", "kinds/dflash2.py"}
# Layout names and the architectures that identify them; only the layout records may test for one.
LAYOUT_NAMES = set(LAYOUTS) | {spec.architecture for spec in LAYOUTS.values()}
LAYOUT_PLACES = {
    "serving_layouts/dspark_layout.py", "serving_layouts/speculators_dspark_layout.py",
    "serving_layouts/zlab_dflash_layout.py", "serving_layouts/eagle3_layout.py",
}


def _modules() -> dict[str, Path]:
    modules = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        modules[name] = path
    return modules


def _imports(path: Path, modules: dict[str, Path]) -> set[str]:
    return _imports_of_tree(ast.parse(path.read_text()), modules)


def _imports_of_tree(tree: ast.AST, modules: dict[str, Path]) -> set[str]:
    found = set()
    for node in ast.walk(tree):
        names = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
        found.update(name for name in names if name in modules)
    return found


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on_stack, result, counter = {}, {}, [], set(), [], [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                result.append(sorted(component))

    for v in graph:
        if v not in index:
            visit(v)
    return result


def test_no_import_circle_in_the_package() -> None:
    modules = _modules()
    # A package's __init__ is imported with each of its modules; edges into it are not a circle by themselves.
    graph = {
        name: {dep for dep in _imports(path, modules) if not PACKAGE.joinpath(*dep.split(".")[1:], "__init__.py").exists()}
        for name, path in modules.items()
    }
    assert _cycles(graph) == []


def _package_of(module: str) -> str:
    """``deepspec_train.kinds.builder`` -> ``kinds``; a top-level module (``deepspec_train.costs``) is its own node."""
    return module.split(".")[1] if module.count(".") >= 1 else module


def package_graph() -> dict[str, set[str]]:
    """Which package of ``deepspec_train`` imports which, counting every import statement in every module."""
    modules = _modules()
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        if name == "deepspec_train":
            continue
        source = _package_of(name)
        targets = {_package_of(dep) for dep in _imports(path, modules) if dep != "deepspec_train"}
        graph.setdefault(source, set()).update(targets - {source})
    for targets in list(graph.values()):
        for target in targets:
            graph.setdefault(target, set())
    return graph


def test_the_package_graph_has_no_cycle() -> None:
    """Packages import one way: the entry (``commands``) and the training jobs (``jobs``) on top, kinds above models
    and config, readers of stage files in ``formats``. A cycle between packages is reported with the packages it
    joins."""
    graph = package_graph()
    assert {"jobs", "kinds", "models", "config", "formats", "export", "evaluation"} <= set(graph)
    assert _cycles(graph) == []


def test_the_package_scan_finds_a_cycle() -> None:
    """The scan must see a package cycle made of lazy imports (else the test above would pass on anything)."""
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert _cycles(graph) == [["a", "b", "c"]]
    tree = ast.parse("def f():\n    from deepspec_train.kinds.registry import kind_spec\n")
    modules = {"deepspec_train.kinds.registry": PACKAGE / "kinds" / "registry.py"}
    assert any(isinstance(node, ast.ImportFrom) for node in ast.walk(tree))
    assert _imports_of_tree(tree, modules) == {"deepspec_train.kinds.registry"}


_DRAWN_NAME = re.compile(r"([a-z_]+)(?:/|\.py)")


def drawn_rows(page: str) -> list[list[str]]:
    """The rows of the package map that ``page`` draws, top first: the packages (``name/``) and modules
    (``name.py``) each line of the drawing starts with. Indented lines continue the description of the row above."""
    drawing = page.split("## The package map", 1)[1].split("```", 2)[1]
    rows = []
    for line in drawing.splitlines():
        names = []
        for word in line.split() if line[:1].strip() else []:
            match = _DRAWN_NAME.fullmatch(word)
            if match is None:
                break
            names.append(match.group(1))
        if names:
            rows.append(names)
    return rows


def upward_imports(graph: dict[str, set[str]], rows: list[list[str]]) -> list[tuple[str, str]]:
    """(importer, imported) for every edge of ``graph`` whose imported package is drawn in a row above the
    importer's (a name missing from ``rows`` counts as drawn above everything, so it is reported too)."""
    row_of = {name: index for index, row in enumerate(rows) for name in row}
    return sorted(
        (source, target) for source, targets in graph.items() for target in targets
        if row_of.get(target, -1) < row_of.get(source, len(rows))
    )


def test_the_page_draws_every_package_and_module_once() -> None:
    rows = drawn_rows(ARCHITECTURE_PAGE.read_text())
    drawn = [name for row in rows for name in row]
    assert len(drawn) == len(set(drawn))
    assert set(drawn) == set(package_graph())


def test_imports_run_down_the_drawn_rows() -> None:
    """No package or module imports one drawn in a row above its own (the page's order is the code's)."""
    assert upward_imports(package_graph(), drawn_rows(ARCHITECTURE_PAGE.read_text())) == []


def test_the_layer_check_finds_an_upward_import() -> None:
    """A planted import of a training job (``jobs``) from the pure pieces (``models``), inside a function and under
    ``TYPE_CHECKING``, runs up the drawn rows; so does one into a package the page does not draw."""
    graph = {name: set(targets) for name, targets in package_graph().items()}
    rows = drawn_rows(ARCHITECTURE_PAGE.read_text())
    before = set(upward_imports(graph, rows))
    planted = "def build():\n    if TYPE_CHECKING:\n        from deepspec_train.jobs.run import run_training\n"
    graph["models"] |= {_package_of(dep) for dep in _imports_of_tree(ast.parse(planted), _modules())}
    graph["config"].add("undrawn")
    assert set(upward_imports(graph, rows)) - before == {("models", "jobs"), ("config", "undrawn")}
    assert drawn_rows("## The package map\n```\na/  b.py   the top row\n    c/ continued\nd/   below\n```\n") == [
        ["a", "b"], ["d"],
    ]


def _literals(node: ast.AST) -> list[object]:
    """The constants ``node`` is or holds (a tuple / list / set of constants)."""
    elements = node.elts if isinstance(node, (ast.Tuple, ast.List, ast.Set)) else [node]
    return [elt.value for elt in elements if isinstance(elt, ast.Constant)]


def _is_name_switch(node: ast.AST, names: set[str], words: tuple[str, ...]) -> bool:
    """Whether ``node`` compares something whose source holds one of ``words`` with one of ``names`` (alone or in a
    tuple / list / set), or indexes a mapping literal keyed by ``names`` with such an expression."""
    if isinstance(node, ast.Compare):
        operands = [node.left, *node.comparators]
        named = any(value in names for op in operands for value in _literals(op))
        return named and any(word in ast.unparse(op) for op in operands for word in words)
    if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Dict):
        keys = {k.value for k in node.value.keys if isinstance(k, ast.Constant)}
        return bool(keys & names) and any(word in ast.unparse(node.slice) for word in words)
    return False


def _kind_decisions(tree: ast.AST) -> list[int]:
    """Lines that compare a kind to a kind name, index a kind-keyed mapping by a kind, build a config with a
    literal kind, or test a drafter class."""
    lines = []
    for node in ast.walk(tree):
        if _is_name_switch(node, KIND_NAMES, ("kind",)):
            lines.append(node.lineno)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "isinstance":
            if any(name in ast.unparse(node.args[1]) for name in DRAFTER_CLASSES):
                lines.append(node.lineno)
        elif isinstance(node, ast.keyword) and node.arg == "kind" and isinstance(node.value, ast.Constant):
            if node.value.value in KIND_NAMES:
                lines.append(node.value.lineno)
    return sorted(lines)


def _offenders(scan: Callable[[ast.AST], list[int]], allowed: set[str]) -> dict[str, list[int]]:
    """Module (relative to the package) -> lines that ``scan`` flags, for every module outside ``allowed``."""
    offenders = {}
    for path in _modules().values():
        relative = str(path.relative_to(PACKAGE))
        lines = [] if relative in allowed else scan(ast.parse(path.read_text()))
        if lines:
            offenders[relative] = lines
    return offenders


def test_drafter_kind_decisions_go_through_the_registry() -> None:
    assert _offenders(_kind_decisions, KIND_PLACES) == {}
    # The places are the schema and the modules of the kind records themselves, nothing more.
    records = {kind.build.__module__.split(".", 1)[1].replace(".", "/") + ".py" for kind in KINDS.values()}
    assert KIND_PLACES == {"config/schema.py"} | records


def test_the_kind_check_finds_a_switch() -> None:
    """The scan above must catch the patterns it forbids (else it would pass on anything)."""
    source = (
        "if cfg.drafter.kind == 'eagle3':\n    pass\n"
        "x = isinstance(module, Eagle3Drafter)\n"
        "y = {'dspark': 1, 'eagle3': 2}[cfg.drafter.kind]\n"
        "z = DrafterConfig(kind='dflash')\n"
        "w = loaded.kind in ('dspark', 'dflash')\n"
    )
    assert _kind_decisions(ast.parse(source)) == [1, 3, 4, 5, 6]


def test_the_kind_check_knows_every_registered_kind() -> None:
    """The switch scan takes its names from the kind registry: a planted switch on the newest kind fails it."""
    assert "dflash2" in KIND_NAMES
    for name in KINDS:
        assert _kind_decisions(ast.parse(f"if cfg.drafter.kind == {name!r}:\n    pass\n")) == [1], name


def _wide_functions(tree: ast.AST) -> list[tuple[str, int]]:
    """(name, line) of every function, method or lambda taking more than ``MAX_PARAMETERS`` parameters: positional
    and keyword ones, ``*args`` and ``**kwargs`` one each, a leading ``self`` or ``cls`` not counted."""
    wide = []
    for node in ast.walk(tree):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            continue
        args = node.args
        names = [a.arg for a in (*args.posonlyargs, *args.args, *args.kwonlyargs)]
        count = len(names) + (args.vararg is not None) + (args.kwarg is not None)
        if names and names[0] in ("self", "cls"):
            count -= 1
        if count > MAX_PARAMETERS:
            wide.append((getattr(node, "name", "<lambda>"), node.lineno))
    return sorted(wide, key=lambda item: item[1])


def test_no_function_takes_more_than_eight_parameters() -> None:
    offenders = {}
    for path in sorted([*PACKAGE.rglob("*.py"), *BENCH.rglob("*.py")]):
        relative = str(path.relative_to(PACKAGE.parent))
        wide = _wide_functions(ast.parse(path.read_text()))
        if wide:
            offenders[relative] = wide
    assert offenders == {}


def test_the_parameter_count_finds_a_wide_function() -> None:
    """The scan above must catch a function over the limit (else it would pass on anything)."""
    source = (
        "def nine(a, b, c, d, e, f, g, h, i):\n    pass\n"
        "def eight(a, b, c, d, e, f, *rest, **options):\n    pass\n"
        "class C:\n"
        "    def method(self, a, b, c, d, e, f, g, h):\n        pass\n"
        "    def wide(self, a, b, c, d, e, f, g, *, h, i):\n        pass\n"
        "handler = lambda a, b, c, d, e, f, g, h, i: a\n"
    )
    assert _wide_functions(ast.parse(source)) == [("nine", 1), ("wide", 8), ("<lambda>", 10)]


def _layout_decisions(tree: ast.AST) -> list[int]:
    """Lines that compare a layout (or an architecture) to a layout name or architecture, or index a layout-keyed
    mapping by a layout."""
    return sorted(node.lineno for node in ast.walk(tree) if _is_name_switch(node, LAYOUT_NAMES, ("layout", "arch")))


def test_serving_layout_decisions_go_through_the_records() -> None:
    assert _offenders(_layout_decisions, LAYOUT_PLACES) == {}


def test_the_layout_check_finds_a_switch() -> None:
    """The scan above must catch the patterns it forbids (else it would pass on anything)."""
    source = (
        "if layout == 'eagle3':\n    pass\n"
        "x = plan.layout != 'dspark'\n"
        "y = spec.layout in ('dspark', 'zlab-dflash')\n"
        "z = {'dspark': 1, 'eagle3': 2}[layout]\n"
        "w = arch == 'DFlashDraftModel'\n"
        "v = labels == 'dspark'\n"
    )
    assert _layout_decisions(ast.parse(source)) == [1, 3, 4, 5, 6]


# The Markov head's forms: only their records may test for one (a form's name, or the schema's list of them).
MARKOV_FORM_PLACES = {"models/markov_forms.py"}
MARKOV_FORM_CONSTANTS = ("MARKOV_HEAD_TYPES", "VANILLA_MARKOV_HEAD")


def _markov_form_decisions(tree: ast.AST) -> list[int]:
    """Lines that compare a Markov head type to a form's name or to the schema's form constants, index a form-keyed
    mapping by one, or look one up in a form-keyed mapping literal (``{"gated": ...}.get(head_type)``)."""
    lines = []
    for node in ast.walk(tree):
        if _is_name_switch(node, set(MARKOV_FORMS), ("head_type", "markov", "form")):
            lines.append(node.lineno)
        elif isinstance(node, ast.Compare):
            operands = [ast.unparse(operand) for operand in (node.left, *node.comparators)]
            if any(name in operand for operand in operands for name in MARKOV_FORM_CONSTANTS):
                lines.append(node.lineno)
        elif isinstance(node, ast.Call) and isinstance(getattr(node.func, "value", None), ast.Dict):
            if set(_literals(ast.Tuple(elts=node.func.value.keys))) & set(MARKOV_FORMS):
                lines.append(node.lineno)
    return sorted(set(lines))


def test_markov_form_decisions_go_through_the_records() -> None:
    assert _offenders(_markov_form_decisions, MARKOV_FORM_PLACES) == {}


def test_the_markov_form_check_finds_a_switch() -> None:
    """The scan above must catch the switches the records replaced (else it would pass on anything); a label that
    happens to equal a form's name is no switch. Each planted line -> whether the scan must flag it."""
    planted = {
        "latent = embed if self.head_type == 'vanilla' else gated": True,
        "reads = module.markov_head.head_type != 'vanilla'": True,
        "needs_rank = head_type in MARKOV_HEAD_TYPES and head_type != VANILLA_MARKOV_HEAD": True,
        "projection = {'gated': ('gate_proj', r, r), 'rnn': ('joint_proj', 3 * r, 2 * r)}.get(head_type)": True,
        "sequential = cfg.markov_head_type in ('gated', 'rnn')": True,
        "title = labels == 'gated'": False,
    }
    flagged = _markov_form_decisions(ast.parse("\n".join(planted)))
    assert flagged == [line for line, expected in enumerate(planted.values(), start=1) if expected]


def test_the_schema_names_the_markov_forms() -> None:
    """``drafter.markov_head_type``'s values are the forms' records, and each form's engines are known engines."""
    assert tuple(MARKOV_FORMS) == MARKOV_HEAD_TYPES
    for form in MARKOV_FORMS.values():
        assert set(form.engines) <= set(ENGINES), form.name


def test_the_schema_names_the_registered_kinds() -> None:
    """The recipe schema's ``drafter.kind`` values are the kind registry's names (one list, checked both ways)."""
    assert set(get_args(DrafterKindName)) == set(KINDS)


def test_every_kind_exports_to_registered_layouts() -> None:
    """A kind's ``layouts`` name layout records, for every label convention."""
    for kind in KINDS.values():
        for labels in LABEL_CONVENTIONS:
            assert set(kind.layouts(labels)) <= set(LAYOUTS), (kind.name, labels)
