"""Read chat conversations from files or ``datasets`` and normalise them to one message form.

Sources: JSONL (``.jsonl``; ``.json`` holding one object per line or a single JSON array), Parquet, Arrow
(IPC file or stream), a directory written by ``datasets.save_to_disk``, a directory of such data files, a glob
pattern, or anything ``datasets.load_dataset`` accepts (a hub name only works where the hub is reachable).
Rows come in OpenAI form (``messages`` / ``role`` / ``content``) or ShareGPT form (``conversations`` /
``from`` / ``value``) and are normalised to a list of ``{"role", "content"}`` messages. An assistant turn's
reasoning trace, given either as a separate field (``reasoning_content``, the OpenAI-compatible servers' name;
``reasoning``, vLLM's newer one; ``thinking``, the field GPT-OSS's chat template reads) or as a
``<think>...</think>`` block opening the content (what a Qwen3 target writes), is normalised to one form: a
``reasoning_content`` field, with the answer after the block as ``content`` (``REASONING_FIELD``). The chat
template puts it back where the target's format has it (ChatML: a ``<think>`` block; harmony: the analysis
channel), and the loss mask can then tell the reasoning from the answer by rendering alone.

Bad rows are reported as ``BadRow`` values carrying a reason and a ``file:line`` location, so the caller
decides whether to count and skip them or to stop; JSON lines are decoded one by one, so a line that is not
UTF-8 is a bad row (``invalid_encoding``) rather than the end of the file. A source that cannot give rows at all
(a missing path, an empty file, an unsupported or unreadable file) raises ``DataSourceError`` naming it. Both
are ``UserError``: the training entry point prints them as one line.
"""

from __future__ import annotations

import glob
import json
import os
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from deepspec_train.common.errors import UserError

Message = dict
"""One chat message: ``{"role": "system" | "user" | "assistant", "content": str}``; an assistant message with a
reasoning trace also has ``"reasoning_content": str`` (``REASONING_FIELD``)."""

# The normalised message field holding an assistant turn's reasoning (absent when the turn has none; "" for an
# empty ``<think></think>`` block, which a Qwen3 template still renders).
REASONING_FIELD = "reasoning_content"
# Fields a row may carry the reasoning in, first match wins: the OpenAI-compatible name, vLLM's newer name, and
# the name transformers' GPT-OSS template reads.
REASONING_INPUT_FIELDS = (REASONING_FIELD, "reasoning", "thinking")
THINK_OPEN, THINK_CLOSE = "<think>", "</think>"

BAD_ROW_REASONS = (
    # A JSON line whose bytes are not UTF-8 (JSON text is UTF-8 by RFC 8259).
    "invalid_encoding",
    "invalid_json",
    "missing_field",
    "unknown_role",
    "empty_assistant",
    "nothing_to_supervise",
    "too_long",
    # The chat template renders this conversation differently as a prefix than in full (e.g. an assistant turn
    # that opens with <think> while thinking is off), so its assistant span cannot be located.
    "template_mismatch",
    # An assistant turn whose reasoning cannot be read: a <think> block that never closes (an answer cut at
    # max_new_tokens), reasoning given both as a field and inline, or a reasoning field that is not text.
    "malformed_reasoning",
    # The chat template ignores the assistant turn's reasoning field, so the reasoning would silently vanish
    # from the training text (a template made before reasoning fields, or a target without reasoning).
    "reasoning_not_rendered",
)

ROLES = ("system", "user", "assistant")
SHAREGPT_ROLES = {
    "system": "system",
    "human": "user",
    "user": "user",
    "gpt": "assistant",
    "assistant": "assistant",
    "chatgpt": "assistant",
}

JSON_SUFFIXES = (".jsonl", ".json")
PARQUET_SUFFIXES = (".parquet",)
ARROW_SUFFIXES = (".arrow",)
DATA_FILE_SUFFIXES = JSON_SUFFIXES + PARQUET_SUFFIXES + ARROW_SUFFIXES

# Rows are pulled from columnar files in batches of this many, to bound memory on large shards.
_TABLE_BATCH_ROWS = 4096
_UTF8_BOM = b"\xef\xbb\xbf"


class DataSourceError(UserError):
    """A data source that yields no rows at all: missing, empty, of an unsupported type or unreadable."""


class BadRow(UserError):
    """A row that cannot become a training sample; ``reason`` is one of ``BAD_ROW_REASONS``."""

    def __init__(self, reason: str, where: str = "", detail: str = "") -> None:
        if reason not in BAD_ROW_REASONS:
            raise ValueError(f"unknown bad-row reason {reason!r}; expected one of {BAD_ROW_REASONS}")
        self.reason = reason
        self.where = where
        self.detail = detail
        super().__init__(self._message())

    def at(self, where: str) -> BadRow:
        """The same error located at ``where`` (renderers do not know the file they were called for)."""
        return BadRow(self.reason, where, self.detail)

    def _message(self) -> str:
        location = f"{self.where}: " if self.where else ""
        detail = f" ({self.detail})" if self.detail else ""
        return f"{location}bad row: {self.reason}{detail}"

    def __reduce__(self) -> tuple:
        return BadRow, (self.reason, self.where, self.detail)


def iter_records(source: str, split: str = "train") -> Iterator[tuple[str, dict | BadRow]]:
    """Yield ``(where, record)`` for every row of ``source``; unparsable rows come as ``BadRow`` values.

    ``where`` is ``path:line`` with a 1-based line for JSON lines, and ``path:index`` with a 0-based row index
    for JSON arrays, Parquet, Arrow and ``datasets`` sources. ``split`` picks the split of a dataset dict or of
    a ``load_dataset`` source.
    """
    path = Path(os.path.expanduser(source))
    if path.is_file():
        yield from _iter_file(path)
    elif path.is_dir():
        yield from _iter_directory(path, split)
    elif glob.has_magic(source):
        matches = sorted(glob.glob(os.path.expanduser(source), recursive=True))
        if not matches:
            raise DataSourceError(f"data source {source!r}: the pattern matches no file")
        for match in matches:
            yield from iter_records(match, split)
    elif looks_like_a_path(source):
        raise DataSourceError(f"data source {source!r}: no such file or directory")
    else:
        yield from _iter_load_dataset(source, split)


def looks_like_a_path(source: str) -> bool:
    """Whether ``source`` names a local file rather than a ``datasets`` hub name such as ``org/name``."""
    expanded = os.path.expanduser(source)
    return (
        os.path.isabs(expanded)
        or source.startswith(("./", "../", "~"))
        or Path(source).suffix.lower() in DATA_FILE_SUFFIXES
    )


def _iter_file(path: Path) -> Iterator[tuple[str, dict | BadRow]]:
    suffix = path.suffix.lower()
    if suffix in JSON_SUFFIXES:
        rows = _iter_json(path)
    elif suffix in PARQUET_SUFFIXES:
        rows = _iter_columnar(path, _parquet_batches, "Parquet")
    elif suffix in ARROW_SUFFIXES:
        rows = _iter_columnar(path, _arrow_batches, "Arrow")
    else:
        raise DataSourceError(
            f"data file {path}: unsupported file type {suffix or '(no suffix)'!r}; expected one of "
            f"{', '.join(DATA_FILE_SUFFIXES)}"
        )
    count = 0
    for item in rows:
        count += 1
        yield item
    if count == 0:
        raise DataSourceError(f"data file {path} is empty: it holds no rows")


def _iter_json(path: Path) -> Iterator[tuple[str, dict | BadRow]]:
    if _first_non_blank_byte(path) == b"[":
        yield from _iter_json_array(path)
        return
    with open(path, "rb") as handle:
        for line_number, raw in enumerate(handle, start=1):
            if not raw.strip():
                continue
            where = f"{path}:{line_number}"
            try:
                line = raw.decode("utf-8-sig" if line_number == 1 else "utf-8")
            except UnicodeDecodeError as error:
                yield where, BadRow("invalid_encoding", where, _decode_detail(raw, error))
                continue
            yield where, _parse_json_object(line, where)


def _first_non_blank_byte(path: Path) -> bytes:
    with open(path, "rb") as handle:
        chunk = handle.read(1 << 16).removeprefix(_UTF8_BOM)
        while chunk:
            stripped = chunk.lstrip()
            if stripped:
                return stripped[:1]
            chunk = handle.read(1 << 16)
    return b""


def _decode_detail(raw: bytes, error: UnicodeDecodeError) -> str:
    return f"byte 0x{raw[error.start]:02x} at offset {error.start} is not UTF-8"


def _iter_json_array(path: Path) -> Iterator[tuple[str, dict | BadRow]]:
    raw = path.read_bytes()
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as error:
        # The whole array is unreadable; report it once, at the line of the offending byte.
        line_number = raw.count(b"\n", 0, error.start) + 1
        where = f"{path}:{line_number}"
        yield where, BadRow("invalid_encoding", where, _decode_detail(raw, error))
        return
    try:
        rows = json.loads(text)
    except json.JSONDecodeError as error:
        # The whole array is unreadable; report it once, at the line where parsing failed.
        yield f"{path}:{error.lineno}", BadRow("invalid_json", f"{path}:{error.lineno}", error.msg)
        return
    for index, row in enumerate(rows):
        where = f"{path}:{index}"
        yield where, row if isinstance(row, dict) else BadRow("invalid_json", where, "row is not a JSON object")


def _parse_json_object(text: str, where: str) -> dict | BadRow:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as error:
        return BadRow("invalid_json", where, error.msg)
    if not isinstance(value, dict):
        return BadRow("invalid_json", where, "row is not a JSON object")
    return value


def _iter_columnar(path: Path, batches_of: Any, kind: str) -> Iterator[tuple[str, dict | BadRow]]:
    """Rows of a Parquet or Arrow file; a file that is not one (or is cut short) raises ``DataSourceError``."""
    import pyarrow as pa

    index = 0
    try:
        for batch in batches_of(path):
            for row in batch.to_pylist():
                yield f"{path}:{index}", row
                index += 1
    except (pa.ArrowException, OSError) as error:
        first_line = str(error).splitlines()[0] if str(error) else type(error).__name__
        raise DataSourceError(f"data file {path}: not a readable {kind} file after row {index} ({first_line})") from None


def _parquet_batches(path: Path) -> Iterator[Any]:
    import pyarrow.parquet as pq

    yield from pq.ParquetFile(path).iter_batches(batch_size=_TABLE_BATCH_ROWS)


def _arrow_batches(path: Path) -> Iterator[Any]:
    import pyarrow as pa

    with pa.memory_map(str(path)) as source:
        try:
            reader = pa.ipc.open_file(source)
            batches = (reader.get_batch(i) for i in range(reader.num_record_batches))
        except pa.ArrowInvalid:
            # `datasets` writes the streaming IPC format; Feather v2 / pyarrow files use the file format.
            source.seek(0)
            batches = iter(pa.ipc.open_stream(source))
        yield from batches


def _iter_directory(path: Path, split: str) -> Iterator[tuple[str, dict | BadRow]]:
    if (path / "state.json").is_file() or (path / "dataset_dict.json").is_file():
        yield from _iter_saved_dataset(path, split)
        return
    files = sorted(p for p in path.rglob("*") if p.is_file() and p.suffix.lower() in DATA_FILE_SUFFIXES)
    if files:
        for file in files:
            yield from _iter_file(file)
    else:
        yield from _iter_load_dataset(str(path), split)


def _iter_saved_dataset(path: Path, split: str) -> Iterator[tuple[str, dict | BadRow]]:
    import datasets

    loaded = datasets.load_from_disk(str(path))
    if isinstance(loaded, datasets.DatasetDict):
        if split not in loaded:
            raise DataSourceError(f"data source {str(path)!r}: no split {split!r}; available: {sorted(loaded)}")
        loaded = loaded[split]
    yield from _iter_dataset_rows(loaded, str(path))


def _iter_load_dataset(source: str, split: str) -> Iterator[tuple[str, dict | BadRow]]:
    import datasets

    try:
        loaded = datasets.load_dataset(source, split=split)
    except Exception as error:
        first_line = str(error).splitlines()[0] if str(error) else ""
        raise DataSourceError(
            f"data source {source!r} is not a local file or directory, and datasets.load_dataset could not load "
            f"it (a hub dataset needs network access; offline, download it elsewhere and pass the local "
            f"path): {type(error).__name__}: {first_line}"
        ) from error
    yield from _iter_dataset_rows(loaded, source)


def _iter_dataset_rows(dataset: Any, name: str) -> Iterator[tuple[str, dict | BadRow]]:
    for index, row in enumerate(dataset):
        yield f"{name}:{index}", row


def normalize_conversation(record: dict, where: str) -> list[Message]:
    """Return the record's messages as ``[{"role", "content"}]``; raise ``BadRow`` if they are unusable.

    OpenAI form: ``{"messages": [{"role", "content"}]}``, where ``content`` may also be a list of
    ``{"type": "text", "text"}`` parts. ShareGPT form: ``{"conversations": [{"from", "value"}]}`` with
    ``from`` in human/user, gpt/assistant/chatgpt, system. An assistant turn with blank content (its answer,
    after any reasoning) is a bad row. Reasoning is normalised as the module docstring says (``split_reasoning``).
    """
    if isinstance(record.get("messages"), list):
        turns, role_key, content_key, role_names = record["messages"], "role", "content", {r: r for r in ROLES}
    elif isinstance(record.get("conversations"), list):
        turns, role_key, content_key, role_names = record["conversations"], "from", "value", SHAREGPT_ROLES
    else:
        raise BadRow("missing_field", where, "no 'messages' or 'conversations' list")
    messages = []
    for position, turn in enumerate(turns):
        if not isinstance(turn, dict) or turn.get(role_key) is None or turn.get(content_key) is None:
            raise BadRow("missing_field", where, f"turn {position} lacks '{role_key}' or '{content_key}'")
        role = role_names.get(str(turn[role_key]).lower())
        if role is None:
            raise BadRow("unknown_role", where, f"turn {position} has role {turn[role_key]!r}")
        content = _content_text(turn[content_key])
        if content is None:
            raise BadRow("missing_field", where, f"turn {position} has non-text content")
        message = {"role": role, "content": content}
        if role == "assistant":
            message = _with_reasoning(turn, content, f"turn {position}", where)
            if not message["content"].strip():
                raise BadRow("empty_assistant", where, f"turn {position}")
        messages.append(message)
    return messages


def _with_reasoning(turn: dict, content: str, which: str, where: str) -> Message:
    """The assistant message of ``turn`` in normalised form (see the module docstring)."""
    field_name = next((name for name in REASONING_INPUT_FIELDS if turn.get(name) is not None), None)
    inline, answer = split_reasoning(content, which, where)
    if field_name is None:
        reasoning = inline
    elif inline is not None:
        raise BadRow("malformed_reasoning", where, f"{which} gives its reasoning both as {field_name!r} and inline")
    else:
        reasoning = _content_text(turn[field_name])
        if reasoning is None:
            raise BadRow("malformed_reasoning", where, f"{which} has a non-text {field_name!r}")
        reasoning = reasoning.strip("\n")
    message = {"role": "assistant", "content": answer}
    if reasoning is not None:
        message[REASONING_FIELD] = reasoning
    return message


def split_reasoning(content: str, which: str = "", where: str = "") -> tuple[str | None, str]:
    """``(reasoning, answer)`` of an assistant content that may open with a ``<think>...</think>`` block
    (``(None, content)`` when it does not). Newlines around the reasoning and before the answer are dropped, as
    Qwen3's template drops them before it writes the block back as ``<think>\\nR\\n</think>\\n\\nA``. A block that
    never closes is ``BadRow("malformed_reasoning")``."""
    opened = content.lstrip()
    if not opened.startswith(THINK_OPEN):
        return None, content
    body = opened[len(THINK_OPEN) :]
    close = body.find(THINK_CLOSE)
    if close < 0:
        raise BadRow("malformed_reasoning", where, f"{which} opens a {THINK_OPEN} block that never closes".strip())
    return body[:close].strip("\n"), body[close + len(THINK_CLOSE) :].lstrip("\n")


def _content_text(content: Any) -> str | None:
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(isinstance(part, dict) and part.get("type") == "text" for part in content):
        return "".join(str(part.get("text", "")) for part in content)
    return None


def to_openai_form(record: dict, where: str) -> dict:
    """The record with its conversation as a normalised ``messages`` list; other keys are kept as they are."""
    messages = normalize_conversation(record, where)
    converted = {key: value for key, value in record.items() if key not in ("messages", "conversations")}
    converted["messages"] = messages
    return converted


def write_conversations_jsonl(path: str | os.PathLike, rows: Iterable[dict]) -> None:
    """Write OpenAI-form rows (``messages`` plus any extra keys) as UTF-8 JSON lines, atomically."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    temporary = target.with_name(f".{target.name}.tmp-{os.getpid()}")
    with open(temporary, "w", encoding="utf-8") as handle:
        for row in rows:
            if not isinstance(row.get("messages"), list):
                raise TypeError(f"write_conversations_jsonl: row without a 'messages' list: {row!r:.200}")
            handle.write(json.dumps(row, ensure_ascii=False) + "\n")
    os.replace(temporary, target)


def read_conversations_jsonl(path: str | os.PathLike) -> list[dict]:
    """Read a conversations JSONL file into OpenAI-form rows, keeping extra keys; raise ``BadRow`` on a bad row."""
    rows = []
    for where, record in _iter_json(Path(path)):
        if isinstance(record, BadRow):
            raise record
        rows.append(to_openai_form(record, where))
    return rows
