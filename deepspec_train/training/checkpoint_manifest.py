"""Checkpoint manifests: the size and SHA-256 of every file of a checkpoint, and the check that reads them back.

``write_manifest`` runs on the main rank once every rank's files are in the temporary checkpoint directory, so
``manifest.json`` is renamed into place with the files it describes. ``checkpoint_problem`` answers whether a
checkpoint directory can be resumed from: ``None`` when every file the manifest lists has its size and checksum
and the files a resume reads (``REQUIRED_FILES`` and one ``rng_rank{r}.pt`` per rank that wrote it) are listed;
otherwise one line naming the file and what is wrong with it (missing, truncated, different bytes).

Checkpoints written before manifests existed have none (``has_manifest`` is false). They are accepted when the
files a resume reads are present, and the caller warns that their content was not checked; a corrupt file in
one then fails when it is loaded, with one line naming it.

Cost: verifying reads every file once (about 0.6 s per GB on one core with SHA extensions; writing the
manifest is the same read right after the files were written, usually from the page cache); see
``bench/integrity_cost.py``.
"""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Optional

from deepspec_train.common.checksums import ALGORITHM, file_checksum

MANIFEST_FILE = "manifest.json"
MANIFEST_FORMAT = 1
STATE_FILE = "trainer_state.json"
REQUIRED_FILES = ("drafter.safetensors", "optimizer.pt", STATE_FILE)
_HASH_THREADS = 8


def write_manifest(directory: Path) -> Path:
    """Describe every file of ``directory`` (except the manifest itself) in ``directory/manifest.json``."""
    paths = [p for p in sorted(directory.iterdir()) if p.is_file() and p.name != MANIFEST_FILE]
    files = {
        path.name: {"bytes": path.stat().st_size, ALGORITHM: checksum}
        for path, checksum in zip(paths, checksums(paths))
    }
    manifest = directory / MANIFEST_FILE
    manifest.write_text(json.dumps({"format": MANIFEST_FORMAT, "files": files}, indent=1))
    return manifest


def has_manifest(directory: Path) -> bool:
    return (directory / MANIFEST_FILE).is_file()


def checkpoint_problem(directory: Path) -> Optional[str]:
    """``None`` if ``directory`` is a complete checkpoint, else one line saying which file is wrong and how."""
    manifest_path = directory / MANIFEST_FILE
    if not manifest_path.is_file():
        missing = [name for name in REQUIRED_FILES if not (directory / name).is_file()]
        if missing:
            return f"{directory / missing[0]} is missing (and there is no {MANIFEST_FILE})"
        return _rng_files_problem(directory, {path.name for path in directory.iterdir()})
    try:
        manifest = json.loads(manifest_path.read_text())
        files = manifest["files"]
        expected = {name: (int(entry["bytes"]), str(entry[ALGORITHM])) for name, entry in files.items()}
    except (ValueError, KeyError, TypeError, AttributeError) as error:
        return f"{manifest_path} is unreadable ({type(error).__name__}: {error})"
    for name in REQUIRED_FILES:
        if name not in expected:
            return f"{manifest_path} does not list {name}"
    for name, (size, _) in expected.items():
        path = directory / name
        if not path.is_file():
            return f"{path} is missing"
        actual = path.stat().st_size
        if actual != size:
            return f"{path} has {actual} bytes, its manifest says {size} (truncated or rewritten)"
    names = sorted(expected)
    for name, checksum in zip(names, checksums([directory / name for name in names])):
        if checksum != expected[name][1]:
            return f"{directory / name} does not match its {ALGORITHM} checksum (corrupted)"
    return _rng_files_problem(directory, set(expected))


def checksums(paths: list[Path]) -> list[str]:
    """``file_checksum`` of each path, files hashed in parallel threads (hashlib releases the GIL), so the
    weights and the twice-as-large optimizer state take the time of the largest file, not of all of them."""
    with ThreadPoolExecutor(max_workers=max(1, min(len(paths), _HASH_THREADS))) as pool:
        return list(pool.map(file_checksum, paths))


def _rng_files_problem(directory: Path, names: set[str]) -> Optional[str]:
    """Every rank that wrote the checkpoint left its RNG state; the trainer state says how many there were."""
    try:
        world_size = int(json.loads((directory / STATE_FILE).read_text())["world_size"])
    except (ValueError, KeyError, TypeError) as error:
        return f"{directory / STATE_FILE} is unreadable ({type(error).__name__}: {error})"
    for rank in range(world_size):
        if f"rng_rank{rank}.pt" not in names:
            return f"{directory / f'rng_rank{rank}.pt'} is missing ({world_size} ranks wrote this checkpoint)"
    return None
