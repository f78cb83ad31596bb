"""A target folder that passes every check made before a run loads it (``jobs.preflight``, ``model_folders``):
the tiny world's ``config.json``, a real chat tokenizer and a small safetensors file (headers are all that is
read), plus one chat row to train on, so ``--dry-run`` and the verbs' path checks can be tested in seconds
without building the tiny world. ``write_bad_weights`` puts bytes that are not safetensors where the weights go."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from safetensors.numpy import save_file

from tests.helpers.chat_tokenizer import build_chat_tokenizer
from tests.helpers.config_only_target import write_config_only_target

CHAT_ROW = {"messages": [{"role": "user", "content": "What is two plus three?"},
                         {"role": "assistant", "content": "Two plus three is five."}]}


def write_checkable_target(folder: Path) -> Path:
    write_config_only_target(folder)
    build_chat_tokenizer(folder)
    save_file({"model.embed_tokens.weight": np.zeros((4, 4), dtype=np.float32)}, str(folder / "model.safetensors"))
    return folder


def write_bad_weights(folder: Path) -> Path:
    """``folder``'s weights replaced by text: what ``safetensors`` reads as ``header too large``."""
    (folder / "model.safetensors").write_text("this is not a safetensors file, but its first 8 bytes say 'huge'\n")
    return folder


def write_chat_rows(path: Path, rows: int = 2) -> Path:
    path.write_text("".join(json.dumps(CHAT_ROW) + "\n" for _ in range(rows)))
    return path
