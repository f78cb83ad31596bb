"""Rows of one split of a benchmark dataset as a user has it on disk.

Accepted inputs: a JSONL, JSON (array or one object per line), Parquet or Arrow file, any of them gzipped
(``HumanEval.jsonl.gz`` is published that way); a directory written by ``datasets.save_to_disk`` (a dataset dict
gives the requested split); or any other directory holding such files: a ``datasets`` cache directory
(``openai___gsm8k/main/0.0.0/<hash>/gsm8k-test.arrow``), a hub snapshot (``main/test-00000-of-00001.parquet``)
or a folder of downloaded files. In a directory, the files whose name names the split (``test``, ``test2``,
``gsm8k-test``) are read; when no file names any split, all of them are. Parsing is ``data.conversations``'s
(one reader of data files for the whole project); a row that cannot be parsed fails with one line naming
``file:line``.
"""

from __future__ import annotations

import gzip
import re
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from deepspec_train.data.conversations import DATA_FILE_SUFFIXES, BadRow, DataSourceError, iter_records

GZIP_SUFFIX = ".gz"
KNOWN_SPLITS = ("train", "test", "validation", "dev")


def _data_suffix(path: Path) -> str:
    """The data suffix of ``path`` with a trailing ``.gz`` looked through (``.jsonl`` for ``x.jsonl.gz``)."""
    name = path.name.lower().removesuffix(GZIP_SUFFIX)
    return Path(name).suffix


def _is_data_file(path: Path) -> bool:
    return path.is_file() and _data_suffix(path) in DATA_FILE_SUFFIXES


def _names_split(path: Path, split: str) -> bool:
    # ``test``, ``test2`` (LiveCodeBench's later releases), ``gsm8k-test``, ``test-00000-of-00001``.
    return re.search(rf"(^|[-_.]){re.escape(split)}\d*($|[-_.])", path.name.lower()) is not None


def split_files(directory: Path, split: str) -> list[Path]:
    """The data files of ``directory`` (recursively) that hold ``split``; see the module docstring."""
    files = sorted(p for p in directory.rglob("*") if _is_data_file(p))
    if not files:
        raise DataSourceError(f"{directory} holds no data file ({', '.join(DATA_FILE_SUFFIXES)}, or gzipped)")
    chosen = [p for p in files if _names_split(p, split)]
    if chosen:
        return chosen
    if any(_names_split(p, other) for p in files for other in KNOWN_SPLITS):
        names = ", ".join(p.name for p in files)
        raise DataSourceError(f"{directory} holds no file of split {split!r} (files: {names})")
    return files


def _records_of_file(path: Path) -> Iterator[tuple[str, dict | BadRow]]:
    if path.name.lower().endswith(GZIP_SUFFIX):
        # The shared reader dispatches on the file suffix, so the decompressed copy keeps the inner name.
        with tempfile.TemporaryDirectory() as scratch:
            plain = Path(scratch) / path.name[: -len(GZIP_SUFFIX)]
            try:
                with gzip.open(path, "rb") as packed, open(plain, "wb") as out:
                    shutil.copyfileobj(packed, out)
            except (OSError, EOFError) as error:
                raise DataSourceError(f"data file {path}: not a readable gzip file ({error})") from None
            for where, record in iter_records(str(plain)):
                yield where.replace(str(plain), str(path), 1), record
        return
    yield from iter_records(str(path))


def iter_split_rows(source: str | Path, split: str) -> Iterator[tuple[str, dict[str, Any]]]:
    """``(where, row)`` for every row of ``split`` in ``source``; a bad row raises its ``BadRow``."""
    path = Path(source).expanduser()
    if not path.exists():
        raise DataSourceError(f"{path}: no such file or directory")
    is_saved_dataset = path.is_dir() and ((path / "state.json").is_file() or (path / "dataset_dict.json").is_file())
    if is_saved_dataset:
        records = iter_records(str(path), split)
    elif path.is_dir():
        records = (item for file in split_files(path, split) for item in _records_of_file(file))
    else:
        records = _records_of_file(path)
    for where, record in records:
        if isinstance(record, BadRow):
            raise record
        yield where, record
