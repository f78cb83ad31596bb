"""Does training on long sequences keep a drafter's acceptance up deep into a context? Two drafters trained alike
but on conversations of different lengths, compared by tau per position bucket on the tiny world's long suite.

    python bench/long_context_acceptance.py --tinyworld artifacts/tinyworld --out runs/long_context
    python bench/long_context_acceptance.py --tinyworld W --out OUT --prompts 400 --steps 80 --seeds 2   # reduced

1. Data, from the world and its target only: ``--prompts`` prompts of the target's own training corpus
   (``corpus/train.jsonl``: never a suite or validation prompt) that fit a short conversation are chained, in one
   seeded order, into multi-turn conversations of at most ``--short-length`` tokens (a bound that counts each
   turn's rendered prompt plus ``--answer-tokens``, the longest answer regeneration may write). The target writes
   every assistant turn (``deepspec regenerate`` with ``multi_turn="all"``: each answer sampled at T = 1 after its
   own earlier answers); a conversation is cut before its first answer a training row cannot hold (the tiny
   target sometimes ends a turn at once, or writes template markup). The long set joins consecutive short
   conversations into multi-turn ones of at most ``--long-length`` rendered tokens: the same prompts, answers and
   tokens, only how many share one context differs (the target's features and distributions, the drafter's
   supervision, are computed over the whole joined context). Validation conversations are built the same way
   from the world's validation prompts.
2. Training: the same recipe (default ``tiny-dspark``), the same steps, sequences per step, anchors per sequence
   and seed, with ``data.max_length`` = ``--short-length`` for the ``short`` drafter and ``--long-length`` for the
   ``long`` one.
3. Evaluation: ``deepspec eval`` with both drafters (``short`` the baseline) on ``tinyworld:long`` (multi-turn
   conversations of held-out suite prompts that fill most of the target's 4,096 positions), at T = 1 over
   ``--seeds`` seeds and at T = 0. It writes the comparison (``OUT/eval/table1.{md,json}``, plots); this script
   prints tau per bucket of the conversation position (the axis the long suite exercises: the tiny target's
   answers are all shorter than 1K tokens) with the paired ratio long / short, and writes ``OUT/long_context.json``.

Nothing is tuned on the long suite: lengths, steps and recipe are set before it is decoded.
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from transformers import AutoTokenizer  # noqa: E402

from deepspec_train.data.conversations import BadRow, normalize_conversation  # noqa: E402
from deepspec_train.data.loss_mask import TemplateNotPrefixStableError, render_with_loss_mask  # noqa: E402
from deepspec_train.regenerate.local_backend import LocalBackend  # noqa: E402
from deepspec_train.regenerate.runner import regenerate_file  # noqa: E402
from deepspec_train.regenerate.sampling import SamplingParams  # noqa: E402
from deepspec_train.tinyworld.target_training import CHAT_KWARGS  # noqa: E402

# The test world's target has 2 decoder layers (taps from layer 0 only); the small one taps [1, 3] like the recipes.
LAYER_IDS = {"test": "[0]"}


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tinyworld", default="artifacts/tinyworld")
    p.add_argument("--out", default="runs/long_context")
    p.add_argument("--recipe", default="tiny-dspark")
    p.add_argument("--prompts", type=int, default=960, help="training-corpus prompts chained into conversations")
    p.add_argument("--answer-tokens", type=int, default=160, help="longest regenerated answer per turn")
    p.add_argument("--short-length", type=int, default=512, help="data.max_length of the short drafter")
    p.add_argument("--long-length", type=int, default=4096, help="data.max_length of the long drafter")
    p.add_argument("--steps", type=int, default=600, help="training steps of each drafter")
    p.add_argument("--seeds", type=int, default=4, help="sampling seeds at T = 1")
    p.add_argument("--eval-tokens", type=int, default=256, help="new tokens per answer when decoding the suite")
    return p.parse_args(argv)


def user_turns(path: Path, limit: int | None) -> list[str]:
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    return [next(m["content"] for m in r["messages"] if m["role"] == "user") for r in rows][:limit]


def turn_cost(tokenizer, prompt: str, answer_tokens: int) -> int:
    """Tokens one turn can take: its rendered prompt and answer template plus the longest answer."""
    messages = [{"role": "user", "content": prompt}, {"role": "assistant", "content": ""}]
    text = tokenizer.apply_chat_template(messages, tokenize=False, **CHAT_KWARGS)
    return len(tokenizer(text, add_special_tokens=False)["input_ids"]) + answer_tokens


def chain(prompts: list[tuple[str, int]], limit: int, prefix: str) -> list[dict]:
    """Consecutive ``(prompt, cost)`` pairs as multi-turn conversations whose summed cost stays within ``limit``
    (every cost is at most ``limit``). Assistant turns are placeholders that the regeneration replaces."""
    rows, messages, used = [], [], 0
    for prompt, cost in prompts:
        if used + cost > limit:
            rows.append(messages)
            messages, used = [], 0
        messages = messages + [{"role": "user", "content": prompt}, {"role": "assistant", "content": ""}]
        used += cost
    if messages:
        rows.append(messages)
    return [{"id": f"{prefix}-{i:04d}", "category": "chained", "messages": m} for i, m in enumerate(rows)]


def usable_prefix(tokenizer, messages: list[dict]) -> list[dict]:
    """The conversation up to the turn before its first answer a training row cannot hold (an empty answer, or
    one whose text does not render back to its tokens): later answers were written after it, so they go too."""
    kept: list[dict] = []
    for end in range(2, len(messages) + 1, 2):
        try:
            normalized = normalize_conversation({"messages": messages[:end]}, "regenerated")
            render_with_loss_mask(tokenizer, normalized, None, CHAT_KWARGS)
        except (BadRow, TemplateNotPrefixStableError):
            break
        kept = messages[:end]
    return kept


def regenerate(rows: list[dict], out: Path, world: Path, args: argparse.Namespace) -> tuple[Path, dict[str, int]]:
    """Every assistant turn of ``rows`` written by the target at T = 1, turn by turn, each row cut to its usable
    prefix (``usable_prefix``); returns the file and how many conversations and turns it kept."""
    source, raw = out.with_name(out.stem + "_source.jsonl"), out.with_name(out.stem + "_regenerated.jsonl")
    source.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    sampling = SamplingParams(temperature=1.0, top_p=1.0, top_k=0, max_new_tokens=args.answer_tokens,
                              enable_thinking=False)
    backend = LocalBackend(str(world / "target"), batch_size=32, seed=0)
    summary = regenerate_file(str(source), str(raw), backend, sampling, progress=False, multi_turn="all")
    if summary.failed or summary.bad_rows:
        raise SystemExit(f"regenerating {out}: {summary.format()}")
    tokenizer = AutoTokenizer.from_pretrained(world / "target")
    kept = []
    for line in raw.read_text(encoding="utf-8").splitlines():
        row = json.loads(line)
        messages = usable_prefix(tokenizer, row["messages"])
        if messages:
            kept.append({**row, "messages": messages})
    out.write_text("".join(json.dumps(r) + "\n" for r in kept), encoding="utf-8")
    return out, {"conversations": len(kept), "turns": sum(len(r["messages"]) // 2 for r in kept)}


def rendered_tokens(tokenizer, messages: list[dict]) -> int:
    text = tokenizer.apply_chat_template(messages, tokenize=False, **CHAT_KWARGS)
    return len(tokenizer(text, add_special_tokens=False)["input_ids"])


def concatenate(rows: list[dict], tokenizer, limit: int, prefix: str) -> list[dict]:
    """Consecutive conversations joined into multi-turn ones of at most ``limit`` rendered tokens."""
    joined: list[list[dict]] = []
    for row in rows:
        if joined and rendered_tokens(tokenizer, joined[-1] + row["messages"]) <= limit:
            joined[-1] = joined[-1] + row["messages"]
        else:
            joined.append(list(row["messages"]))
    return [{"id": f"{prefix}-{i:04d}", "category": "chained", "messages": m} for i, m in enumerate(joined)]


def build_data(world: Path, out: Path, args: argparse.Namespace) -> dict[str, dict[str, Path]]:
    """Both drafters' train / validation conversations: the short ones regenerated by the target, the long ones
    the same conversations joined, so the two sets hold the same prompts, answers and tokens."""
    tokenizer = AutoTokenizer.from_pretrained(world / "target")
    train = user_turns(world / "corpus" / "train.jsonl", None)
    random.Random("long-context-bench").shuffle(train)
    splits = {}
    for split, prompts in (("train", train), ("validation", user_turns(world / "conversations" / "validation.jsonl",
                                                                        None))):
        costed = [(p, turn_cost(tokenizer, p, args.answer_tokens)) for p in prompts]
        splits[split] = [(p, c) for p, c in costed if c <= args.short_length]
    splits["train"] = splits["train"][: args.prompts]
    data: dict[str, dict[str, Path]] = {"short": {}, "long": {}}
    for split, prompts in splits.items():
        rows = chain(prompts, args.short_length, f"short-{split}")
        short, kept = regenerate(rows, out / "data" / f"short_{split}.jsonl", world, args)
        regenerated = [json.loads(line) for line in short.read_text(encoding="utf-8").splitlines()]
        joined = concatenate(regenerated, tokenizer, args.long_length, f"long-{split}")
        data["short"][split], data["long"][split] = short, out / "data" / f"long_{split}.jsonl"
        data["long"][split].write_text("".join(json.dumps(r) + "\n" for r in joined), encoding="utf-8")
        print(f"data {split}: {len(prompts)} prompts in {len(rows)} short conversations; kept "
              f"{kept['conversations']} ({kept['turns']} turns), joined into {len(joined)} long ones", flush=True)
    return data


def run(command: list[str]) -> float:
    print("run:", " ".join(command[1:]), flush=True)
    start = time.time()
    subprocess.run(command, check=True, cwd=REPO)
    return time.time() - start


def train(name: str, files: dict[str, Path], world: Path, out: Path, args: argparse.Namespace) -> float:
    report = json.loads((world / "build_report.json").read_text())
    taps = LAYER_IDS.get(report["preset"]["name"])
    return run([
        sys.executable, str(REPO / "train.py"), f"recipe={args.recipe}", f"target.path={world / 'target'}",
        *([f"target.layer_ids={taps}"] if taps else []), f"drafter.mask_token_id={report['mask_token_id']}",
        f"data.train=[{files['train']}]", f"data.validation=[{files['validation']}]",
        f"data.max_length={args.short_length if name == 'short' else args.long_length}",
        f"data.cache_dir={out / 'cache'}", f"run.output_dir={out / name}", "run.overwrite=true",
        f"train.max_steps={args.steps}", f"train.eval_every={args.steps}", f"train.checkpoint_every={args.steps}",
        "logging.wandb=false", "logging.progress=false",
    ])


def bucket_lines(table: dict) -> list[str]:
    lines = [f"T = {table['temperature']:g} (seeds {table['seeds']}), tau by conversation position:"]
    for suite in table["suites"]:
        by_drafter = table["tau_by_position"]["context"]
        for d in table["drafters"]:
            cells = [f"{b['bucket']} {b['tau']:.3f} [{b['interval']['low']:.3f}, {b['interval']['high']:.3f}] "
                     f"({b['rounds']} rounds)" for b in by_drafter[d][suite] if b["tau"] is not None and b["interval"]]
            lines.append(f"  {suite} {d}: " + "; ".join(cells))
        ratios = [f"{b['bucket']} {b['ratio']['value']:.3f} [{b['ratio']['low']:.3f}, {b['ratio']['high']:.3f}]"
                  for b in by_drafter["long"][suite] if b["ratio"]]
        lines.append(f"  {suite} long / short: " + "; ".join(ratios))
    return lines


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    world, out = Path(args.tinyworld).resolve(), Path(args.out).resolve()
    if not (world / "suites" / "long.jsonl").is_file():
        raise SystemExit(f"{world}: no tiny world with a long suite "
                         f"(build one: deepspec tinyworld build --out {world})")
    (out / "data").mkdir(parents=True, exist_ok=True)
    start = time.time()
    data = build_data(world, out, args)
    seconds = {"data_s": time.time() - start}
    for name in ("short", "long"):
        seconds[f"train_{name}_s"] = train(name, data[name], world, out, args)
    seconds["eval_s"] = run([
        sys.executable, "-m", "deepspec_train.commands.dispatch", "eval", "--target", str(world / "target"),
        "--tinyworld", str(world), "--suite", "tinyworld:long", "--drafter", f"short={out / 'short' / 'drafter'}",
        "--drafter", f"long={out / 'long' / 'drafter'}", "--baseline", "short", "--temperature", "1", "0",
        "--seed", *map(str, range(args.seeds)), "--max-new-tokens", str(args.eval_tokens), "--out",
        str(out / "eval"), "--no-progress",
    ])
    tables = json.loads((out / "eval" / "table1.json").read_text())["tables"]
    lines = [line for table in tables for line in bucket_lines(table)]
    print("\n".join(lines))
    (out / "long_context.json").write_text(json.dumps({"settings": vars(args), "seconds": seconds,
                                                       "tables": tables}, indent=2))
    print(f"seconds: {json.dumps({k: round(v) for k, v in seconds.items()})}; wrote {out / 'long_context.json'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
