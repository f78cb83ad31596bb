"""Nothing read before issue 41 changes: OpenAI ``messages`` and ShareGPT ``conversations`` rows give the same token
shards, byte for byte, whatever ``data.format`` reads them (``auto`` or ``chat``).

``EXPECTED_DIGEST`` is the SHA-256 of the shard files that the code before row shapes existed (commit 7b46adf)
built from ``ROWS`` with the test chat tokenizer: it was produced by running ``shard_digest(build(...))`` below
on that commit, and can be produced again the same way (``git worktree add /tmp/old 7b46adf`` and run this
module's ``build`` there). The tiny world's own conversations are compared across their two row forms and both
reading paths, since its data may change from one commit to the next.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
from transformers import AutoTokenizer

from deepspec_train.data import token_shards
from tests.helpers.chat_tokenizer import build_chat_tokenizer

ROWS = [
    {"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello! How can I help?"}]},
    {"conversations": [{"from": "human", "value": "2+3?"}, {"from": "gpt", "value": "<think>\nadd\n</think>\n\n5"}]},
    {
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": [{"type": "text", "text": "Hello"}]},
            {"role": "assistant", "content": "Hi", "reasoning_content": "greet back"},
            {"role": "user", "content": "Bye"},
            {"role": "assistant", "content": "Bye, the quick brown fox says."},
        ]
    },
    {"conversations": [{"from": "system", "value": "x"}, {"from": "user", "value": "Write add"},
                       {"from": "chatgpt", "value": "def add(a, b): return a + b"}]},
    {"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": ""}]},
]
EXPECTED_DIGEST = "953a6588aa33549caacad80a75a2f50795651ba44a305558105bc86c8326f0ec"


def shard_digest(cache_path: str) -> str:
    """SHA-256 over the bytes of an entry's shard files, in name order."""
    digest = hashlib.sha256()
    for shard in sorted(Path(cache_path).glob("shard-*.arrow")):
        digest.update(shard.read_bytes())
    return digest.hexdigest()


def build(
    tokenizer, rows: list[dict], directory: Path, max_length: int = 128, chat_template_kwargs: dict | None = None,
    **renderer_settings,
) -> str:
    """The cache entry built from ``rows`` written as JSON lines under ``directory``."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "rows.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    renderer = token_shards.ConversationRenderer(tokenizer, max_length, chat_template_kwargs, **renderer_settings)
    _, summary = token_shards.build_token_dataset([str(path)], renderer, str(directory / "cache"), progress=False)
    assert summary.kept > 0
    return summary.cache_path


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    return build_chat_tokenizer(tmp_path_factory.mktemp("chat_tokenizer"))


def test_openai_and_sharegpt_rows_give_the_shards_they_gave_before(tokenizer, tmp_path) -> None:
    assert shard_digest(build(tokenizer, ROWS, tmp_path)) == EXPECTED_DIGEST


def test_reading_them_as_chat_rows_by_name_changes_nothing(tokenizer, tmp_path) -> None:
    assert shard_digest(build(tokenizer, ROWS, tmp_path, row_format="chat")) == EXPECTED_DIGEST


def as_sharegpt(row: dict) -> dict:
    names = {"user": "human", "assistant": "gpt", "system": "system"}
    turns = [{"from": names[m["role"]], "value": m["content"]} for m in row["messages"]]
    return {**{k: v for k, v in row.items() if k != "messages"}, "conversations": turns}


def test_the_tiny_worlds_conversations_give_one_set_of_shards(tiny_world: Path, tmp_path) -> None:
    tokenizer = AutoTokenizer.from_pretrained(str(tiny_world / "target"))
    rows = [json.loads(line) for line in (tiny_world / "conversations" / "train.jsonl").read_text().splitlines()]
    # The recipe defaults: data.max_length 2048 and data.enable_thinking false.
    settings = {"max_length": 2048, "chat_template_kwargs": {"enable_thinking": False}}
    digests = {
        (form, row_format): shard_digest(
            build(tokenizer, converted, tmp_path / f"{form}-{row_format}", row_format=row_format, **settings)
        )
        for form, converted in (("openai", rows), ("sharegpt", [as_sharegpt(row) for row in rows]))
        for row_format in ("auto", "chat")
    }
    assert len(set(digests.values())) == 1, digests
