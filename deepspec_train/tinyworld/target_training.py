"""Train and evaluate the tiny world's target: a small ``Qwen3ForCausalLM`` learned from the corpus.

Training is plain next-token prediction over whole rendered conversations (prompts included: at this scale
the prompts' text is useful language-modelling signal), packed back to back into fixed windows, each
conversation closed by ``<|endoftext|>``. Conversations are rendered with thinking disabled, so the target
learns the empty think block that precedes every answer when it is later asked to regenerate answers.

Evaluation scores exactly the tokens a drafter is trained on (assistant content plus ``<|im_end|>``, from the
project's loss-mask builder) of held-out conversations, next to the unigram entropy of those same tokens.
"""

from __future__ import annotations

import math
import random
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass

import torch
from tqdm import tqdm
from transformers import PreTrainedTokenizerBase, Qwen3Config, Qwen3ForCausalLM

from deepspec_train.data.loss_mask import render_with_loss_mask
from deepspec_train.tinyworld.presets import TinyWorldPreset

# Every conversation of the tiny world is rendered like this, for training, evaluation and regeneration.
CHAT_KWARGS = {"enable_thinking": False}
# RoPE has no learned positions, so the target accepts sequences longer than its training windows.
MAX_POSITION_EMBEDDINGS = 4096
# Training steps timed to plan how many fit in a time cap (``--max-train-seconds``).
_TIMED_STEPS = 4


def target_config(preset: TinyWorldPreset, tokenizer: PreTrainedTokenizerBase) -> Qwen3Config:
    """The Qwen3 architecture of the preset, with the tokenizer's vocabulary and special-token ids."""
    return Qwen3Config(
        vocab_size=len(tokenizer),
        hidden_size=preset.hidden_size,
        num_hidden_layers=preset.num_layers,
        num_attention_heads=preset.num_heads,
        num_key_value_heads=preset.num_kv_heads,
        head_dim=preset.head_dim,
        intermediate_size=preset.intermediate_size,
        max_position_embeddings=MAX_POSITION_EMBEDDINGS,
        rope_theta=10000.0,
        tie_word_embeddings=True,
        bos_token_id=None,
        eos_token_id=[tokenizer.eos_token_id, tokenizer.pad_token_id],
        pad_token_id=tokenizer.pad_token_id,
    )


def render_ids(tokenizer: PreTrainedTokenizerBase, rows: list[dict]) -> list[list[int]]:
    """Token ids of each conversation rendered with the chat template."""
    texts = [tokenizer.apply_chat_template(r["messages"], tokenize=False, **CHAT_KWARGS) for r in rows]
    return tokenizer(texts, add_special_tokens=False)["input_ids"]


def packed_windows(
    conversations: list[list[int]], separator: int, seq_len: int, rng: random.Random
) -> Iterator[list[int]]:
    """Endless ``seq_len``-token windows over the conversations, reshuffled every epoch and joined by
    ``separator``; a window may span a conversation boundary (the separator tells the model where)."""
    buffer: list[int] = []
    order = list(range(len(conversations)))
    while True:
        rng.shuffle(order)
        for i in order:
            buffer.extend(conversations[i])
            buffer.append(separator)
            while len(buffer) >= seq_len:
                yield buffer[:seq_len]
                del buffer[:seq_len]


def lr_at(step: int, total_steps: int, preset: TinyWorldPreset) -> float:
    """Linear warmup, then cosine decay to a tenth of the peak at ``total_steps``."""
    if step < preset.warmup_steps:
        return preset.lr * (step + 1) / preset.warmup_steps
    progress = (step - preset.warmup_steps) / max(1, total_steps - preset.warmup_steps)
    return preset.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, progress))))


def planned_steps(preset: TinyWorldPreset, max_seconds: float | None, seconds_per_step: float) -> int:
    """The preset's steps, or under a time cap as many as fit in it at the measured speed: the learning-rate
    schedule then ends with the training on a slow machine instead of being cut off at a high rate."""
    if max_seconds is None:
        return preset.max_steps
    return max(preset.warmup_steps + 1, min(preset.max_steps, int(max_seconds / seconds_per_step)))


@dataclass
class TrainStats:
    steps: int
    tokens: int
    seconds: float
    tokens_per_s: float
    final_loss: float
    # The preset's steps, and the steps the schedule was laid out for: fewer only under a time cap that the
    # machine's speed cannot fit them in.
    preset_steps: int
    planned_steps: int
    max_train_seconds: float | None
    stopped_by_time: bool


def train_target(
    model: Qwen3ForCausalLM,
    conversations: list[list[int]],
    separator: int,
    preset: TinyWorldPreset,
    seed: int,
    progress: bool = True,
    max_seconds: float | None = None,
) -> TrainStats:
    """Train ``model`` in place for ``preset.max_steps`` steps: the same weights on an idle and a busy machine.

    With ``max_seconds``, only as many steps as fit in it at the speed of the first steps (the result then
    depends on the machine's load, which the stats record)."""
    torch.manual_seed(seed)
    windows = packed_windows(conversations, separator, preset.seq_len, random.Random(f"{seed}-windows"))
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    optimizer = torch.optim.AdamW(
        [{"params": decay, "weight_decay": 0.01}, {"params": no_decay, "weight_decay": 0.0}],
        lr=preset.lr,
        betas=(0.9, 0.95),
        fused=True,  # one pass over all tensors: a quarter faster per step than the per-tensor loop on 2 cores
    )
    model.train()
    start = time.perf_counter()
    tokens, loss_ema, steps = 0, float("nan"), 0
    stopped_by_time = False
    total_steps, first_step_s = preset.max_steps, 0.0
    bar = tqdm(total=total_steps, desc="tinyworld: train target", unit="step", disable=not progress)
    for step in range(preset.max_steps):
        if step >= total_steps:
            break
        elapsed = time.perf_counter() - start
        if max_seconds is not None and elapsed > max_seconds:
            stopped_by_time = True
            break
        if max_seconds is not None and step == _TIMED_STEPS:
            # Step 0 pays one-off allocation costs; steps 1.._TIMED_STEPS-1 give the speed of this machine.
            total_steps = planned_steps(preset, max_seconds, (elapsed - first_step_s) / (_TIMED_STEPS - 1))
            bar.total = total_steps
        batch = torch.tensor([next(windows) for _ in range(preset.batch_size)])
        for group in optimizer.param_groups:
            group["lr"] = lr_at(step, total_steps, preset)
        loss = model(input_ids=batch, labels=batch).loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        steps += 1
        if step == 0:
            first_step_s = time.perf_counter() - start
        tokens += batch.numel()
        loss_ema = loss.item() if math.isnan(loss_ema) else 0.95 * loss_ema + 0.05 * loss.item()
        bar.update(1)
        bar.set_postfix(loss=f"{loss_ema:.3f}", tok_s=f"{tokens / (time.perf_counter() - start):.0f}")
    bar.close()
    model.eval()
    seconds = time.perf_counter() - start
    return TrainStats(
        steps, tokens, seconds, tokens / max(seconds, 1e-9), loss_ema, preset.max_steps, total_steps, max_seconds,
        stopped_by_time,
    )


def assistant_tokens(
    tokenizer: PreTrainedTokenizerBase, rows: list[dict], max_length: int
) -> list[tuple[list[int], list[int]]]:
    """(ids, loss mask) of each conversation, cut to its first ``max_length`` tokens."""
    encoded = []
    for row in rows:
        ids, mask = render_with_loss_mask(tokenizer, row["messages"], chat_template_kwargs=CHAT_KWARGS)
        encoded.append((ids[:max_length], mask[:max_length]))
    return encoded


@torch.no_grad()
def masked_nll(model: Qwen3ForCausalLM, encoded: list[tuple[list[int], list[int]]]) -> float:
    """Mean negative log-likelihood (nats/token) of the model over the masked tokens of every sequence."""
    total, count = 0.0, 0
    for ids, mask in encoded:
        input_ids = torch.tensor([ids])
        logits = model(input_ids=input_ids).logits[0, :-1].float()
        nll = torch.nn.functional.cross_entropy(logits, input_ids[0, 1:], reduction="none")
        # Token t is predicted from position t-1, so the mask of targets is mask[1:].
        supervised = torch.tensor(mask[1:], dtype=torch.bool)
        total += nll[supervised].sum().item()
        count += int(supervised.sum())
    return total / max(count, 1)


def unigram_entropy(encoded: list[tuple[list[int], list[int]]]) -> float:
    """Entropy (nats) of the empirical distribution of the masked tokens: the loss of the best unigram model
    fitted on these very tokens, a bar that any model using context should clear by far."""
    counts = Counter(t for ids, mask in encoded for t, m in zip(ids, mask) if m)
    n = sum(counts.values())
    return -sum(c / n * math.log(c / n) for c in counts.values()) if n else 0.0
