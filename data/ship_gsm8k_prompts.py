"""Write the package's built-in prompt set ``builtin:gsm8k-train`` from local copies of GSM8K and HumanEval.

    python data/ship_gsm8k_prompts.py --gsm8k DIR_WITH_TRAIN_AND_TEST_JSONL --humaneval HumanEval.jsonl.gz

Run once by a maintainer (the output is committed; users never run it). It draws ``--count`` questions of GSM8K's
train split by a seeded shuffle, drops any whose fingerprint (``realworld.builtin_prompts.prompt_fingerprint``) a
benchmark prompt has (GSM8K test's questions, HumanEval's prompts), and writes:

- ``deepspec_train/shipped/prompts/gsm8k-train.jsonl``: ``{"id": "gsm8k-train-<line>", "question": ...}`` rows,
  ``<line>`` the row's line in GSM8K's ``train.jsonl``;
- ``deepspec_train/shipped/prompts/LICENSE-gsm8k``: GSM8K's license, which its copies must carry;
- ``tests/data/benchmark_prompt_fingerprints.txt``: ``<suite> <fingerprint>`` per benchmark prompt, so the tests
  check the shipped set against the benchmarks without the datasets.
"""

from __future__ import annotations

import argparse
import gzip
import json
import random
import shutil
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from deepspec_train.realworld.builtin_prompts import BUILTIN_PROMPT_SETS, SHIPPED_PROMPTS, prompt_fingerprint  # noqa: E402

FINGERPRINTS = REPO / "tests" / "data" / "benchmark_prompt_fingerprints.txt"


def read_jsonl(path: Path) -> list[dict]:
    opener = gzip.open if path.name.endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as handle:
        return [json.loads(line) for line in handle if line.strip()]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gsm8k", type=Path, required=True, help="folder with GSM8K's train.jsonl and test.jsonl")
    parser.add_argument("--humaneval", type=Path, required=True, help="HumanEval.jsonl.gz")
    parser.add_argument("--count", type=int, default=128)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    benchmark = [("gsm8k-test", row["question"]) for row in read_jsonl(args.gsm8k / "test.jsonl")]
    benchmark += [("humaneval", row["prompt"]) for row in read_jsonl(args.humaneval)]
    fingerprints = [(suite, prompt_fingerprint(text)) for suite, text in benchmark]
    taken = {fingerprint for _, fingerprint in fingerprints}

    train = list(enumerate(read_jsonl(args.gsm8k / "train.jsonl"), start=1))
    random.Random(args.seed).shuffle(train)
    kept = [(line, row) for line, row in train if prompt_fingerprint(row["question"]) not in taken][:args.count]
    kept.sort(key=lambda item: item[0])

    shipped = BUILTIN_PROMPT_SETS["gsm8k-train"].path
    shipped.parent.mkdir(parents=True, exist_ok=True)
    with shipped.open("w", encoding="utf-8") as handle:
        for line, row in kept:
            handle.write(json.dumps({"id": f"gsm8k-train-{line}", "question": row["question"]}, ensure_ascii=False)
                         + "\n")
    shutil.copyfile(args.gsm8k / "LICENSE", SHIPPED_PROMPTS / "LICENSE-gsm8k")
    FINGERPRINTS.parent.mkdir(parents=True, exist_ok=True)
    FINGERPRINTS.write_text("".join(f"{suite} {fingerprint}\n" for suite, fingerprint in fingerprints))
    print(f"{len(kept)} questions -> {shipped}; {len(fingerprints)} benchmark fingerprints -> {FINGERPRINTS}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
