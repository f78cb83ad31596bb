"""Measure ``SPS(B)``: target verification steps per second when one step scores ``B`` new tokens.

A verification step is one target forward over ``B`` new tokens spread over several requests, each request
already holding a KV cache of ``context_len`` tokens, producing the logits of every new token (verification
needs all of them). Requests verify up to ``max_tokens_per_request`` tokens each (a block of ``K`` drafts plus the
guaranteed position: ``K + 1``), so ``B`` tokens become ``ceil(B / max_tokens_per_request)`` requests of equal
length; when ``B`` does not divide evenly the step runs slightly more tokens, and the measurement records both.

Timing: one prefill per request count builds the cache its batch sizes share (untimed), a few warm-up steps run
(untimed: allocator, kernel selection, lazy initialisation), then ``repeats`` timed steps, interleaved across
the batch sizes of that request count; after every step the cache is cropped back to ``context_len`` so each
step sees the same context. On CUDA the clock is
read after ``torch.cuda.synchronize`` because kernels launch asynchronously. The table keeps the median step time
per batch size (robust to a stray slow step on a shared machine).

``deepspec profile-sps`` (``profile_cli``) runs this and writes the ``SPSTable`` JSON the scheduler reads, and
SGLang's SPS table (``sglang_sps_table``) when the probes are dense.
"""

from __future__ import annotations

import itertools
import math
import statistics
import time
from dataclasses import dataclass
from typing import Sequence

import torch
from transformers import DynamicCache, PreTrainedModel

from deepspec_train.scheduling.sps_table import SPSTable


@dataclass(frozen=True)
class StepShape:
    """How a step of ``B`` tokens is laid out: ``requests`` rows of ``tokens_per_request`` new tokens each."""

    requests: int
    tokens_per_request: int

    @property
    def tokens(self) -> int:
        return self.requests * self.tokens_per_request


@dataclass(frozen=True)
class SPSMeasurement:
    """Timed steps at one batch size; ``shape.tokens`` may exceed ``batch_tokens`` by less than ``requests``."""

    batch_tokens: int
    shape: StepShape
    context_len: int
    step_seconds: list[float]

    @property
    def median_seconds(self) -> float:
        return statistics.median(self.step_seconds)

    @property
    def steps_per_s(self) -> float:
        return 1.0 / self.median_seconds


def step_shape(batch_tokens: int, max_tokens_per_request: int) -> StepShape:
    """The fewest requests that hold ``batch_tokens`` tokens at ``max_tokens_per_request`` each, equally long."""
    if batch_tokens < 1 or max_tokens_per_request < 1:
        raise ValueError(f"need positive sizes, got batch {batch_tokens}, per request {max_tokens_per_request}")
    requests = math.ceil(batch_tokens / max_tokens_per_request)
    return StepShape(requests, math.ceil(batch_tokens / requests))


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def prefilled_cache(model: PreTrainedModel, requests: int, context_len: int, seed: int = 0) -> DynamicCache | None:
    """A KV cache holding ``context_len`` random tokens for each of ``requests`` requests (None without context)."""
    if context_len <= 0:
        return None
    device = next(model.parameters()).device
    generator = torch.Generator().manual_seed(seed)
    context = torch.randint(model.config.vocab_size, (requests, context_len), generator=generator).to(device)
    cache = DynamicCache(config=model.config)
    with torch.inference_mode():
        model(input_ids=context, cache=cache, use_cache=True)
    return cache


class VerificationStep:
    """One batch size's verification step, ready to be timed repeatedly: inputs and prefilled cache are built
    once (untimed); every call runs the step, returns its seconds and crops the cache back to the context.

    Steps with the same number of requests can share one ``cache`` (each crops its own tokens off again)."""

    @torch.inference_mode()
    def __init__(
        self,
        model: PreTrainedModel,
        batch_tokens: int,
        context_len: int,
        max_tokens_per_request: int,
        seed: int = 0,
        cache: DynamicCache | None = None,
    ) -> None:
        if context_len < 0:
            raise ValueError(f"context_len must be non-negative, got {context_len}")
        self.model = model
        self.batch_tokens = batch_tokens
        self.context_len = context_len
        self.shape = step_shape(batch_tokens, max_tokens_per_request)
        self.device = next(model.parameters()).device
        # Token values do not change the cost of a dense forward; random ids only keep the embedding reads honest.
        generator = torch.Generator().manual_seed(seed)
        vocab = model.config.vocab_size
        size = (self.shape.requests, self.shape.tokens_per_request)
        self.new_tokens = torch.randint(vocab, size, generator=generator).to(self.device)
        self.cache = cache if cache is not None else prefilled_cache(model, self.shape.requests, context_len, seed)

    @torch.inference_mode()
    def __call__(self) -> float:
        _synchronize(self.device)
        start = time.perf_counter()
        self.model(input_ids=self.new_tokens, cache=self.cache, use_cache=self.cache is not None)
        _synchronize(self.device)
        elapsed = time.perf_counter() - start
        if self.cache is not None:
            # Drop the step's own tokens so every step verifies against the same context length.
            self.cache.crop(-self.shape.tokens_per_request)
        return elapsed


def measure_batch_size(
    model: PreTrainedModel,
    batch_tokens: int,
    context_len: int,
    repeats: int,
    warmup: int,
    max_tokens_per_request: int,
    seed: int = 0,
) -> SPSMeasurement:
    """Time ``repeats`` verification steps of ``batch_tokens`` tokens (after ``warmup`` untimed ones)."""
    return profile_target(model, [batch_tokens], context_len, repeats, warmup, max_tokens_per_request, seed)[0]


def validated_batch_sizes(batch_sizes: Sequence[int]) -> list[int]:
    """The sizes as ints; refuses an empty, non-positive or not strictly increasing list (the table needs it)."""
    sizes = [int(b) for b in batch_sizes]
    if not sizes or sizes[0] < 1 or any(b <= a for a, b in zip(sizes, sizes[1:])):
        raise ValueError(f"batch sizes must be a non-empty strictly increasing list of positive ints, got {sizes}")
    return sizes


def profile_target(
    model: PreTrainedModel,
    batch_sizes: Sequence[int],
    context_len: int,
    repeats: int = 10,
    warmup: int = 3,
    max_tokens_per_request: int = 8,
    seed: int = 0,
) -> list[SPSMeasurement]:
    """One ``SPSMeasurement`` per batch size (strictly increasing sizes, as the table requires).

    Sizes that spread over the same number of requests share one prefilled cache, and are measured together, one
    group at a time (so dense probes up to 256 tokens at 8 per request hold at most 32 requests' caches: about
    2.4 GB for Qwen3-8B in bf16 with 512 context tokens). Within a group the timed repeats are interleaved
    (repeat 1 of every size, then repeat 2, ...), so a slow spell of a shared machine slows neighbouring sizes
    alike instead of bending one part of the curve.
    """
    if repeats < 1 or warmup < 0:
        raise ValueError(f"need repeats >= 1 and warmup >= 0; got {repeats}, {warmup}")
    sizes = validated_batch_sizes(batch_sizes)
    measurements: list[SPSMeasurement] = []
    for requests, group in itertools.groupby(sizes, key=lambda b: step_shape(b, max_tokens_per_request).requests):
        cache = prefilled_cache(model, requests, context_len, seed)
        steps = [VerificationStep(model, size, context_len, max_tokens_per_request, seed, cache) for size in group]
        for step in steps:
            for _ in range(warmup):
                step()
        seconds: list[list[float]] = [[] for _ in steps]
        for _ in range(repeats):
            for step, timings in zip(steps, seconds):
                timings.append(step())
        measurements += [
            SPSMeasurement(step.batch_tokens, step.shape, context_len, timings) for step, timings in zip(steps, seconds)
        ]
        del steps, cache
    return measurements


def monotone_speeds(speeds: Sequence[float]) -> list[float]:
    """Raise each speed to the best one measured at any larger batch size.

    A step of ``B`` tokens can always be run as a larger step with padding, so the true ``SPS(B)`` is at least
    the speed measured at any ``B' > B``; a measured dip below that is timing noise, and an increasing stretch
    would make the scheduler's early stop inexact (it assumes a non-increasing profile).
    """
    out = [float(s) for s in speeds]
    for i in range(len(out) - 2, -1, -1):
        out[i] = max(out[i], out[i + 1])
    return out


def measurements_to_table(measurements: Sequence[SPSMeasurement], monotone: bool = True) -> SPSTable:
    """The ``SPSTable`` (nominal batch sizes, steps per second from median step times)."""
    speeds = [m.steps_per_s for m in measurements]
    return SPSTable([m.batch_tokens for m in measurements], monotone_speeds(speeds) if monotone else speeds)


def format_measurements(measurements: Sequence[SPSMeasurement], table: SPSTable) -> list[str]:
    """A fixed-width report: layout, median and spread of step times, raw and tabled speed, tokens per second."""
    lines = ["      B  requests x len  median ms   min ms   max ms  raw steps/s  table steps/s  tokens/s"]
    for m, tabled in zip(measurements, table.steps_per_s):
        ms = [1e3 * s for s in m.step_seconds]
        layout = f"{m.shape.requests} x {m.shape.tokens_per_request}"
        lines.append(
            f"{m.batch_tokens:>7}  {layout:>13}  {1e3 * m.median_seconds:>9.3f} {min(ms):>8.3f} {max(ms):>8.3f}"
            f"  {m.steps_per_s:>11.2f}  {tabled:>13.2f}  {tabled * m.batch_tokens:>8.0f}"
        )
    return lines


def dense_batch_sizes(max_batch_tokens: int) -> list[int]:
    """Every integer batch size ``1..max_batch_tokens``: SGLang looks its table up at the largest probe <= B, with no
    interpolation, so anything coarser would read the faster speed of a smaller batch between probes."""
    if max_batch_tokens < 2:
        raise ValueError(f"max_batch_tokens must be >= 2 (a one-probe SGLang table reads as unprofiled), "
                         f"got {max_batch_tokens}")
    return list(range(1, max_batch_tokens + 1))


def sglang_sps_table(table: SPSTable, max_batch_tokens: int) -> dict:
    """SGLang's SPS table (``export.engine_files``) from a dense profile ``1..max_batch_tokens``."""
    from deepspec_train.export.engine_files import sps_payload

    probes = [int(b) for b in table.batch_sizes]
    if probes != dense_batch_sizes(max_batch_tokens):
        raise ValueError(f"SGLang's table needs dense probes 1..{max_batch_tokens}, got {len(probes)} probes")
    return sps_payload(probes, table.steps_per_s, max_batch_tokens)
