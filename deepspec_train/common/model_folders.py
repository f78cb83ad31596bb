"""Check a model folder named by the user (a target, a drafter) before anything loads it, so that a wrong path
ends in one line naming the setting, in seconds.

Without these checks transformers' ``from_pretrained`` takes a name that is not a local folder for a hub id and
retries the network for about a minute before a traceback, and a weights file that is not safetensors fails deep
inside loading (``SafetensorError: header too large``). Every entry point that takes a target or a drafter path
(``train.py``'s ``target.path`` and ``drafter.init_from``, the verbs' ``--target``, ``--drafter`` and ``--model``,
the data scripts' ``--tokenizer``) calls ``check_target_folder`` or ``check_drafter_folder`` first (training's
``jobs.preflight`` the ``*_problem`` functions behind them); a failed check raises ``UserError`` (exit status 2)
with ``<setting> <path>: <what is wrong>``.

A value is a local path when it exists, starts with ``.``, ``/`` or ``~``, or is not shaped like a hub id
(``org/name`` or ``name``): local paths are never looked up on the hub. A hub id is only accepted where the
command can fetch one (``allow_hub``), and then only from the local hub cache or when the hub answers within
``HUB_PROBE_SECONDS``; otherwise it is refused at once. The weights are checked by their headers alone (a few
kilobytes read, never the tensors, and without torch): a file that is not safetensors, a Git LFS pointer left
instead of the file, a file cut short, or a shard index naming a missing shard.
"""

from __future__ import annotations

import json
import os
import re
import threading
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Optional, TypeVar

from deepspec_train.common.errors import UserError

CONFIG_FILE = "config.json"
SHARD_INDEX = "model.safetensors.index.json"
TRAINED_DRAFTER_CONFIG = "drafter_config.json"
# What a training run leaves its drafter in (``formats.trained_drafter``): a run folder is read through it.
RUN_DRAFTER_FOLDER = "drafter"
# Pickled weights that published drafters may ship instead of safetensors (``formats.published_drafters``).
PICKLED_WEIGHTS = ("pytorch_model.bin",)
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")
# ``org/name`` or ``name`` as the hub spells model ids.
HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*(/[A-Za-z0-9][A-Za-z0-9_.-]*)?$")
HUB_PROBE_SECONDS = 3.0
OFFLINE_VARIABLES = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")
LFS_POINTER_PREFIX = b"version https://git-lfs"
Loaded = TypeVar("Loaded")


def is_hub_id(value: str) -> bool:
    """Whether ``value`` would be looked up on the hub: shaped like a model id and not a local path."""
    return bool(HUB_ID.match(value)) and not value.startswith((".", "~")) and not os.path.lexists(value)


def safetensors_problem(file: Path) -> Optional[str]:
    """Why ``file`` is not a readable safetensors file (None when its header and size are consistent)."""
    size = file.stat().st_size
    with open(file, "rb") as handle:
        if handle.read(len(LFS_POINTER_PREFIX)) == LFS_POINTER_PREFIX:
            return f"{file.name} is a Git LFS pointer, not the weights (fetch them: git lfs pull)"
        if size < 8:
            return f"{file.name} is not a safetensors file ({size} bytes)"
        handle.seek(0)
        length = int.from_bytes(handle.read(8), "little")
        if length > size - 8:
            return f"{file.name} is not a safetensors file (its header is unreadable)"
        try:
            header = json.loads(handle.read(length))
        except (UnicodeDecodeError, ValueError):
            return f"{file.name} is not a safetensors file (its header is not JSON)"
    if not isinstance(header, dict):
        return f"{file.name} is not a safetensors file (its header is not a table of tensors)"
    ends = [entry.get("data_offsets", [0, 0])[1] for name, entry in header.items()
            if name != "__metadata__" and isinstance(entry, dict)]
    if 8 + length + max(ends, default=0) > size:
        return f"{file.name} is cut short ({size} bytes, its header describes more): download it again"
    return None


def weights_problem(folder: Path, pickled_allowed: bool = False) -> Optional[str]:
    """Why the weights in ``folder`` would not load: none there, a shard missing, or a file unreadable."""
    index = folder / SHARD_INDEX
    if index.is_file():
        try:
            shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        except (ValueError, KeyError, TypeError, AttributeError):
            return f"{SHARD_INDEX} is not a shard index (no weight_map)"
        missing = [shard for shard in shards if not (folder / shard).is_file()]
        if missing:
            return f"{SHARD_INDEX} names {len(missing)} missing shard(s), first {missing[0]}"
        files = [folder / shard for shard in shards]
    else:
        files = sorted(folder.glob("*.safetensors"))
    if not files:
        if pickled_allowed and any((folder / name).is_file() for name in PICKLED_WEIGHTS):
            return None
        return f"no weights there (no *.safetensors file or {SHARD_INDEX})"
    return next((problem for problem in map(safetensors_problem, files) if problem), None)


def folder_problem(folder: Path) -> Optional[str]:
    if not folder.exists():
        return "no such folder"
    if not folder.is_dir():
        return "not a folder"
    return None


def model_folder_problem(path: str) -> Optional[str]:
    """Why ``path`` is not a model folder (config.json and readable safetensors); None if it is."""
    folder = Path(os.path.expanduser(path))
    problem = folder_problem(folder)
    if problem is not None:
        return problem
    config = folder / CONFIG_FILE
    if not config.is_file():
        return f"not a model folder: no {CONFIG_FILE} there"
    try:
        json.loads(config.read_text())
    except (UnicodeDecodeError, ValueError):
        return f"{CONFIG_FILE} is not valid JSON"
    return weights_problem(folder)


def tokenizer_problem(path: str) -> Optional[str]:
    """Why the tokenizer in the model folder ``path`` is missing (None when a tokenizer file is there)."""
    if any((Path(os.path.expanduser(path)) / name).is_file() for name in TOKENIZER_FILES):
        return None
    return f"no tokenizer there (none of {', '.join(TOKENIZER_FILES)})"


def hub_unreachable() -> Optional[str]:
    """Why the hub cannot be reached now (None when it answers): offline by setting, or no answer in seconds."""
    for variable in OFFLINE_VARIABLES:
        if os.environ.get(variable, "").strip().lower() not in ("", "0", "false", "no"):
            return f"{variable} is set"
    endpoint = os.environ.get("HF_ENDPOINT", "https://huggingface.co")
    outcome: list[Optional[str]] = []

    def probe() -> None:
        try:
            urllib.request.urlopen(urllib.request.Request(endpoint, method="HEAD"), timeout=HUB_PROBE_SECONDS).close()
            outcome.append(None)
        except urllib.error.HTTPError:  # an answer, even an error status, means the hub is there
            outcome.append(None)
        except (OSError, ValueError) as error:
            outcome.append(f"{endpoint} does not answer ({getattr(error, 'reason', error)})")

    # In a thread: the socket timeout does not bound the name lookup, which can hang far longer without a network.
    thread = threading.Thread(target=probe, daemon=True)
    thread.start()
    thread.join(HUB_PROBE_SECONDS)
    return outcome[0] if outcome else f"{endpoint} does not answer within {HUB_PROBE_SECONDS:g} s"


def _in_hub_cache(model_id: str) -> bool:
    from huggingface_hub import try_to_load_from_cache

    try:
        return isinstance(try_to_load_from_cache(model_id, CONFIG_FILE), str)
    except ValueError:  # an id the hub's own rules refuse (huggingface_hub's HFValidationError)
        return False


def _check_hub_id(value: str, setting: str, allow_hub: bool) -> None:
    if not allow_hub:
        hint = f" (a hub model: `hf download {value} --local-dir DIR` first, then name DIR)" if "/" in value else ""
        raise UserError(f"{setting} {value}: no such folder{hint}")
    if _in_hub_cache(value):
        return
    reason = hub_unreachable()
    if reason is not None:
        raise UserError(f"{setting} {value}: no such folder, and as a hub id it cannot be fetched: the hub is "
                        f"unreachable ({reason})")


def check_target_folder(path: str, setting: str, weights: bool = True, tokenizer: bool = False,
                        allow_hub: bool = False) -> str:
    """Refuse ``path`` given as ``setting`` unless it is a model folder (``model_folder_problem``; without
    ``weights``, any folder: a command that reads the tokenizer alone) holding a tokenizer too when ``tokenizer``
    is set, or, with ``allow_hub``, a hub id the hub can serve. Returns ``path``."""
    if is_hub_id(path):
        _check_hub_id(path, setting, allow_hub)
        return path
    problem = model_folder_problem(path) if weights else folder_problem(Path(os.path.expanduser(path)))
    if problem is None and tokenizer:
        problem = tokenizer_problem(path)
    if problem is not None:
        raise UserError(f"{setting} {path}: {problem}")
    return path


def drafter_folder_problem(path: str) -> Optional[str]:
    """Why ``path`` is not a drafter folder: an export (config.json + weights), a training output
    (``drafter_config.json`` + ``drafter.safetensors``) or a run folder holding one in ``drafter/``."""
    folder = Path(os.path.expanduser(path))
    if folder.is_dir() and not (folder / CONFIG_FILE).is_file() and (folder / RUN_DRAFTER_FOLDER).is_dir():
        folder = folder / RUN_DRAFTER_FOLDER
    problem = folder_problem(folder)
    if problem is not None:
        return problem
    if (folder / TRAINED_DRAFTER_CONFIG).is_file():
        return weights_problem(folder)
    if not (folder / CONFIG_FILE).is_file():
        return (f"not a drafter folder: no {CONFIG_FILE} (an export) or {TRAINED_DRAFTER_CONFIG} (a training "
                f"output) there")
    return weights_problem(folder, pickled_allowed=True)


def check_drafter_folder(path: str, setting: str) -> str:
    """Refuse ``path`` given as ``setting`` unless it is a drafter folder (``drafter_folder_problem``)."""
    problem = drafter_folder_problem(path)
    if problem is not None:
        raise UserError(f"{setting} {path}: {problem}")
    return path


def loaded_or_refused(load: Callable[[], Loaded], what: str) -> Loaded:
    """``load()``; when it raises what transformers raises for files it cannot read (``OSError``, ``ValueError``,
    ``TypeError``), a ``UserError`` ``<what> (<the first line of its message>)`` instead of a traceback."""
    try:
        return load()
    except (OSError, ValueError, TypeError) as error:
        reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise UserError(f"{what} ({reason})") from error
