"""The tiny world's corpus: chat conversations in three domains, built from what every Python install holds.

- ``code``: functions of the standard library's source, as "write this function" (answer: the source) and
  "explain this function" (answer: its docstring) conversations.
- ``prose``: sections of the ``pydoc_data`` language-reference topics and module docstrings, as questions
  about Python answered in prose.
- ``math``: procedurally generated arithmetic word problems with step-by-step worked solutions.

Every row is ``{"id", "category", "messages"}`` with OpenAI-form messages (one user turn, one assistant
turn). The corpus is a pure function of the seed and of the local Python installation.
"""

from __future__ import annotations

import ast
import random
import sysconfig
import textwrap
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from pydoc_data.topics import topics

from tqdm import tqdm

DOMAINS: tuple[str, ...] = ("code", "prose", "math")

# Test suites, vendored third-party code and demos are not representative library code.
_SKIPPED_DIRS = {"site-packages", "dist-packages", "test", "tests", "idle_test", "__pycache__", "turtledemo"}
_MIN_FUNCTION_LINES = 4
_MAX_FUNCTION_LINES = 40
_MIN_MODULE_DOC_CHARS = 200
_PROSE_CHUNK_CHARS = 1200


def conversation(conv_id: str, category: str, question: str, answer: str) -> dict:
    """One corpus row in the project's OpenAI conversation form."""
    return {
        "id": conv_id,
        "category": category,
        "messages": [{"role": "user", "content": question}, {"role": "assistant", "content": answer}],
    }


def stdlib_dir() -> Path:
    """Directory of the running interpreter's pure-Python standard library."""
    return Path(sysconfig.get_paths()["stdlib"])


def stdlib_files(root: Path) -> list[Path]:
    """Library source files under ``root`` in a fixed (sorted) order, tests and vendored packages excluded."""
    return [p for p in sorted(root.rglob("*.py")) if not _SKIPPED_DIRS & set(p.relative_to(root).parts)]


def module_name(root: Path, path: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


@dataclass(frozen=True)
class StdlibFunction:
    module: str
    name: str
    signature: str
    source: str
    docstring: str


@dataclass(frozen=True)
class ModuleDoc:
    module: str
    docstring: str


def _function_source(lines: list[str], node: ast.FunctionDef) -> str:
    # Methods are indented inside their class; dedent so every answer is a self-contained top-level def.
    return textwrap.dedent("\n".join(lines[node.lineno - 1 : node.end_lineno])).strip("\n")


def parse_module(root: Path, path: Path) -> tuple[list[StdlibFunction], ModuleDoc | None]:
    """Documented functions and methods of one source file, and its module docstring if it is substantial."""
    try:
        text = path.read_text(encoding="utf-8")
        tree = ast.parse(text)
    except (SyntaxError, UnicodeDecodeError, ValueError):
        return [], None
    module = module_name(root, path)
    lines = text.splitlines()
    functions = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.FunctionDef) or node.name.startswith("__"):
            continue
        doc = ast.get_docstring(node)
        n_lines = node.end_lineno - node.lineno + 1
        if not doc or not _MIN_FUNCTION_LINES <= n_lines <= _MAX_FUNCTION_LINES:
            continue
        signature = f"{node.name}({ast.unparse(node.args)})"
        functions.append(StdlibFunction(module, node.name, signature, _function_source(lines, node), doc))
    doc = ast.get_docstring(tree)
    module_doc = ModuleDoc(module, doc) if doc and len(doc) >= _MIN_MODULE_DOC_CHARS else None
    return functions, module_doc


def scan_stdlib(
    root: Path, rng: random.Random, min_functions: int, min_module_docs: int, progress: bool = True
) -> tuple[list[StdlibFunction], list[ModuleDoc]]:
    """Parse stdlib files in a seeded random order until enough functions and module docstrings are found.

    Stopping early keeps small presets fast; the shuffled order keeps a small sample spread over the library.
    """
    files = stdlib_files(root)
    rng.shuffle(files)
    functions: list[StdlibFunction] = []
    module_docs: list[ModuleDoc] = []
    for path in tqdm(files, desc="tinyworld: scan stdlib", unit="file", disable=not progress):
        found, module_doc = parse_module(root, path)
        functions.extend(found)
        if module_doc is not None:
            module_docs.append(module_doc)
        if len(functions) >= min_functions and len(module_docs) >= min_module_docs:
            break
    return functions, module_docs


def _summary(docstring: str) -> str:
    first_paragraph = docstring.strip().split("\n\n")[0]
    return " ".join(first_paragraph.split())


_WRITE_PROMPTS = (
    "Write a Python function `{signature}` for the `{module}` module. {summary}",
    "Implement `{signature}` in Python, as the standard library's `{module}` does. Docstring: {summary}",
    "In the `{module}` module, how would you write `{name}`? It should do this: {summary}",
)
_EXPLAIN_PROMPTS = (
    "Explain what this function from the `{module}` module does:\n\n```python\n{source}\n```",
    "What does `{name}` in `{module}` do?\n\n```python\n{source}\n```",
)


def code_conversations(functions: list[StdlibFunction], count: int, rng: random.Random) -> list[dict]:
    """Up to ``count`` write/explain conversations about distinct stdlib functions."""
    chosen = rng.sample(functions, min(count, len(functions)))
    rows = []
    for i, fn in enumerate(chosen):
        fields = {"module": fn.module, "name": fn.name, "signature": fn.signature, "summary": _summary(fn.docstring)}
        if rng.random() < 0.5:
            question = rng.choice(_WRITE_PROMPTS).format(**fields)
            answer = f"```python\n{fn.source}\n```"
        else:
            question = rng.choice(_EXPLAIN_PROMPTS).format(source=fn.source, **fields)
            answer = fn.docstring.strip()
        rows.append(conversation(f"code-{i:05d}", "code", question, answer))
    return rows


def _is_underline(line: str) -> bool:
    stripped = line.strip()
    return len(stripped) >= 3 and len(set(stripped)) == 1 and stripped[0] in "*=-~^"


def topic_sections(text: str) -> Iterator[tuple[str, str]]:
    """Split one pydoc topic into (heading, body) sections at its reST-style underlined headings."""
    lines = text.splitlines()
    heading, body = "", []
    i = 0
    while i < len(lines):
        if i + 1 < len(lines) and lines[i].strip() and _is_underline(lines[i + 1]):
            if "".join(body).strip():
                yield heading, "\n".join(body).strip()
            heading, body = lines[i].strip(), []
            i += 2
            continue
        body.append(lines[i])
        i += 1
    if "".join(body).strip():
        yield heading, "\n".join(body).strip()


def chunk_paragraphs(text: str, max_chars: int) -> list[str]:
    """Greedily group blank-line separated paragraphs into chunks of at most ``max_chars`` (a longer single
    paragraph stays whole rather than being cut mid-sentence)."""
    chunks: list[str] = []
    current = ""
    for paragraph in text.split("\n\n"):
        if current and len(current) + 2 + len(paragraph) > max_chars:
            chunks.append(current)
            current = paragraph
        else:
            current = f"{current}\n\n{paragraph}" if current else paragraph
    if current.strip():
        chunks.append(current)
    return chunks


_TOPIC_PROMPTS = (
    "Explain {heading} in Python.",
    "What does the Python language reference say about {heading}?",
    "Tell me about {heading} in Python.",
)
_TOPIC_PART_PROMPTS = (
    "Continue explaining {heading} in Python (part {part}).",
    "What else should I know about {heading} in Python? (part {part})",
)
_MODULE_PROMPTS = (
    "What is the Python `{module}` module for?",
    "Describe the standard library module `{module}`.",
)


def prose_texts(module_docs: list[ModuleDoc], rng: random.Random) -> list[tuple[str, str]]:
    """Every (question, answer) pair available from pydoc topics and module docstrings, in a fixed order."""
    pairs = []
    for key in sorted(topics):
        for heading, body in topic_sections(topics[key]):
            heading = heading or key.replace("-", " ")
            for part, chunk in enumerate(chunk_paragraphs(body, _PROSE_CHUNK_CHARS), start=1):
                template = rng.choice(_TOPIC_PROMPTS) if part == 1 else rng.choice(_TOPIC_PART_PROMPTS)
                pairs.append((template.format(heading=heading, part=part), chunk))
    for doc in sorted(module_docs, key=lambda d: d.module):
        answer = chunk_paragraphs(doc.docstring.strip(), _PROSE_CHUNK_CHARS)[0]
        pairs.append((rng.choice(_MODULE_PROMPTS).format(module=doc.module), answer))
    return pairs


def prose_conversations(module_docs: list[ModuleDoc], count: int, rng: random.Random) -> list[dict]:
    """Up to ``count`` prose Q&A conversations."""
    pairs = prose_texts(module_docs, rng)
    chosen = rng.sample(pairs, min(count, len(pairs)))
    return [conversation(f"prose-{i:05d}", "prose", q, a) for i, (q, a) in enumerate(chosen)]


_NAMES = ("Ava", "Ben", "Chloe", "Dan", "Emma", "Finn", "Grace", "Hugo", "Iris", "Jack", "Lena", "Omar", "Priya",
          "Sam", "Tara", "Yusuf")
_ITEMS = ("apples", "pencils", "notebooks", "stickers", "oranges", "marbles", "books", "cups", "candles", "tickets")
_BAKED = ("cookies", "muffins", "rolls", "cupcakes", "pretzels")


def _shopping(rng: random.Random) -> tuple[str, str]:
    name = rng.choice(_NAMES)
    item1, item2 = rng.sample(_ITEMS, 2)
    a, p, b, q = rng.randint(2, 15), rng.randint(2, 30), rng.randint(2, 15), rng.randint(2, 30)
    x, y = a * p, b * q
    total = x + y
    bill = (total // 50 + 1) * 50
    question = (f"{name} buys {a} {item1} at ${p} each and {b} {item2} at ${q} each, and pays with ${bill}. "
                f"How much change does {name} get?")
    answer = (f"Step 1: The {item1} cost {a} * {p} = {x} dollars.\n"
              f"Step 2: The {item2} cost {b} * {q} = {y} dollars.\n"
              f"Step 3: In total {name} spends {x} + {y} = {total} dollars.\n"
              f"Step 4: The change is {bill} - {total} = {bill - total} dollars.\n"
              f"The answer is {bill - total}.")
    return question, answer


def _sharing(rng: random.Random) -> tuple[str, str]:
    name = rng.choice(_NAMES)
    item = rng.choice(_ITEMS)
    boxes, per_box, friends = rng.randint(2, 12), rng.randint(5, 40), rng.randint(2, 9)
    total = boxes * per_box
    each, left = divmod(total, friends)
    question = (f"{name} has {boxes} boxes with {per_box} {item} in each box and shares them equally among "
                f"{friends} friends. How many {item} does each friend get, and how many are left over?")
    answer = (f"Step 1: {name} has {boxes} * {per_box} = {total} {item}.\n"
              f"Step 2: {total} / {friends} = {each} with remainder {left}, "
              f"because {friends} * {each} = {friends * each} and {total} - {friends * each} = {left}.\n"
              f"The answer is {each} each, with {left} left over.")
    return question, answer


def _travel(rng: random.Random) -> tuple[str, str]:
    s1, h1, s2, h2 = rng.randint(20, 120), rng.randint(1, 6), rng.randint(20, 120), rng.randint(1, 6)
    d1, d2 = s1 * h1, s2 * h2
    question = (f"A train travels at {s1} km per hour for {h1} hours, then at {s2} km per hour for {h2} hours. "
                f"How far does it travel in total?")
    answer = (f"Step 1: In the first part it travels {s1} * {h1} = {d1} km.\n"
              f"Step 2: In the second part it travels {s2} * {h2} = {d2} km.\n"
              f"Step 3: The total distance is {d1} + {d2} = {d1 + d2} km.\n"
              f"The answer is {d1 + d2}.")
    return question, answer


def _savings(rng: random.Random) -> tuple[str, str]:
    name = rng.choice(_NAMES)
    start, weekly, weeks = rng.randint(0, 100), rng.randint(5, 60), rng.randint(2, 12)
    saved = weekly * weeks
    total = start + saved
    spent = rng.randint(1, total)
    question = (f"{name} has ${start} and saves ${weekly} every week for {weeks} weeks. Then {name} spends "
                f"${spent} on a present. How much money does {name} have left?")
    answer = (f"Step 1: {name} saves {weekly} * {weeks} = {saved} dollars.\n"
              f"Step 2: With the starting money {name} has {start} + {saved} = {total} dollars.\n"
              f"Step 3: After the present {name} has {total} - {spent} = {total - spent} dollars.\n"
              f"The answer is {total - spent}.")
    return question, answer


def _bakery(rng: random.Random) -> tuple[str, str]:
    baked = rng.choice(_BAKED)
    trays, per_tray = rng.randint(2, 20), rng.randint(6, 36)
    made = trays * per_tray
    sold_morning = rng.randint(0, made // 2)
    sold_afternoon = rng.randint(0, made - sold_morning)
    sold = sold_morning + sold_afternoon
    question = (f"A bakery bakes {trays} trays of {per_tray} {baked}. It sells {sold_morning} {baked} in the "
                f"morning and {sold_afternoon} in the afternoon. How many {baked} are left?")
    answer = (f"Step 1: The bakery bakes {trays} * {per_tray} = {made} {baked}.\n"
              f"Step 2: It sells {sold_morning} + {sold_afternoon} = {sold} {baked}.\n"
              f"Step 3: There are {made} - {sold} = {made - sold} {baked} left.\n"
              f"The answer is {made - sold}.")
    return question, answer


MATH_TEMPLATES: tuple[Callable[[random.Random], tuple[str, str]], ...] = (
    _shopping, _sharing, _travel, _savings, _bakery,
)


def math_conversations(count: int, rng: random.Random) -> list[dict]:
    """``count`` word problems drawn evenly from the templates, each with a worked solution."""
    rows = []
    for i in range(count):
        question, answer = MATH_TEMPLATES[i % len(MATH_TEMPLATES)](rng)
        rows.append(conversation(f"math-{i:05d}", "math", question, answer))
    return rows


def build_corpus(
    num_code: int, num_prose: int, num_math: int, seed: int, root: Path | None = None, progress: bool = True
) -> dict[str, list[dict]]:
    """Conversations of every domain, keyed by domain. Deterministic for a seed and a Python installation."""
    root = root or stdlib_dir()
    # One generator per domain, so changing one domain's size leaves the others' rows unchanged.
    code_rng, prose_rng, math_rng = (random.Random(f"{seed}-{domain}") for domain in DOMAINS)
    # Module docstrings pad the prose domain when it asks for more than the pydoc topics provide.
    functions, module_docs = scan_stdlib(root, code_rng, 2 * num_code, num_prose // 4, progress=progress)
    return {
        "code": code_conversations(functions, num_code, code_rng),
        "prose": prose_conversations(module_docs, num_prose, prose_rng),
        "math": math_conversations(num_math, math_rng),
    }


def split_heldout(rows: list[dict], heldout: int, seed: int) -> tuple[list[dict], list[dict]]:
    """(train, held-out) split of one domain's rows, drawn with the seed."""
    order = list(range(len(rows)))
    random.Random(f"{seed}-split").shuffle(order)
    held = sorted(order[:heldout])
    held_set = set(held)
    return [r for i, r in enumerate(rows) if i not in held_set], [rows[i] for i in held]
