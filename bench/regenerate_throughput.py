"""Answer tokens per second of ``deepspec regenerate --backend local``, before and after continuous batching,
side by side on the same prompts in one process.

Before: the backend as it was until continuous batching, kept here as the reference: prompts sorted by length,
left-padded into batches of ``--before-batch-size``, one ``model.generate`` per batch (its key/value cache, its
stop at the turn end; a batch runs until its longest answer ends, finished rows still computed). After: today's
``LocalBackend`` (``regenerate.decode_loop``): up to ``--batch-size`` answers in flight over one cache, a finished
answer leaves at once and the next prompt takes its slot. Both sample from the recipe's law and count answer
tokens the same way (the stop token included). Each runs ``--repeats`` times, alternating, and the table reports
tokens per wall second and per CPU second (the process's own time: on a shared machine it moves far less with the
other load than wall time does)::

    OMP_NUM_THREADS=1 python bench/regenerate_throughput.py --target artifacts/smollm2/target \\
        --prompts artifacts/smollm2/prompts/validation.jsonl --rows 48 --recipe smollm2-135m-dspark \\
        --before-batch-size 16 --batch-size 16 64 --out /tmp/regen_throughput.json
"""

from __future__ import annotations

import argparse
import hashlib
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from deepspec_train.config.loader import load_recipe_section
from deepspec_train.regenerate.backend import Message
from deepspec_train.regenerate.local_backend import LocalBackend
from deepspec_train.regenerate.sampling import SamplingParams
from deepspec_train.regenerate.settings import SECTION, RegenerateConfig


@dataclass
class Measurement:
    method: str
    batch_size: int
    answers: int
    answer_tokens: int
    wall_s: float
    cpu_s: float

    @property
    def tokens_per_s(self) -> float:
        return self.answer_tokens / self.wall_s

    @property
    def tokens_per_cpu_s(self) -> float:
        return self.answer_tokens / self.cpu_s


@torch.no_grad()
def generate_in_batches(
    backend: LocalBackend, conversations: Sequence[Sequence[Message]], sampling: SamplingParams, batch_size: int
) -> int:
    """The "before" backend: length-sorted, left-padded batches through ``model.generate``; returns the answer
    tokens (each answer up to and including its first stop token)."""
    tokenizer = backend.tokenizer
    tokenizer.padding_side = "left"
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    prompts = sorted((backend.render_prompt(c, sampling) for c in conversations),
                     key=lambda p: len(tokenizer(p, add_special_tokens=False)["input_ids"]))
    stops, tokens = set(backend.eos_token_ids), 0
    for start in range(0, len(prompts), batch_size):
        batch = prompts[start : start + batch_size]
        enc = tokenizer(batch, return_tensors="pt", padding=True, add_special_tokens=False).to(backend.device)
        # One seeded stream per batch, as the old backend drew it.
        torch.manual_seed(int.from_bytes(hashlib.sha256(json.dumps([0, batch]).encode()).digest()[:8], "little") >> 1)
        law = {"do_sample": False} if sampling.greedy else {
            "do_sample": True, "temperature": sampling.temperature, "top_p": sampling.top_p, "top_k": sampling.top_k}
        output = backend.model.generate(**enc, max_new_tokens=sampling.max_new_tokens,
                                        eos_token_id=backend.eos_token_ids, pad_token_id=pad_id, **law)
        for row in output[:, enc["input_ids"].shape[1] :].tolist():
            end = next((j for j, token in enumerate(row) if token in stops), None)
            tokens += len(row) if end is None else end + 1
    return tokens


def measure(method: str, batch_size: int, answers: int, run: Callable[[], int]) -> Measurement:
    wall, cpu = time.perf_counter(), time.process_time()
    tokens = run()
    return Measurement(method, batch_size, answers, tokens, time.perf_counter() - wall, time.process_time() - cpu)


def continuous(backend: LocalBackend, conversations: Sequence[Sequence[Message]], sampling: SamplingParams) -> int:
    backend.completion_tokens = 0
    backend.complete(conversations, sampling)
    return backend.completion_tokens


def read_prompts(path: str, rows: int) -> list[list[Message]]:
    """The first ``rows`` prompts of a JSONL prompt set, each cut before its first assistant turn."""
    conversations = []
    with open(path, encoding="utf-8") as handle:
        for line in handle:
            messages = json.loads(line)["messages"]
            first_answer = next((i for i, m in enumerate(messages) if m["role"] == "assistant"), len(messages))
            conversations.append(messages[:first_answer])
            if len(conversations) == rows:
                break
    return conversations


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="artifacts/smollm2/target")
    parser.add_argument("--prompts", default="artifacts/smollm2/prompts/validation.jsonl")
    parser.add_argument("--rows", type=int, default=48)
    parser.add_argument("--recipe", default="smollm2-135m-dspark", help="recipe whose regenerate section samples")
    parser.add_argument("--max-new-tokens", type=int, default=None, help="default: the recipe's")
    parser.add_argument("--before-batch-size", type=int, default=16)
    parser.add_argument("--batch-size", type=int, nargs="+", default=[16, 64], help="continuous batching slots")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--out", default=None, help="JSON file for the measurements")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    sampling = SamplingParams.from_recipe(load_recipe_section(args.recipe, SECTION, RegenerateConfig))
    sampling = sampling.with_overrides(max_new_tokens=args.max_new_tokens)
    conversations = read_prompts(args.prompts, args.rows)
    backend = LocalBackend(args.target)
    runs = []
    for _ in range(args.repeats):
        runs.append(measure("generate", args.before_batch_size, len(conversations),
                            lambda: generate_in_batches(backend, conversations, sampling, args.before_batch_size)))
        for batch_size in args.batch_size:
            backend.batch_size = batch_size
            runs.append(measure("continuous", batch_size, len(conversations),
                                lambda: continuous(backend, conversations, sampling)))
        for run in runs[-1 - len(args.batch_size) :]:
            print(f"{run.method:>10} batch {run.batch_size:>3}: {run.answer_tokens:,} answer tokens in "
                  f"{run.wall_s:.1f} s (CPU {run.cpu_s:.1f} s): {run.tokens_per_s:.1f} tok/s, "
                  f"{run.tokens_per_cpu_s:.1f} tok/CPU-s", flush=True)
    before = [run for run in runs if run.method == "generate"]
    summary = {}
    for batch_size in args.batch_size:
        after = [run for run in runs if run.method == "continuous" and run.batch_size == batch_size]
        ratio = sum(r.tokens_per_cpu_s for r in after) / sum(r.tokens_per_cpu_s for r in before)
        wall_ratio = sum(r.tokens_per_s for r in after) / sum(r.tokens_per_s for r in before)
        summary[f"continuous_{batch_size}_over_generate_{args.before_batch_size}"] = {"cpu": ratio, "wall": wall_ratio}
        print(f"continuous batch {batch_size} / generate batch {args.before_batch_size}: {ratio:.2f}x per CPU second, "
              f"{wall_ratio:.2f}x per wall second")
    if args.out:
        record = {"args": vars(args), "sampling": asdict(sampling), "torch_threads": torch.get_num_threads(),
                  "runs": [{**asdict(run), "tokens_per_s": run.tokens_per_s, "tokens_per_cpu_s": run.tokens_per_cpu_s}
                           for run in runs], "ratios": summary}
        Path(args.out).write_text(json.dumps(record, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
