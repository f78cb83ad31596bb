"""Prepare the Open-PerfectBlend prompt set for regeneration: first prompts only, deduplicated, length-filtered,
split 95/5 into train and validation.

    python data/prepare_open_perfectblend.py --out data/open-perfectblend/prompts
    python data/prepare_open_perfectblend.py --source /data/open-perfectblend --out data/open-perfectblend/prompts \\
        --tokenizer models/Qwen3-8B --max-prompt-tokens 2048

``--source`` is anything ``deepspec_train.data.conversations.iter_records`` reads: the hub name
``mlabonne/open-perfectblend`` (through ``datasets.load_dataset``; needs the hub), a local copy of its parquet
files, a ``save_to_disk`` directory, or JSONL. Rows are ShareGPT (``conversations`` of ``from`` / ``value``) or
OpenAI form; the ``source`` column becomes the output's ``category``.

For every row the prompt is the system and user turns before the first assistant turn (the target answers
it during regeneration; later turns would need answers the target never gave). Rows are dropped when they are
unreadable, have no user turn, repeat an earlier row's first user prompt after normalisation (case and
whitespace), or fall outside the length bounds (characters, and tokens when a tokenizer is given). The
validation split is chosen by a hash of the normalised first prompt, so it does not depend on row order or on
the other rows, and reruns agree. Outputs: ``train.jsonl``, ``validation.jsonl`` and ``manifest.json`` (the
settings, the source's identity, the counts and the outputs' checksums); a rerun whose manifest matches does
nothing.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import sys
from collections import Counter
from pathlib import Path
from typing import Any, Iterator, Optional

from deepspec_train.data.conversations import BadRow, iter_records, normalize_conversation, write_conversations_jsonl
from deepspec_train.common.errors import UserError, exit_on_user_error
from deepspec_train.common.model_folders import check_target_folder
from deepspec_train.common.output_paths import ensure_output_dir

DEFAULT_SOURCE = "mlabonne/open-perfectblend"
MANIFEST = "manifest.json"
SPLITS = ("train", "validation")
# Bump when the selection rules change, so that old outputs are rebuilt.
PREPARE_VERSION = 1
_HASH_BUCKETS = 1_000_000


def normalize_prompt(text: str) -> str:
    """The dedup / split key of a prompt: case-folded, whitespace runs collapsed, ends stripped."""
    return re.sub(r"\s+", " ", text).strip().casefold()


def prompt_hash(text: str) -> str:
    return hashlib.sha256(normalize_prompt(text).encode("utf-8")).hexdigest()


def is_validation(key_hash: str, fraction: float) -> bool:
    """Deterministic split: the prompt's hash, read as a number, falls in the first ``fraction`` of buckets."""
    return int(key_hash[:12], 16) % _HASH_BUCKETS < round(fraction * _HASH_BUCKETS)


def prompt_turns(messages: list[dict]) -> list[dict]:
    """System and user turns before the first assistant turn."""
    turns = []
    for message in messages:
        if message["role"] == "assistant":
            break
        turns.append(message)
    return turns


def source_identity(source: str) -> dict[str, Any]:
    """What identifies the input: the files (path, size, mtime) of a local source, or the hub name."""
    path = Path(os.path.expanduser(source))
    if not path.exists():
        return {"source": source}
    files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
    return {"source": str(path.resolve()), "files": [[str(f), f.stat().st_size, f.stat().st_mtime_ns] for f in files]}


class _Selector:
    """Applies the dedup and length rules row by row, counting why rows are dropped."""

    def __init__(self, min_chars: int, max_chars: int, tokenizer: Any, max_tokens: Optional[int]) -> None:
        self.min_chars, self.max_chars = min_chars, max_chars
        self.tokenizer, self.max_tokens = tokenizer, max_tokens
        self.seen: set[str] = set()
        self.dropped: Counter = Counter()

    def select(self, where: str, record: dict | BadRow) -> Optional[tuple[str, dict]]:
        if isinstance(record, BadRow):
            self.dropped[record.reason] += 1
            return None
        try:
            turns = prompt_turns(normalize_conversation(record, where))
        except BadRow as error:
            self.dropped[error.reason] += 1
            return None
        users = [m["content"] for m in turns if m["role"] == "user"]
        if not users or not users[0].strip():
            self.dropped["no_user_prompt"] += 1
            return None
        key = prompt_hash(users[0])
        if key in self.seen:
            self.dropped["duplicate"] += 1
            return None
        chars = sum(len(m["content"]) for m in turns)
        if chars < self.min_chars or chars > self.max_chars:
            self.dropped["length_chars"] += 1
            return None
        if self.tokenizer is not None and self.max_tokens is not None:
            tokens = sum(len(self.tokenizer(m["content"], add_special_tokens=False)["input_ids"]) for m in turns)
            if tokens > self.max_tokens:
                self.dropped["length_tokens"] += 1
                return None
        self.seen.add(key)
        row = {"id": f"opb-{key[:16]}", "messages": turns}
        if record.get("source") is not None:
            row["category"] = str(record["source"])
        return key, row


def _file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _up_to_date(out: Path, settings: dict) -> bool:
    manifest = out / MANIFEST
    if not manifest.is_file():
        return False
    recorded = json.loads(manifest.read_text())
    if recorded.get("settings") != settings:
        return False
    return all(
        (out / f"{split}.jsonl").is_file() and _file_sha256(out / f"{split}.jsonl") == recorded["sha256"][split]
        for split in SPLITS
    )


def prepare(
    source: str,
    out: str | Path,
    split: str = "train",
    validation_fraction: float = 0.05,
    min_prompt_chars: int = 1,
    max_prompt_chars: int = 16000,
    tokenizer_path: Optional[str] = None,
    max_prompt_tokens: Optional[int] = None,
) -> dict:
    """Write ``train.jsonl`` / ``validation.jsonl`` / ``manifest.json`` under ``out``; returns the manifest
    (with ``"reused": True`` when the outputs were already up to date)."""
    out = Path(out)
    settings = {
        "version": PREPARE_VERSION,
        "input": source_identity(source),
        "split": split,
        "validation_fraction": validation_fraction,
        "min_prompt_chars": min_prompt_chars,
        "max_prompt_chars": max_prompt_chars,
        "tokenizer": str(Path(tokenizer_path).resolve()) if tokenizer_path else None,
        "max_prompt_tokens": max_prompt_tokens,
    }
    if _up_to_date(out, settings):
        return dict(json.loads((out / MANIFEST).read_text()), reused=True)
    tokenizer = None
    if tokenizer_path is not None:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(tokenizer_path)
    selector = _Selector(min_prompt_chars, max_prompt_chars, tokenizer, max_prompt_tokens)
    rows: dict[str, list[dict]] = {name: [] for name in SPLITS}
    for where, record in iter_records(source, split):
        selected = selector.select(where, record)
        if selected is not None:
            key, row = selected
            rows["validation" if is_validation(key, validation_fraction) else "train"].append(row)
    # The manifest goes last: its presence with matching checksums is what marks the outputs complete.
    (out / MANIFEST).unlink(missing_ok=True)
    for name in SPLITS:
        write_conversations_jsonl(out / f"{name}.jsonl", rows[name])
    manifest = {
        "settings": settings,
        "counts": {name: len(rows[name]) for name in SPLITS},
        "dropped": dict(sorted(selector.dropped.items())),
        "sha256": {name: _file_sha256(out / f"{name}.jsonl") for name in SPLITS},
    }
    (out / MANIFEST).write_text(json.dumps(manifest, indent=2))
    return dict(manifest, reused=False)


def _parse(argv: Optional[list[str]]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--source", default=DEFAULT_SOURCE, help="hub name, local copy, dataset dir or JSONL")
    parser.add_argument("--out", default="data/open-perfectblend/prompts", help="output directory")
    parser.add_argument("--split", default="train", help="split of the source to read")
    parser.add_argument("--validation-fraction", type=float, default=0.05)
    parser.add_argument("--min-prompt-chars", type=int, default=1)
    parser.add_argument("--max-prompt-chars", type=int, default=16000)
    parser.add_argument("--tokenizer", default=None, help="target directory: also bound the prompt in tokens")
    parser.add_argument("--max-prompt-tokens", type=int, default=None)
    return parser.parse_args(argv)


def _rows_summary(manifest: dict) -> Iterator[str]:
    counts = manifest["counts"]
    state = "up to date, nothing to do" if manifest["reused"] else "written"
    yield f"{state}: {counts['train']} train and {counts['validation']} validation prompts"
    for reason, count in manifest["dropped"].items():
        yield f"dropped {count}: {reason}"


def main(argv: Optional[list[str]] = None) -> int:
    """Exit status 0, or 2 with one ``error:`` line for bad options or a source that gives no rows."""
    args = _parse(argv)
    return exit_on_user_error(lambda: _prepare(args))


def _prepare(args: argparse.Namespace) -> int:
    if args.max_prompt_tokens is not None and args.tokenizer is None:
        raise UserError("--max-prompt-tokens needs --tokenizer")
    if args.tokenizer is not None:
        check_target_folder(args.tokenizer, "--tokenizer", weights=False, tokenizer=True, allow_hub=True)
    ensure_output_dir(args.out, "--out")
    manifest = prepare(
        args.source, args.out, args.split, args.validation_fraction, args.min_prompt_chars, args.max_prompt_chars,
        args.tokenizer, args.max_prompt_tokens,
    )
    for line in _rows_summary(manifest):
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
