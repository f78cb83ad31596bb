"""Tokenise data sources once into Arrow shards, cached by (data, row shapes, tokenizer, template, length, reasoning).

``build_token_dataset`` opens every source and decides its row shape (``shape_detection``: ``data.format``,
``data.fields``), reads each row as that shape (``row_shapes``), tokenises it with its loss mask
(``supervision``: a conversation rendered with the chat template, plain text, or pre-rendered chat text) and
writes the samples as Arrow stream files under ``cache_dir/<key>/``, with the run's ``DataSummary`` (per source
too, ``data_summary``) beside them. Chat-shaped rows for a tokenizer without a chat template stop the build with
one line (``chat_templates``). The key hashes each source's identity (path, size and SHA-256 of the content of
every file), how rows are read (format and renamed fields), the tokenizer's full serialisation (vocabulary,
merges, specials), the chat template and its keyword arguments, ``max_length`` and whether reasoning is supervised, so
a re-run with the same inputs memory-maps the shards without tokenising, and any change builds a new entry, also
one that keeps the file's size and modification time. Hashing reads every input file once per run and process
(``checksums``: about 0.6 s per GB on one core with SHA extensions, ``bench/integrity_cost.py``), small next to
tokenising it. The entry is written to a temporary directory and renamed into place, so an interrupted build never leaves a half-written cache, and concurrent
builders (several ranks) agree on one result.

Rendering is pure Python (the chat template runs once per prefix), so large builds can use ``num_workers``
processes; shards are written by the parent in source order either way.

Bad rows are counted by reason and skipped; with ``strict=True`` the first one raises ``BadRow`` naming its
file and line (also when the entry comes from a cache built non-strictly, whose summary remembers it). A source
that is missing, empty or not a data file raises ``DataSourceError`` naming it (both are one-line ``UserError``s).
"""

from __future__ import annotations

import glob
import hashlib
import json
import multiprocessing
import os
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import datasets
import pyarrow as pa
from tqdm.auto import tqdm

from deepspec_train.common.checksums import ALGORITHM, file_checksum
from deepspec_train.common.disk_space import folder_bytes, whole_or_nothing
from deepspec_train.data.chat_templates import require_chat_template
from deepspec_train.data.conversations import BadRow
from deepspec_train.data.data_summary import DataSummary, SourceSummary
from deepspec_train.data.loss_mask import TemplateNotPrefixStableError
from deepspec_train.data.row_shapes import SHAPES, RowShape, read_row
from deepspec_train.data.shape_detection import AUTO, ShapedSource, open_source

# Bump when the shard layout, the rendering rules or the key change, so old cache entries are not reused.
# 3: reasoning normalised into a field (``conversations.REASONING_FIELD``) and ``supervise_reasoning`` in the key.
# 4: row shapes (``data.format``, ``data.fields``) in the key, and a summary per source (shards unchanged).
CACHE_FORMAT_VERSION = 4
SUMMARY_FILE = "summary.json"
SHARD_ROWS = 8192
# Rows sent to a worker process at a time: large enough to amortise pickling, small enough to balance load.
WORKER_CHUNK_ROWS = 64

SHARD_SCHEMA = pa.schema(
    [
        ("input_ids", pa.list_(pa.int32())),
        ("loss_mask", pa.list_(pa.int8())),
        ("sample_id", pa.int64()),
        ("length", pa.int32()),
    ]
)


def build_token_dataset(
    sources: list[str],
    renderer: ConversationRenderer,
    cache_dir: str,
    strict: bool = False,
    split: str = "train",
    progress: bool = True,
    num_workers: int = 0,
) -> tuple[datasets.Dataset, DataSummary]:
    """Tokenised samples with columns ``input_ids``, ``loss_mask``, ``sample_id``, ``length``, and a summary.

    ``sample_id`` is the sample's 0-based index in the returned dataset (stable across cache reuse).
    ``renderer`` holds the tokenizer, ``max_length``, the chat template's keyword arguments (e.g.
    ``{"enable_thinking": False}``), whether reasoning is supervised and how rows are read (``data.format``,
    ``data.fields``). ``num_workers > 0`` renders in that many spawned processes; the result is identical to a
    serial build.
    """
    if not sources:
        raise ValueError("build_token_dataset: no data sources given")
    key = cache_key(
        sources, renderer.tokenizer, renderer.max_length, split, renderer.chat_template_kwargs,
        renderer.supervise_reasoning, renderer.row_reading(),
    )
    entry = Path(os.path.expanduser(cache_dir)) / key
    from_cache = (entry / SUMMARY_FILE).is_file()
    if not from_cache:
        _build_entry(entry, sources, split, renderer, strict, progress, num_workers)
    summary = DataSummary(**json.loads((entry / SUMMARY_FILE).read_text()))
    summary.cache_path = str(entry)
    summary.from_cache = from_cache
    if strict and summary.first_bad is not None:
        raise BadRow(**summary.first_bad)
    return _load_shards(entry), summary


def cache_key(
    sources: list[str], tokenizer: Any, max_length: int, split: str, chat_template_kwargs: dict | None,
    supervise_reasoning: bool = True, row_reading: dict | None = None,
) -> str:
    """A hex digest naming the cache entry for these inputs (``row_reading``: ``ConversationRenderer.row_reading``,
    the default reading when None)."""
    identity = {
        "version": CACHE_FORMAT_VERSION,
        "sources": [_source_identity(source, split) for source in sources],
        "rows": row_reading or {"format": AUTO, "fields": {}},
        "tokenizer": _tokenizer_identity(tokenizer),
        "chat_template": tokenizer.chat_template,
        "chat_template_kwargs": chat_template_kwargs or {},
        "max_length": max_length,
        "supervise_reasoning": supervise_reasoning,
    }
    return hashlib.sha256(json.dumps(identity, sort_keys=True, default=str).encode()).hexdigest()[:24]


def _source_identity(source: str, split: str) -> dict:
    path = Path(os.path.expanduser(source))
    if path.is_file():
        files = [path]
    elif path.is_dir():
        files = sorted(p for p in path.rglob("*") if p.is_file())
    else:
        files = [Path(match) for match in sorted(glob.glob(os.path.expanduser(source), recursive=True))]
    # The content hash, not the modification time: a file rewritten with the same size and its mtime restored
    # (rsync -t, a copy that preserves times, a tool that resets them) must still get a new entry.
    stats = [(str(file.resolve()), file.stat().st_size, f"{ALGORITHM}:{file_checksum(file)}") for file in files]
    # A hub name has no local files; its name and split are all that identify it here.
    return {"source": source, "split": split, "files": stats}


def _tokenizer_identity(tokenizer: Any) -> str:
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:
        # The full serialisation covers vocabulary, merges, normaliser, pre-tokeniser and added tokens.
        text = backend.to_str()
    else:
        text = json.dumps(sorted(tokenizer.get_vocab().items()))
    text += json.dumps(sorted(str(token) for token in tokenizer.all_special_tokens))
    return hashlib.sha256(text.encode()).hexdigest()


# One tokenised row: its input ids and its 0/1 loss mask.
Sample = tuple[list[int], list[int]]


@dataclass
class ConversationRenderer:
    """How rows become samples: the tokenizer, the longest sample, the chat template's keyword arguments,
    whether reasoning segments are supervised (``loss_mask``), the row format (``data.format``) and the renamed
    fields (``data.fields`` as ``{canonical: row field}``). Turns one ``(source index, shape name, where,
    record)`` into ``(source index, (input_ids, loss_mask) or a located BadRow)``; picklable (sent to the
    rendering processes)."""

    tokenizer: Any
    max_length: int
    chat_template_kwargs: dict | None
    supervise_reasoning: bool = True
    row_format: str = AUTO
    fields: dict[str, str] = field(default_factory=dict)

    def row_reading(self) -> dict:
        """How rows are read, as the cache key holds it."""
        return {"format": self.row_format, "fields": dict(sorted(self.fields.items()))}

    def open(self, source: str, split: str) -> ShapedSource:
        """``source`` with its row shape decided; ``ChatTemplateMissingError`` when that shape renders with a
        chat template and the tokenizer has none."""
        shaped = open_source(source, split, self.row_format, self.fields)
        if shaped.shape is not None and shaped.shape.supervision.needs_chat_template:
            require_chat_template(self.tokenizer, f"data source {source!r} ({shaped.shape.name} rows)")
        return shaped

    def __call__(self, item: tuple[int, str | None, str, dict | BadRow]) -> tuple[int, Sample | BadRow]:
        index, shape_name, where, record = item
        return index, self.render(SHAPES[shape_name] if shape_name else None, where, record)

    def render(self, shape: RowShape | None, where: str, record: dict | BadRow) -> Sample | BadRow:
        """One row read as ``shape`` (None when its source has none): its sample or a located ``BadRow``."""
        try:
            if isinstance(record, BadRow):
                return record
            content = read_row(shape, record, self.fields, where)
            return shape.supervision.tokenise(self, content)
        except TemplateNotPrefixStableError as error:
            return BadRow("template_mismatch", where, str(error).split(" (")[0])
        except BadRow as error:
            return error if error.where else error.at(where)


def _build_entry(
    entry: Path, sources: list[str], split: str, renderer: ConversationRenderer, strict: bool, progress: bool,
    num_workers: int,
) -> None:
    entry.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{entry.name}.tmp-", dir=entry.parent))
    try:
        # A full disk: the staging folder goes, and the run ends in one line naming the entry (``disk_space``).
        with whole_or_nothing(entry, lambda: folder_bytes(staging), lambda: shutil.rmtree(staging, ignore_errors=True)):
            # Every source is opened (its first rows read, its shape decided) before any is tokenised, so a source
            # that cannot be read stops the build at once, in this process.
            opened = [renderer.open(source, split) for source in sources]
            records = (
                (index, shaped.shape.name if shaped.shape else None, where, record)
                for index, shaped in enumerate(opened)
                for where, record in shaped.rows
            )
            if num_workers > 0:
                # Spawned rather than forked: the parent may already run tokenizer or torch threads.
                with multiprocessing.get_context("spawn").Pool(num_workers) as pool:
                    results = pool.imap(renderer, records, chunksize=WORKER_CHUNK_ROWS)
                    summary = _write_shards(staging, opened, results, strict, progress)
            else:
                summary = _write_shards(staging, opened, map(renderer, records), strict, progress)
            (staging / SUMMARY_FILE).write_text(json.dumps(asdict(summary), indent=1))
        try:
            os.rename(staging, entry)
        except OSError:
            # Another process finished the same entry first; its content is identical, keep it.
            if not (entry / SUMMARY_FILE).is_file():
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _write_shards(
    directory: Path, opened: list[ShapedSource], results: Iterator[tuple[int, Sample | BadRow]], strict: bool,
    progress: bool,
) -> DataSummary:
    per_source = [SourceSummary(s.source, s.shape.name if s.shape else None, s.detected) for s in opened]
    writer = _ShardWriter(directory)
    kept = 0
    for index, result in tqdm(results, desc="tokenising rows", unit=" rows", disable=not progress):
        source = per_source[index]
        source.read += 1
        if isinstance(result, BadRow):
            if strict:
                raise result
            source.skipped[result.reason] = source.skipped.get(result.reason, 0) + 1
            if source.first_bad is None:
                source.first_bad = {"reason": result.reason, "where": result.where, "detail": result.detail}
            continue
        input_ids, loss_mask = result
        writer.add(input_ids, loss_mask, kept)
        kept += 1
        source.kept += 1
        source.total_tokens += len(input_ids)
        source.supervised_tokens += sum(loss_mask)
    writer.close()
    return _split_summary(per_source)


def _split_summary(per_source: list[SourceSummary]) -> DataSummary:
    """The split's totals over its sources (``first_bad``: the first source's first skipped row)."""
    skipped: dict[str, int] = {}
    for source in per_source:
        for reason, count in source.skipped.items():
            skipped[reason] = skipped.get(reason, 0) + count
    return DataSummary(
        kept=sum(s.kept for s in per_source),
        skipped=skipped,
        supervised_tokens=sum(s.supervised_tokens for s in per_source),
        total_tokens=sum(s.total_tokens for s in per_source),
        first_bad=next((s.first_bad for s in per_source if s.first_bad is not None), None),
        sources=per_source,
    )


class _ShardWriter:
    """Buffers samples and writes them as numbered Arrow stream files of at most ``SHARD_ROWS`` rows."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.rows: dict[str, list] = {name: [] for name in SHARD_SCHEMA.names}
        self.shard_count = 0

    def add(self, input_ids: list[int], loss_mask: list[int], sample_id: int) -> None:
        self.rows["input_ids"].append(input_ids)
        self.rows["loss_mask"].append(loss_mask)
        self.rows["sample_id"].append(sample_id)
        self.rows["length"].append(len(input_ids))
        if len(self.rows["sample_id"]) >= SHARD_ROWS:
            self._flush()

    def close(self) -> None:
        # An empty build still writes one (empty) shard so that loading yields a dataset with the schema.
        if self.rows["sample_id"] or self.shard_count == 0:
            self._flush()

    def _flush(self) -> None:
        table = pa.Table.from_pydict(self.rows, schema=SHARD_SCHEMA)
        path = self.directory / f"shard-{self.shard_count:05d}.arrow"
        with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_stream(sink, SHARD_SCHEMA) as writer:
            writer.write_table(table)
        self.shard_count += 1
        self.rows = {name: [] for name in SHARD_SCHEMA.names}


def _load_shards(entry: Path) -> datasets.Dataset:
    shards = sorted(entry.glob("shard-*.arrow"))
    return datasets.concatenate_datasets([datasets.Dataset.from_file(str(shard)) for shard in shards])
