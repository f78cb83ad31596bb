"""Continuous batching for a local causal LM: decode up to ``slots`` answers at once, refilling as rows finish.

``ContinuousDecoder.run`` pulls prompts (token ids) from a callable whenever a slot is free, prefills each prompt on
its own (no padding computed), then decodes all rows in flight one token per step over a ``SlotCache``. A row
leaves at its first stop token or at ``max_new_tokens``, is handed back at once, and a waiting prompt takes its
slot at the next step: finished rows cost nothing, and the batch stays full while prompts remain.

Each row draws its tokens with its own random stream (``random.Random(request.seed)``, one uniform per token; see
``token_sampler``), so an answer is a function of the model, the prompt, the sampling law and the row's seed,
whatever decodes beside it. Greedy decoding equals ``generate``'s greedy decoding token for token (tested).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Hashable, Iterator
from dataclasses import dataclass, field

import torch
from transformers import PreTrainedConfig, PreTrainedModel
from transformers.cache_utils import DynamicCache

from deepspec_train.regenerate.backend import StepHook
from deepspec_train.regenerate.sampling import SamplingParams
from deepspec_train.regenerate.slot_cache import SlotCache
from deepspec_train.regenerate.token_sampler import next_tokens


@dataclass(frozen=True)
class DecodeRequest:
    """A prompt to answer: ``key`` names it for the caller; ``seed`` starts its random stream."""

    key: Hashable
    prompt_ids: list[int]
    seed: int


@dataclass
class DecodedAnswer:
    request: DecodeRequest
    # The answer without its stop token.
    token_ids: list[int]
    # "stop": a stop token ended it; "length": cut at max_new_tokens (OpenAI's names).
    finish_reason: str
    # Tokens generated, the stop token included.
    completion_tokens: int


@dataclass
class _Row:
    request: DecodeRequest
    rng: random.Random
    tokens: list[int] = field(default_factory=list)
    finish_reason: str | None = None


def check_full_attention(config: PreTrainedConfig) -> None:
    """Raise ``ValueError`` for a model with sliding-window or linear-attention layers: the slot cache keeps every
    column of every layer and masks padding only, so such a model would attend past its window."""
    layer_types = getattr(config, "layer_types", None)
    if layer_types is not None:
        others = sorted(set(layer_types) - {"full_attention"})
    else:
        others = [] if getattr(config, "sliding_window", None) is None else ["sliding_attention"]
    if others:
        raise ValueError(f"the local backend decodes full-attention models only; this one has {', '.join(others)} "
                         "layers (serve it with vLLM or SGLang and use --backend http)")


class ContinuousDecoder:
    """Answers prompts with ``model`` (see the module docstring); ``stop_ids`` end an answer."""

    def __init__(self, model: PreTrainedModel, stop_ids: list[int], slots: int) -> None:
        if slots < 1:
            raise ValueError(f"slots must be >= 1, got {slots}")
        check_full_attention(model.config)
        self.model = model
        self.stop_ids = set(stop_ids)
        self.slots = slots
        self.device = next(model.parameters()).device

    @torch.no_grad()
    def run(
        self, next_request: Callable[[], DecodeRequest | None], sampling: SamplingParams,
        on_step: StepHook | None = None,
    ) -> Iterator[DecodedAnswer]:
        """Answer every request ``next_request`` gives, each yielded as soon as it is done (completion order).
        ``next_request`` returns None when it has nothing now; it is asked again while rows are in flight (the
        caller may add prompts when an answer comes back) and the run ends when it has nothing and no row is left.
        ``on_step`` hears of every step (and every admission of new rows) just before the rows it finished are
        yielded, so the answers it counts in flight are the unfinished ones."""
        cache = SlotCache(self.model.config.num_hidden_layers, self.slots)
        rows: list[_Row] = []
        report = on_step or (lambda new_tokens, in_flight: None)
        while True:
            admitted = self._admit(rows, cache, next_request, sampling)
            report(admitted, self._unfinished_lengths(rows))
            yield from self._retire(rows, cache)
            if not rows:
                if admitted:
                    continue
                return
            self._step(rows, cache, sampling)
            report(len(rows), self._unfinished_lengths(rows))
            yield from self._retire(rows, cache)

    def _admit(
        self, rows: list[_Row], cache: SlotCache, next_request: Callable[[], DecodeRequest | None],
        sampling: SamplingParams,
    ) -> int:
        """Prefill waiting prompts into the free slots and draw their first tokens; returns how many joined."""
        joined = 0
        while len(rows) < self.slots and (request := next_request()) is not None:
            prefill = DynamicCache(config=self.model.config)
            ids = torch.tensor([request.prompt_ids], device=self.device)
            logits = self.model(input_ids=ids, cache=prefill, use_cache=True, logits_to_keep=1).logits[:, -1]
            cache.append_row(prefill)
            row = _Row(request, random.Random(request.seed))
            rows.append(row)
            self._take(row, self._draw([row], logits, sampling)[0], sampling)
            joined += 1
        return joined

    def _step(self, rows: list[_Row], cache: SlotCache, sampling: SamplingParams) -> None:
        """Feed every row's last token, then draw each row's next one."""
        mask = cache.step_mask(self.model.dtype)
        last = torch.tensor([[row.tokens[-1]] for row in rows], device=self.device)
        output = self.model(
            input_ids=last, position_ids=cache.positions(), attention_mask=mask, cache=cache, use_cache=True,
            logits_to_keep=1,
        )
        cache.advance()
        for row, token in zip(rows, self._draw(rows, output.logits[:, -1], sampling)):
            self._take(row, token, sampling)

    def _draw(self, rows: list[_Row], logits: torch.Tensor, sampling: SamplingParams) -> list[int]:
        uniforms = torch.tensor([0.0 if sampling.greedy else row.rng.random() for row in rows], dtype=torch.float64)
        return next_tokens(logits, sampling, uniforms).tolist()

    def _take(self, row: _Row, token: int, sampling: SamplingParams) -> None:
        row.tokens.append(token)
        if token in self.stop_ids:
            row.finish_reason = "stop"
        elif len(row.tokens) >= sampling.max_new_tokens:
            row.finish_reason = "length"

    @staticmethod
    def _unfinished_lengths(rows: list[_Row]) -> list[int]:
        return [len(row.tokens) for row in rows if row.finish_reason is None]

    def _retire(self, rows: list[_Row], cache: SlotCache) -> Iterator[DecodedAnswer]:
        """Hand back the finished rows and free their slots."""
        finished = [row for row in rows if row.finish_reason is not None]
        if not finished:
            return
        order = cache.keep_rows([row.finish_reason is None for row in rows])
        rows[:] = [rows[index] for index in order]
        for row in finished:
            stopped = row.finish_reason == "stop"
            answer = row.tokens[:-1] if stopped else row.tokens
            yield DecodedAnswer(row.request, answer, row.finish_reason, len(row.tokens))
