"""How much of the target's law a top-K candidate drafter can ever reach: the candidate ceiling.

A DFlash2 drafter (``deepspec_train/models/dflash2_drafter.py``, ``dflash2_drafting.py``) proposes each drafted
token only among the top-K tokens of its head's logits (``K = selector_top_k``): the proposal is
``q = softmax(scores / T)`` over those K candidates (``scores`` = the unary logits plus the selector's low-rank
pairwise term) and zero on every other token. Exact speculative sampling accepts a slot with probability
``sum_v min(q[v], p_t[v])``, and since ``q`` is zero outside the candidates that sum is at most ``p_t``'s mass
on them -- at most the target's own top-K mass. At ``T = 0`` the target's law is a point mass and the cap is 1
(when the argmax is a candidate); at ``T > 0`` it is whatever the target spreads over its K best tokens, which
is small for a flat target: the tiny world's test target puts about 0.30 of its T = 1 law on its top 8 tokens of
its own answers, SmolLM2-135M-Instruct about 0.95. A full-vocabulary head (DFlash) has no such cap.

This bench measures both sides of that rule on real answers:

1. the target's top-k mass ``sum of the k largest probabilities of softmax(logits / T)`` at every position that
   predicts a token of a conversation's last assistant turn, averaged over answer tokens, with a 95% bootstrap
   interval over conversations;
2. for each ``--drafter``, at every ``stride``-th answer position ``a`` (the anchor), the first drafted slot's
   acceptance against the target's law ``p_t`` for token ``a + 1``: ``head`` (the full-vocabulary proposal
   ``softmax(lm_head(h) / T)``; for a kind without a selector, its own first-slot proposal), and for DFlash2
   ``ceiling`` (``p_t``'s mass on the selector's K candidates) and ``selector`` (the acceptance of the proposal
   the drafter really drafts from). ``selector <= ceiling`` always.

    python bench/candidate_ceiling.py --target artifacts/tinyworld/target \\
        --data artifacts/tinyworld/conversations/validation.jsonl --conversations 16 \\
        --drafter runs/quality/groups/tiny-dflash2-seed0 runs/quality/groups/tiny-dflash-seed0 --out ceiling.md

Data lines are JSON objects with a ``messages`` list (role / content) whose last message is the assistant's
answer. Runs on one CPU thread.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn, Optional

import numpy as np
import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from deepspec_train.evaluation.paired_bootstrap import RatioEstimate, bootstrap_mean  # noqa: E402
from deepspec_train.models.block_drafting import DraftContext  # noqa: E402
from deepspec_train.models.dflash2_drafter import DFlash2Drafter  # noqa: E402
from deepspec_train.models.dflash2_drafting import selector_lattice  # noqa: E402
from deepspec_train.target.hidden_states import TargetTap  # noqa: E402

BOOTSTRAP_REPLICATES = 2000
BOOTSTRAP_SEED = 0
DEFAULT_TOP_K = (1, 8, 32, 64)


# --- the target's top-k mass ---------------------------------------------------------------------------------


def top_k_mass(logits: torch.Tensor, temperature: float, ks: Sequence[int]) -> dict[int, torch.Tensor]:
    """For each ``k`` in ``ks``: per row of ``logits [N, V]``, the sum of the ``k`` largest probabilities of
    ``softmax(logits / T)`` (fp64, ``[N]``). At ``T == 0`` the law is the argmax's point mass: every ``k`` gives 1."""
    vocab = logits.shape[-1]
    for k in ks:
        if not 1 <= k <= vocab:
            raise ValueError(f"top-k {k} out of range: k must be in 1..{vocab} (the vocabulary size)")
    if temperature < 0:
        raise ValueError(f"temperature {temperature} is negative")
    if temperature == 0:
        return {k: torch.ones(logits.shape[0], dtype=torch.float64) for k in ks}
    probs = torch.softmax(logits.double() / temperature, dim=-1)
    # One sort up to the largest k serves every k: the top-k mass is the cumulative sum at k - 1.
    cumulative = torch.cumsum(probs.topk(max(ks), dim=-1).values, dim=-1)
    return {k: cumulative[:, k - 1] for k in ks}


# --- a conversation's answer ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Answer:
    """The token ids ``[P + n]`` of a rendered conversation up to its last kept answer token; the answer (the
    last assistant turn, at most ``max_tokens`` of it) starts at position ``start = P``."""

    ids: torch.Tensor
    start: int

    @property
    def length(self) -> int:
        return int(self.ids.numel()) - self.start


def answer_tokens(tokenizer, messages: list[dict], max_tokens: int) -> Answer:
    """Render ``messages`` with the chat template and locate the last assistant turn: it is what the full
    rendering adds to the rendering of the earlier turns with the generation prompt."""
    if not messages or messages[-1].get("role") != "assistant":
        raise ValueError("the conversation's last message is not an assistant turn: there is no answer to score")
    if max_tokens < 1:
        raise ValueError(f"max_tokens {max_tokens} < 1")
    full = tokenizer.apply_chat_template(messages, tokenize=False)
    prefix = tokenizer.apply_chat_template(messages[:-1], tokenize=False, add_generation_prompt=True)
    ids = tokenizer(full, add_special_tokens=False)["input_ids"]
    prefix_ids = tokenizer(prefix, add_special_tokens=False)["input_ids"]
    # A template that rewrites earlier turns (or a merge across the boundary) would misplace the answer.
    if ids[: len(prefix_ids)] != prefix_ids:
        raise ValueError("the chat template's rendering of the earlier turns is not a prefix of the full rendering")
    start = len(prefix_ids)
    end = min(len(ids), start + max_tokens)
    return Answer(torch.tensor(ids[:end], dtype=torch.long), start)


@torch.no_grad()
def logits_of(target, answer: Answer) -> torch.Tensor:
    """The target's logits ``[n, V]`` (fp32) at positions ``P-1 .. P+n-2``: those that predict the answer."""
    if answer.length == 0:
        return torch.zeros(0, target.config.vocab_size)
    # The last answer token predicts nothing we score, so it is left out of the forward.
    out = target(input_ids=answer.ids[None, :-1], logits_to_keep=answer.length)
    return out.logits[0].float()


def answer_logits(target, tokenizer, messages: list[dict], max_tokens: int) -> torch.Tensor:
    """The target's logits ``[n, V]`` at the positions that predict the tokens of the conversation's last
    assistant turn (at most ``max_tokens`` of them)."""
    return logits_of(target, answer_tokens(tokenizer, messages, max_tokens))


# --- the first drafted slot ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class FirstSlot:
    """Acceptance of one first drafted slot against the target's law: ``head`` for the full-vocabulary proposal,
    ``ceiling`` (``p_t``'s mass on the selector's candidates) and ``selector`` (the proposal DFlash2 drafts from);
    the last two are None for a drafter without a selector."""

    head: float
    ceiling: Optional[float] = None
    selector: Optional[float] = None


def overlap(q: torch.Tensor, p: torch.Tensor) -> float:
    """``sum_v min(q[v], p[v])``: the probability that exact speculative sampling accepts a draft from ``q``."""
    return float(torch.minimum(q.double(), p.double()).sum())


def check_temperature(temperature: float) -> None:
    # At T = 0 both laws are point masses and acceptance is argmax agreement: not what this part measures.
    if temperature <= 0:
        raise ValueError(f"first-slot acceptance needs temperature > 0, got {temperature}")


@torch.no_grad()
def slot_acceptance(module: DFlash2Drafter, hidden: torch.Tensor, predecessor: int, target_probs: torch.Tensor,
                    temperature: float) -> FirstSlot:
    """The three acceptances of a DFlash2 slot with state ``hidden [d]`` drafted after token ``predecessor``,
    against ``target_probs [V]``."""
    check_temperature(temperature)
    p = target_probs.double()
    head = torch.softmax(module.lm_head(hidden).double() / temperature, dim=-1)
    # The lattice of one slot: its K candidates and the scores of each after the predecessor (row 0: for the
    # first drafted slot every predecessor row is the anchor).
    ids, scores = selector_lattice(module, hidden.reshape(1, 1, -1), torch.tensor([predecessor]))
    candidates = ids[0, 0]
    q = torch.softmax(scores[0, 0, 0].double() / temperature, dim=-1)
    return FirstSlot(head=overlap(head, p), ceiling=float(p[candidates].sum()),
                     selector=overlap(q, p[candidates]))


@torch.no_grad()
def first_slot_acceptance(loaded, target_features: torch.Tensor, ids: torch.Tensor, anchor: int,
                          target_probs: torch.Tensor, temperature: float,
                          cache: Optional[dict] = None) -> FirstSlot:
    """The first drafted slot at anchor position ``anchor`` (context: ``target_features [>= anchor, F]`` and
    ``ids`` of the positions before it; anchor token ``ids[anchor]``) against ``target_probs [V]``, the target's
    law for token ``anchor + 1``. ``cache``: a dict kept across the anchors of one conversation, in increasing
    order, so each anchor projects only the context rows it adds."""
    check_temperature(temperature)
    drafter = loaded.block_drafter()
    context = DraftContext(target_features[:anchor], ids[:anchor], cache)
    anchor_ids = ids[anchor : anchor + 1]
    if isinstance(loaded.module, DFlash2Drafter):
        states = drafter._block_states(context, anchor_ids)
        return slot_acceptance(loaded.module, states[0, drafter.slot_offset], int(ids[anchor]), target_probs,
                               temperature)
    # No selector: the kind's own first-slot proposal (DFlash: softmax(lm_head(h) / T) over the vocabulary).
    # The sampled token is not used, so the generator's seed does not matter.
    draft = drafter.draft(context, anchor_ids, 1, temperature, torch.Generator().manual_seed(0))
    return FirstSlot(head=overlap(draft.probs[0, 0], target_probs))


# --- means over conversations --------------------------------------------------------------------------------


def interval(estimate: RatioEstimate) -> str:
    """``value [low, high]`` of a mean and its 95% interval."""
    return f"{estimate.value:.3f} [{estimate.low:.3f}, {estimate.high:.3f}]"


@dataclass
class Tally:
    """Per-conversation values of named quantities (the bootstrap resamples conversations, token-weighted:
    ``evaluation.paired_bootstrap.bootstrap_mean``)."""

    values: dict[str, list[np.ndarray]] = field(default_factory=dict)
    counts: list[int] = field(default_factory=list)

    def add(self, values: dict[str, torch.Tensor | list[float]], rows: int) -> None:
        for name, column in values.items():
            array = np.asarray(column, dtype=np.float64) if isinstance(column, list) else column.double().numpy()
            self.values.setdefault(name, []).append(array)
        self.counts.append(rows)

    @property
    def rows(self) -> int:
        return sum(self.counts)

    def estimate(self, name: str) -> RatioEstimate:
        return bootstrap_mean(self.values[name], BOOTSTRAP_REPLICATES, BOOTSTRAP_SEED)


# --- the command line ----------------------------------------------------------------------------------------


@dataclass
class BenchDrafter:
    """A loaded drafter, its name in the table and the first-slot tally of its rows."""

    name: str
    loaded: Any
    tally: Tally = field(default_factory=Tally)

    @property
    def has_selector(self) -> bool:
        return isinstance(self.loaded.module, DFlash2Drafter)


def parse_args(argv: Optional[Sequence[str]]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", required=True, help="the target's directory (config.json, weights, tokenizer)")
    parser.add_argument("--data", required=True, help="JSONL of conversations (a 'messages' list each)")
    parser.add_argument("--conversations", type=int, default=16, help="the first N conversations of --data")
    parser.add_argument("--answer-tokens", type=int, default=256, help="answer tokens kept per conversation")
    parser.add_argument("--top-k", type=int, nargs="+", default=list(DEFAULT_TOP_K))
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--drafter", nargs="*", default=[], help="run or export directories of drafters to score")
    parser.add_argument("--stride", type=int, default=5, help="score the first slot at every stride-th position")
    parser.add_argument("--out", help="also write the tables to this markdown file")
    parser.add_argument("--no-progress", action="store_true")
    args = parser.parse_args(argv)
    for name in ("conversations", "answer_tokens", "stride"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1")
    if args.temperature < 0:
        parser.error("--temperature must be >= 0")
    return args


def refuse(message: str) -> NoReturn:
    """End on a bad input as the project's commands do: one line on stderr naming it, exit status 2."""
    print(f"error: {message}", file=sys.stderr)
    raise SystemExit(2)


def read_conversations(path: Path, limit: int) -> list[tuple[int, list[dict]]]:
    """(line number, ``messages``) of the first ``limit`` conversations of ``path``; a one-line refusal naming
    a bad line."""
    conversations = []
    with path.open() as lines:
        for number, line in enumerate(lines, start=1):
            if len(conversations) == limit:
                break
            if not line.strip():
                continue
            try:
                messages = json.loads(line)["messages"]
            except (json.JSONDecodeError, KeyError, TypeError) as err:
                refuse(f"--data {path}:{number}: not a JSON object with a 'messages' list ({err})")
            conversations.append((number, messages))
    if not conversations:
        refuse(f"--data {path}: no conversations")
    return conversations


def check_inputs(args: argparse.Namespace) -> tuple[Path, Path]:
    target, data = Path(args.target), Path(args.data)
    if not (target / "config.json").is_file():
        refuse(f"--target {target}: no config.json (not a target model directory)")
    if not data.is_file():
        refuse(f"--data {data}: no such data file")
    if args.drafter and args.temperature <= 0:
        refuse("--drafter needs --temperature > 0: first-slot acceptance at T = 0 is argmax agreement")
    return target, data


def score_drafters(drafters: list[BenchDrafter], target, answer: Answer, logits: torch.Tensor,
                   temperature: float, stride: int) -> None:
    """Tally every drafter's first slots at every ``stride``-th answer position of one conversation."""
    features_of: dict[tuple[int, ...], torch.Tensor] = {}
    # Anchor positions P-1, P-1+stride, ...: the slot after each predicts an answer token, whose law is a row of
    # ``logits``. Features of positions < P+n-2 are the most any anchor's context needs.
    rows = range(0, answer.length, stride)
    laws = [torch.softmax(logits[j].double() / temperature, dim=-1) for j in rows]
    for bench in drafters:
        layers = tuple(bench.loaded.target_layer_ids)
        if layers not in features_of:
            features_of[layers] = TargetTap(target, list(layers))(answer.ids[None, :-1]).ctx_features[0].float()
        cache: dict = {}
        slots = [first_slot_acceptance(bench.loaded, features_of[layers], answer.ids, answer.start - 1 + j, p,
                                       temperature, cache) for j, p in zip(rows, laws)]
        values = {"head": [s.head for s in slots]}
        if bench.has_selector:
            values |= {"ceiling": [s.ceiling for s in slots], "selector": [s.selector for s in slots]}
        bench.tally.add(values, len(slots))


def mass_table(tally: Tally, ks: Sequence[int]) -> list[str]:
    lines = ["| k | mean top-k mass of the target's law | 95% CI (bootstrap over conversations) |",
             "|---:|---:|---:|"]
    for k in ks:
        estimate = tally.estimate(f"top{k}")
        lines.append(f"| {k} | {estimate.value:.3f} | [{estimate.low:.3f}, {estimate.high:.3f}] |")
    return lines


def drafter_table(drafters: list[BenchDrafter]) -> list[str]:
    lines = ["| drafter | kind | K | rows | head | ceiling | selector |", "|---|---|---:|---:|---:|---:|---:|"]
    for bench in drafters:
        tally = bench.tally
        top_k = str(bench.loaded.module.selector_top_k) if bench.has_selector else "-"
        cells = [interval(tally.estimate(name)) if name in tally.values else "-" for name in ("head", "ceiling", "selector")]
        lines.append(f"| {bench.name} | {bench.loaded.kind} | {top_k} | {tally.rows} | {' | '.join(cells)} |")
    return lines


def render(args: argparse.Namespace, conversations: int, masses: Tally, drafters: list[BenchDrafter]) -> str:
    lines = [f"# Candidate ceiling: {args.target}", "",
             f"{conversations} conversations of {args.data}, {masses.rows} answer tokens (at most "
             f"{args.answer_tokens} each), T = {args.temperature:g}; intervals: {BOOTSTRAP_REPLICATES} bootstrap "
             "replicates over conversations, token-weighted.", "", *mass_table(masses, args.top_k)]
    if drafters:
        lines += ["", f"## First drafted slot, every {args.stride}th answer position", "",
                  "Mean acceptance sum_v min(q, p_t) against the target's law p_t: head = full-vocabulary proposal "
                  "softmax(lm_head(h) / T) (a kind without a selector: its own first-slot proposal); ceiling = "
                  "p_t's mass on the selector's K candidates; selector = the proposal DFlash2 drafts from.", "",
                  *drafter_table(drafters)]
    return "\n".join(lines) + "\n"


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    target_dir, data = check_inputs(args)
    # Tiny forwards gain nothing from more threads, and this machine is shared.
    torch.set_num_threads(1)
    from tqdm import tqdm
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    from deepspec_train.formats.drafter_loader import load_exported_drafter

    if args.no_progress:
        hf_logging.disable_progress_bar()  # transformers' weight-loading bar too
    conversations = read_conversations(data, args.conversations)
    target = AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.float32).eval().requires_grad_(False)
    tokenizer = AutoTokenizer.from_pretrained(target_dir)
    vocab = target.config.vocab_size
    if any(not 1 <= k <= vocab for k in args.top_k):
        refuse(f"--top-k values must be in 1..{vocab} (the target's vocabulary)")
    drafters = [BenchDrafter(Path(d).name, load_exported_drafter(d, str(target_dir))) for d in args.drafter]
    masses = Tally()
    for number, messages in tqdm(conversations, desc="conversations", disable=args.no_progress):
        try:
            answer = answer_tokens(tokenizer, messages, args.answer_tokens)
        except ValueError as err:
            refuse(f"--data {data}:{number}: {err}")
        logits = logits_of(target, answer)
        masses.add({f"top{k}": mass for k, mass in top_k_mass(logits, args.temperature, args.top_k).items()},
                   answer.length)
        score_drafters(drafters, target, answer, logits, args.temperature, args.stride)
    text = render(args, len(conversations), masses, drafters)
    print(text, end="")
    if args.out:
        Path(args.out).write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
