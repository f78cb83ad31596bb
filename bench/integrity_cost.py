"""What the integrity checks cost: content hashes of the token cache key and of checkpoint manifests.

Run: ``PYTHONPATH=. python bench/integrity_cost.py [--size-mb 1024] [--tokenizer artifacts/tinyworld/target]``

Measured side by side in one run, on files of ``--size-mb`` in a temporary directory (``--dir``, default the
system's):

- ``file_checksum`` (SHA-256, 1 MiB reads) of a file just written, so the read comes from the page cache and the
  figure is the hashing cost itself (a cold read from a slow disk adds that disk's read time);
- a checkpoint of that total size laid out as training writes one (weights in ``drafter.safetensors``, AdamW's
  two moments, twice their size, in ``optimizer.pt``): the time to save it, then ``write_manifest`` of its
  directory (the extra work every checkpoint now does) and ``checkpoint_problem`` (what a resume adds);
- with ``--tokenizer``, the cache key of a conversations JSONL of ``--jsonl-mb`` next to tokenising that file
  (``build_token_dataset``), which is what a cache miss costs anyway.

It prints each rate and the ratios manifest / save and key / tokenise.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import tempfile
import time
from pathlib import Path

import torch
from safetensors.torch import save_file

from deepspec_train.common.checksums import file_checksum
from deepspec_train.training.checkpoint_manifest import checkpoint_problem, write_manifest

MB = 1 << 20


def timed(work) -> float:
    start = time.perf_counter()
    work()
    return time.perf_counter() - start


def write_random(path: Path, size: int) -> float:
    """Seconds to write ``size`` random bytes (fsynced, so the write is really done)."""
    block = os.urandom(16 * MB)

    def write() -> None:
        with open(path, "wb") as handle:
            for offset in range(0, size, len(block)):
                handle.write(block[: min(len(block), size - offset)])
            handle.flush()
            os.fsync(handle.fileno())

    return timed(write)


def write_conversations(path: Path, size: int) -> int:
    words = "the quick brown fox jumps over a lazy dog while two plus three makes five".split()
    rng = random.Random(0)
    rows = 0
    with open(path, "w") as handle:
        while handle.tell() < size:
            question = " ".join(rng.choices(words, k=12))
            answer = " ".join(rng.choices(words, k=80))
            messages = [{"role": "user", "content": question}, {"role": "assistant", "content": answer}]
            handle.write(json.dumps({"messages": messages}) + "\n")
            rows += 1
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mb", type=int, default=1024, help="size of the hashed file and checkpoint")
    parser.add_argument("--dir", default=None, help="where to write the temporary files")
    parser.add_argument("--tokenizer", default=None, help="target directory whose tokenizer tokenises the JSONL")
    parser.add_argument("--jsonl-mb", type=int, default=16, help="size of the tokenised conversations file")
    args = parser.parse_args()
    size = args.size_mb * MB
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        root = Path(tmp)
        blob = root / "blob.bin"
        write_s = write_random(blob, size)
        hash_s = timed(lambda: file_checksum(blob))
        blob.unlink()
        print(f"file_checksum: {args.size_mb / hash_s:,.0f} MB/s = {hash_s / args.size_mb * 1024:.2f} s per GB "
              f"(write {args.size_mb / write_s:,.0f} MB/s; hash / write time {hash_s / write_s:.2f})")

        checkpoint = root / "step_00000001"
        checkpoint.mkdir()
        weights = torch.rand(size // 3 // 4 // 1024, 1024)
        moments = {"state": {0: {"exp_avg": torch.rand_like(weights), "exp_avg_sq": torch.rand_like(weights)}}}

        def save() -> None:
            save_file({"w": weights}, str(checkpoint / "drafter.safetensors"))
            torch.save(moments, checkpoint / "optimizer.pt")
            torch.save({"cpu": torch.get_rng_state()}, checkpoint / "rng_rank0.pt")
            (checkpoint / "trainer_state.json").write_text(json.dumps({"world_size": 1}))

        save_s = timed(save)
        manifest_s = timed(lambda: write_manifest(checkpoint))
        verify_s = timed(lambda: checkpoint_problem(checkpoint))
        print(f"checkpoint of {args.size_mb} MB: save {save_s:.2f} s, write_manifest {manifest_s:.2f} s "
              f"(manifest / save {manifest_s / save_s:.2f}), verify on resume {verify_s:.2f} s")

        if args.tokenizer:
            from transformers import AutoTokenizer

            from deepspec_train.data.token_shards import ConversationRenderer, build_token_dataset, cache_key

            tokenizer = AutoTokenizer.from_pretrained(args.tokenizer)
            conversations = root / "conversations.jsonl"
            rows = write_conversations(conversations, args.jsonl_mb * MB)
            key_s = timed(lambda: cache_key([str(conversations)], tokenizer, 512, "train", None))
            renderer = ConversationRenderer(tokenizer, 512, None)
            build_s = timed(lambda: build_token_dataset([str(conversations)], renderer, str(root / "cache"),
                                                        progress=False))
            print(f"token cache, {args.jsonl_mb} MB JSONL ({rows:,} conversations): key {key_s:.3f} s, tokenise "
                  f"{build_s:.1f} s (key / tokenise {key_s / build_s:.4f})")


if __name__ == "__main__":
    main()
