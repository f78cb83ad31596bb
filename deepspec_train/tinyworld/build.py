"""Build a tiny world into a directory: corpus, tokenizer, trained target, regenerated conversations, suites.

Layout written under ``out``::

    target/                        Qwen3ForCausalLM (safetensors) + tokenizer with the ChatML template
    corpus/train.jsonl             the conversations the target was trained on (original answers)
    corpus/heldout.jsonl           conversations never trained on (original answers; held-out loss)
    corpus/regenerate_{train,validation}_source.jsonl   the prompts handed to the regeneration runner
    conversations/train.jsonl      drafter training set: target-trained prompts, answers by the target
    conversations/validation.jsonl drafter validation set: held-out prompts, answers by the target
    suites/{code,prose,math}.jsonl held-out prompts (``id``, ``category``, ``turns``) for the evaluator
    suites/long.jsonl              long-context suite: those prompts chained into multi-turn conversations that
                                   fill most of the target's positions (``tinyworld.long_suite``)
    build_report.json              timings, parameter count, steps planned and done, held-out losses and
                                   unigram entropies, warnings, config

The build is a function of the preset and the seed: the target trains all of the preset's steps however busy the
machine is, unless the caller caps its time (``max_train_seconds``). Each phase announces itself on one line
(``tinyworld.phases``).

Validation conversations and suite prompts come from disjoint halves of the held-out set, so neither the
target nor a drafter has seen a suite prompt.
"""

from __future__ import annotations

import dataclasses
import json
import platform
import random
import shutil
from collections.abc import Iterable
from pathlib import Path

import torch
from transformers import GenerationConfig, Qwen3ForCausalLM

from deepspec_train.regenerate.local_backend import LocalBackend
from deepspec_train.regenerate.runner import regenerate_file
from deepspec_train.regenerate.sampling import SamplingParams
from deepspec_train.tinyworld.corpus import DOMAINS, build_corpus, split_heldout
from deepspec_train.tinyworld.long_suite import long_suite_rows
from deepspec_train.tinyworld.phases import BuildPhases
from deepspec_train.tinyworld.presets import TinyWorldPreset
from deepspec_train.tinyworld.target_training import (
    TrainStats,
    assistant_tokens,
    masked_nll,
    render_ids,
    target_config,
    train_target,
    unigram_entropy,
)
from deepspec_train.tinyworld.tokenizer_builder import (
    END_OF_TEXT,
    IM_START,
    MASK_TOKEN,
    build_tokenizer,
)

OUTPUT_ENTRIES = ("target", "corpus", "conversations", "suites", "build_report.json")


def write_jsonl(path: Path, rows: Iterable[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as handle:
        handle.writelines(json.dumps(row, ensure_ascii=False) + "\n" for row in rows)


def suite_rows(rows: list[dict]) -> list[dict]:
    """Held-out conversations as evaluator prompts: the user turns only, MT-Bench style."""
    return [
        {"id": r["id"], "category": r["category"], "turns": [m["content"] for m in r["messages"] if m["role"] == "user"]}
        for r in rows
    ]


def balanced_sample(by_domain: dict[str, list[dict]], total: int, rng: random.Random) -> list[dict]:
    """About ``total / len(domains)`` rows of each domain, grouped by domain: a regeneration batch then holds
    prompts of similar lengths and wastes little compute on padding."""
    share = total // len(by_domain)
    return [row for rows in by_domain.values() for row in rng.sample(rows, min(share, len(rows)))]


def clear_outputs(out: Path) -> None:
    """Remove what an earlier build wrote (and only that): the regeneration runner resumes from existing
    output files, which must not happen across builds."""
    for name in OUTPUT_ENTRIES:
        path = out / name
        if path.is_dir():
            shutil.rmtree(path)
        elif path.exists():
            path.unlink()


def format_loss_table(losses: dict[str, float], entropies: dict[str, float]) -> str:
    lines = [f"{'domain':<8} {'held-out loss':>14} {'unigram entropy':>16}   (nats/token, assistant tokens)"]
    lines += [f"{d:<8} {losses[d]:>14.3f} {entropies[d]:>16.3f}" for d in losses]
    return "\n".join(lines)


def loss_warning(losses: dict[str, float], entropies: dict[str, float]) -> str | None:
    """One line naming the domains whose held-out loss is not below their unigram entropy (a target that has not
    learned more than token frequencies there), or None when every domain clears that bar."""
    failing = [f"{d} {losses[d]:.3f} >= {entropies[d]:.3f}" for d in losses if not losses[d] < entropies[d]]
    if not failing:
        return None
    return (f"held-out loss not below the unigram entropy ({', '.join(failing)} nats/token): the target has "
            "learned little beyond token frequencies there")


def time_cap_warning(stats: TrainStats) -> str | None:
    """One line when a time cap stopped the target before the preset's last step (the world then depends on the
    machine's speed and load), else None."""
    if stats.steps >= stats.preset_steps:
        return None
    return (f"--max-train-seconds {stats.max_train_seconds:g} stopped the target after {stats.steps} of its "
            f"{stats.preset_steps} steps: this world depends on the machine's speed and load")


def build_tiny_world(
    out: str | Path,
    preset: TinyWorldPreset,
    seed: int = 0,
    progress: bool = True,
    overwrite: bool = False,
    max_train_seconds: float | None = None,
) -> dict:
    """Build the tiny world of ``preset`` into ``out`` and return the build report (also written to disk).

    ``max_train_seconds`` caps the target's training time; without it the target runs every step of the preset.
    """
    out = Path(out)
    if any((out / name).exists() for name in OUTPUT_ENTRIES):
        if not overwrite:
            raise FileExistsError(f"{out} already holds a tiny world; pass overwrite=True (--force) to rebuild it")
        clear_outputs(out)
    out.mkdir(parents=True, exist_ok=True)
    phases = BuildPhases(total=6, enabled=progress)

    with phases.phase("corpus", f"corpus: {preset.num_code} code, {preset.num_prose} prose and {preset.num_math} "
                                f"math conversations, {preset.heldout_per_domain} per domain held out"):
        corpus = build_corpus(preset.num_code, preset.num_prose, preset.num_math, seed, progress=progress)
        train_by_domain, heldout_by_domain = {}, {}
        for domain in DOMAINS:
            train_by_domain[domain], heldout_by_domain[domain] = split_heldout(
                corpus[domain], preset.heldout_per_domain, seed
            )
        train_rows = [r for d in DOMAINS for r in train_by_domain[d]]
        heldout_rows = [r for d in DOMAINS for r in heldout_by_domain[d]]
        write_jsonl(out / "corpus" / "train.jsonl", train_rows)
        write_jsonl(out / "corpus" / "heldout.jsonl", heldout_rows)

    with phases.phase("tokenizer", f"tokenizer: byte-level BPE of {preset.vocab_size:,} tokens"):
        tokenizer = build_tokenizer(train_rows, preset.vocab_size, progress=progress)

    cap = f", at most {max_train_seconds:g} s (--max-train-seconds)" if max_train_seconds is not None else ""
    with phases.phase("target_training", f"target training: {preset.max_steps} steps of {preset.batch_size} x "
                                         f"{preset.seq_len} tokens{cap}"):
        torch.manual_seed(seed)
        model = Qwen3ForCausalLM(target_config(preset, tokenizer))
        num_parameters = sum(p.numel() for p in model.parameters())
        train_ids = render_ids(tokenizer, train_rows)
        stats = train_target(model, train_ids, tokenizer.pad_token_id, preset, seed, progress, max_train_seconds)

    with phases.phase("evaluation", "held-out loss of the target, next to each domain's unigram entropy"):
        losses, entropies = {}, {}
        for domain in DOMAINS:
            encoded = assistant_tokens(tokenizer, heldout_by_domain[domain], preset.seq_len)
            losses[domain] = masked_nll(model, encoded)
            entropies[domain] = unigram_entropy(encoded)

    target_dir = out / "target"
    with phases.phase("writing", "writing the target, the suites and the regeneration prompts"):
        model.generation_config = GenerationConfig(
            eos_token_id=model.config.eos_token_id, pad_token_id=tokenizer.pad_token_id
        )
        model.save_pretrained(target_dir)
        tokenizer.save_pretrained(target_dir)
        rng = random.Random(f"{seed}-regenerate")
        validation_by_domain = {d: rows[: len(rows) // 2] for d, rows in heldout_by_domain.items()}
        suite_pool = []
        for domain, rows in heldout_by_domain.items():
            write_jsonl(out / "suites" / f"{domain}.jsonl", suite_rows(rows[len(rows) // 2 :]))
            suite_pool.extend(rows[len(rows) // 2 :])
        long_rows = long_suite_rows(suite_pool, tokenizer, preset.long_suite_prompts, seed)
        write_jsonl(out / "suites" / "long.jsonl", long_rows)
        sources = {
            "train": balanced_sample(train_by_domain, preset.regen_train, rng),
            "validation": balanced_sample(validation_by_domain, preset.regen_validation, rng),
        }
        for split, rows in sources.items():
            write_jsonl(out / "corpus" / f"regenerate_{split}_source.jsonl", rows)

    with phases.phase("regeneration", f"drafter data: the target answers {len(sources['train'])} train and "
                                      f"{len(sources['validation'])} validation prompts"):
        regeneration = regenerate_sources(out, target_dir, sources, preset, seed, progress)
    timings = phases.finish()

    warnings = [line for line in (time_cap_warning(stats), loss_warning(losses, entropies)) if line]
    report = {
        "preset": dataclasses.asdict(preset),
        "seed": seed,
        "python_version": platform.python_version(),
        "torch_threads": torch.get_num_threads(),
        "corpus_conversations": {d: len(corpus[d]) for d in DOMAINS},
        "heldout_per_domain": {d: len(heldout_by_domain[d]) for d in DOMAINS},
        "vocab_size": len(tokenizer),
        "special_token_ids": {
            t: tokenizer.convert_tokens_to_ids(t) for t in (END_OF_TEXT, IM_START, tokenizer.eos_token, MASK_TOKEN)
        },
        "mask_token_id": tokenizer.mask_token_id,
        "num_parameters": num_parameters,
        "training": dataclasses.asdict(stats),
        "heldout_loss": losses,
        "unigram_entropy": entropies,
        "regenerated_conversations": regeneration,
        "regeneration_sampling": dataclasses.asdict(regeneration_sampling(preset)),
        "timings": timings,
        "warnings": warnings,
    }
    (out / "build_report.json").write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    return report


def regeneration_sampling(preset: TinyWorldPreset) -> SamplingParams:
    """How the target samples the drafters' answers."""
    return SamplingParams(
        temperature=preset.regen_temperature,
        top_p=preset.regen_top_p,
        top_k=preset.regen_top_k,
        max_new_tokens=preset.regen_max_new_tokens,
        enable_thinking=False,
    )


def regenerate_sources(
    out: Path, target_dir: Path, sources: dict[str, list[dict]], preset: TinyWorldPreset, seed: int, progress: bool
) -> dict[str, int]:
    """Answer each split's prompts (``corpus/regenerate_<split>_source.jsonl``) with the trained target into
    ``conversations/<split>.jsonl``; returns the conversations written per split."""
    backend = LocalBackend(str(target_dir), batch_size=preset.regen_batch_size, seed=seed)
    sampling = regeneration_sampling(preset)
    regeneration = {}
    for split in sources:
        source_path = out / "corpus" / f"regenerate_{split}_source.jsonl"
        summary = regenerate_file(
            str(source_path), str(out / "conversations" / f"{split}.jsonl"), backend, sampling, progress=progress
        )
        if summary.failed or summary.bad_rows:
            raise RuntimeError(f"regenerating the {split} conversations: {summary.format()}")
        regeneration[split] = summary.done
    return regeneration
