"""Chain speculative decoding of one conversation: an HF target with a KV cache, verified drafts, per-round records.

Positions follow training. The target has processed every position before the anchor ``a`` (its KV cache and
the tapped decoder-layer features cover ``0..a-1``); the anchor ``x_a`` is the last token whose features are
not yet known. A round:

1. the drafter proposes ``d_1..d_K`` for positions ``a+1..a+K`` from the context features ``< a`` and ``x_a``;
2. one target pass over ``[x_a, d_1..d_K]`` (positions ``a..a+K``, on top of the cache) gives ``p_1..p_{K+1}``
   and the features at ``a..a+K``;
3. exact verification (``spec_sampling.verify_blocks``, greedy at temperature 0) accepts ``n`` drafts and emits
   ``d_1..d_n`` plus a correction or bonus token ``x'``;
4. cache and features are kept for positions ``<= a+n`` (they were computed on accepted tokens) and cropped
   after; ``x'`` at ``a+n+1`` is the next anchor.

After a prompt is prefilled (every token but the last, which becomes the first anchor), rounds run until an
end-of-turn token or the token budget. A multi-turn conversation appends, after each answer, the chat-template
text that closes the assistant turn and opens the next user turn, and prefills it on top of the same cache.
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Iterator, Optional, Sequence

import torch
from transformers import AutoTokenizer, DynamicCache, PreTrainedModel, PreTrainedTokenizerBase

from deepspec_train.data.chat_templates import chat_tokenizer
from deepspec_train.families.own_tokens import chat_turn_end
from deepspec_train.models.block_drafting import BlockDrafter, DraftBlock, DraftContext, calibrated_confidences
from deepspec_train.evaluation.spec_sampling import (
    VerifyResult,
    acceptance_probs,
    verify_blocks,
    verify_blocks_greedy,
)
from deepspec_train.models.sampling import probs_from_logits
from deepspec_train.formats.eval_traces import TraceRound
from deepspec_train.target.hidden_states import decoder_of

TURN_END_TOKEN = "<|im_end|>"
# Qwen3-style targets answer with thinking disabled, as in data regeneration.
CHAT_TEMPLATE_KWARGS = {"enable_thinking": False}
# Stands for an answer's text when rendering the template around it; never produced by a tokenizer's decode.
ANSWER_SENTINEL = "\u2063ANSWER\u2063"


@dataclass
class RoundRecord:
    """One verification round (the trace fields the decoder knows; the evaluator adds suite and prompt)."""

    turn: int
    round: int
    drafted: int
    accepted: int
    emitted: int
    confidence_logits: Optional[list[float]]
    confidences: Optional[list[float]]
    target_accept_probs: list[float]
    # c*_k given the drafted prefix (see ``verify_drafts``): the best any confidence head can know before d_k.
    analytic_accept: list[float]
    # Wall time of the drafter's call for this round (the draft alone, not the verification), and the CPU time of
    # the calling thread during it: with one torch thread, the draft's own compute, which time spent descheduled
    # on a shared machine does not inflate.
    draft_seconds: float
    draft_cpu_seconds: float
    # Where the round starts: answer tokens of this turn emitted before it, and the anchor's position in the
    # conversation (the target's processed positions).
    answer_start: int = 0
    context_start: int = 0

    def trace(self, suite: str, category: str, prompt_id: str, seed: Optional[int] = None) -> TraceRound:
        """This round's trace line, for prompt ``prompt_id`` of ``suite`` (decoded with sampling seed ``seed``,
        when a caller pools several)."""
        return TraceRound(
            suite=suite, category=category, prompt_id=prompt_id, turn=self.turn, round=self.round,
            drafted=self.drafted, accepted=self.accepted, emitted=self.emitted,
            confidence_logits=None if self.confidence_logits is None else tuple(self.confidence_logits),
            confidences=None if self.confidences is None else tuple(self.confidences),
            target_accept_probs=tuple(self.target_accept_probs),
            analytic_accept=tuple(self.analytic_accept),
            draft_seconds=self.draft_seconds,
            draft_cpu_seconds=self.draft_cpu_seconds,
            seed=seed,
            answer_start=self.answer_start,
            context_start=self.context_start,
        )


@dataclass
class TurnResult:
    """Generated tokens of one assistant turn, how it ended (``eos``, ``length`` or ``context``), its rounds."""

    tokens: list[int]
    stop_reason: str
    rounds: list[RoundRecord] = field(default_factory=list)
    seconds: float = 0.0


def stop_token_ids(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase) -> set[int]:
    """End-of-turn ids: the generation config's eos, the tokenizer's eos, ``<|im_end|>`` when it exists and the
    turn end the chat template writes."""
    ids: set[int] = set()
    configured = model.generation_config.eos_token_id
    if configured is not None:
        ids.update([configured] if isinstance(configured, int) else configured)
    if tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    # ChatML's turn end, and the one the target's own chat template writes (``families.own_tokens``).
    for token in {TURN_END_TOKEN, chat_turn_end(tokenizer)} - {None}:
        turn_end = tokenizer.convert_tokens_to_ids(token)
        if isinstance(turn_end, int) and turn_end != tokenizer.unk_token_id:
            ids.add(turn_end)
    if not ids:
        raise ValueError("the target has no end-of-sequence token; cannot tell where an answer ends")
    return ids


def verify_drafts(
    draft: DraftBlock, target_logits: torch.Tensor, temperature: float, generator: Optional[torch.Generator] = None
) -> tuple[VerifyResult, torch.Tensor, torch.Tensor]:
    """Verify ``R`` drafted blocks against ``target_logits [R, K+1, V]`` at ``temperature`` (0 = greedy).

    Returns the verification result, ``min(1, p_k(d_k) / q_k(d_k))`` per drafted token (``[R, K]``) and the
    analytic acceptance ``c*_k = sum_j min(p_k[j], q_k[j])`` of each position given the drafted prefix
    (``[R, K]``): the probability that draft ``k`` is accepted once ``d_1..d_{k-1}`` were, before ``d_k`` is drawn.
    """
    p = probs_from_logits(target_logits, temperature)
    ratios = acceptance_probs(draft.tokens, draft.probs, p)
    c_star = torch.minimum(p[:, :-1].double(), draft.probs.double()).sum(dim=-1)
    if temperature <= 0:
        return verify_blocks_greedy(draft.tokens, target_logits), ratios, c_star
    return verify_blocks(draft.tokens, draft.probs, p, generator), ratios, c_star


class TargetSession:
    """The target's state for one conversation: tokens, KV cache and tapped features of processed positions.

    Invariant between calls: the cache and ``features`` cover positions ``0..len(tokens)-2``; the last token is
    the anchor, not yet processed.
    """

    def __init__(self, model: PreTrainedModel, layer_ids: Sequence[int]) -> None:
        self.model = model
        self.decoder = decoder_of(model)
        num_layers = len(self.decoder.layers)
        if any(not 0 <= i < num_layers - 1 for i in layer_ids):
            raise ValueError(f"target layer ids {list(layer_ids)} must lie in 0..{num_layers - 2}")
        self.layer_ids = list(layer_ids)
        self.cache = DynamicCache(config=model.config)
        # Sliding-window layers (Gemma 3, GPT-OSS) drop keys past the window as they go, and then cannot be rolled
        # back to the accepted prefix; recording the past makes ``crop`` exact for them.
        self.cache.activate_past_recording()
        self.tokens: list[int] = []
        self.features: Optional[torch.Tensor] = None
        # Drafters keep this conversation's projected context keys / values here (see DraftContext.cache).
        self.drafter_cache: dict = {}
        self.max_positions = int(getattr(model.config, "max_position_embeddings", 1 << 30))

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @property
    def processed(self) -> int:
        return 0 if self.features is None else int(self.features.shape[0])

    def context(self) -> DraftContext:
        """Features and tokens of the processed positions (everything before the anchor)."""
        if self.features is None:
            raise RuntimeError("no processed positions yet: extend the session with at least two tokens")
        tokens = torch.tensor(self.tokens[: self.processed], device=self.device)
        return DraftContext(self.features, tokens, cache=self.drafter_cache)

    @contextmanager
    def _tapped(self) -> Iterator[dict[int, torch.Tensor]]:
        captured: dict[int, torch.Tensor] = {}

        def keep(layer_id: int):
            def hook(_module, _inputs, output):
                captured[layer_id] = output[0] if isinstance(output, tuple) else output

            return hook

        handles = [self.decoder.layers[i].register_forward_hook(keep(i)) for i in set(self.layer_ids)]
        try:
            yield captured
        finally:
            for handle in handles:
                handle.remove()

    @torch.no_grad()
    def _forward(self, ids: list[int], logits_to_keep: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Run ``ids`` on top of the cache; returns the last ``logits_to_keep`` logits and the new features."""
        input_ids = torch.tensor([ids], device=self.device)
        with self._tapped() as captured:
            out = self.model(input_ids=input_ids, cache=self.cache, use_cache=True, logits_to_keep=logits_to_keep)
        features = torch.cat([captured[i][0] for i in self.layer_ids], dim=-1).float()
        return out.logits[0].float(), features

    def _append_features(self, features: torch.Tensor) -> None:
        self.features = features if self.features is None else torch.cat([self.features, features], dim=0)

    def extend(self, new_tokens: Sequence[int]) -> None:
        """Append tokens and process every pending position except the new last token (the next anchor)."""
        self.tokens.extend(int(t) for t in new_tokens)
        pending = self.tokens[self.processed : -1]
        if pending:
            _, features = self._forward(pending, logits_to_keep=1)
            self._append_features(features)

    def verify_logits(self, drafts: Sequence[int]) -> torch.Tensor:
        """Target logits ``[K+1, V]`` after ``x_a, d_1..d_k`` for ``k = 0..K``; features are held until ``commit``."""
        logits, self._pending_features = self._forward([self.tokens[-1], *drafts], logits_to_keep=0)
        return logits

    def commit(self, emitted: Sequence[int]) -> None:
        """Keep the verified positions ``a..a+m-1`` (``m = len(emitted)``): the anchor and the accepted drafts,
        whose features the verification pass computed; ``emitted[-1]`` becomes the next anchor."""
        keep = len(emitted)
        self._append_features(self._pending_features[:keep])
        self._pending_features = None
        excess = self.cache.get_seq_length() - self.processed
        if excess:
            self.cache.crop(-excess)
        self.tokens.extend(int(t) for t in emitted)


def prompt_tokenizer(target_path: str, chat_template: str = "") -> PreTrainedTokenizerBase:
    """The target's tokenizer with ``chat_template`` (``--chat-template``) applied, checked to have a template:
    the suites' prompts are rendered with it, so a base model without one stops in one line before it loads."""
    return chat_tokenizer(
        AutoTokenizer.from_pretrained(target_path), chat_template, "rendering the suites' prompts", "--chat-template"
    )


class SpeculativeDecoder:
    """Decode conversations with ``target`` and a block drafter; see the module docstring."""

    def __init__(
        self,
        target: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase,
        drafter: BlockDrafter,
        target_layer_ids: Sequence[int],
        block_size: int,
        temperature: float,
        generator: Optional[torch.Generator] = None,
        confidence_temperatures: Optional[list[float]] = None,
    ) -> None:
        if not 1 <= block_size <= drafter.max_block_size:
            raise ValueError(f"block size {block_size} outside 1..{drafter.max_block_size} for this drafter")
        self.target = target
        self.tokenizer = tokenizer
        self.drafter = drafter
        self.target_layer_ids = list(target_layer_ids)
        self.block_size = block_size
        self.temperature = temperature
        self.generator = generator
        self.confidence_temperatures = confidence_temperatures
        self.stop_ids = stop_token_ids(target, tokenizer)

    def _round(
        self, session: TargetSession, turn: int, index: int, answer_start: int
    ) -> tuple[list[int], RoundRecord]:
        context_start = session.processed
        anchor = torch.tensor([session.tokens[-1]], device=session.device)
        context = session.context()
        start, start_cpu = time.perf_counter(), time.thread_time()
        draft = self.drafter.draft(context, anchor, self.block_size, self.temperature, self.generator)
        draft_seconds, draft_cpu_seconds = time.perf_counter() - start, time.thread_time() - start_cpu
        logits = session.verify_logits(draft.tokens[0].tolist())
        result, ratios, c_star = verify_drafts(draft, logits[None], self.temperature, self.generator)
        accepted = int(result.accepted[0])
        emitted = result.tokens[0, : accepted + 1].tolist()
        conf_logits = confidences = None
        if draft.confidence_logits is not None:
            conf_logits = draft.confidence_logits[0].tolist()
            confidences = calibrated_confidences(draft.confidence_logits[0], self.confidence_temperatures).tolist()
        record = RoundRecord(
            turn=turn,
            round=index,
            drafted=self.block_size,
            accepted=accepted,
            emitted=accepted + 1,
            confidence_logits=conf_logits,
            confidences=confidences,
            target_accept_probs=ratios[0].tolist(),
            analytic_accept=c_star[0].tolist(),
            draft_seconds=draft_seconds,
            draft_cpu_seconds=draft_cpu_seconds,
            answer_start=answer_start,
            context_start=context_start,
        )
        return emitted, record

    def generate_turn(self, session: TargetSession, max_new_tokens: int, turn: int = 0) -> TurnResult:
        """Run rounds from the session's anchor until an end-of-turn token, ``max_new_tokens`` or the context
        limit. Tokens emitted past a stop are discarded (the round still counts its ``accepted + 1``)."""
        start = time.perf_counter()
        result = TurnResult(tokens=[], stop_reason="length")
        while len(result.tokens) < max_new_tokens:
            if session.processed + self.block_size + 1 > session.max_positions:
                result.stop_reason = "context"
                break
            emitted, record = self._round(session, turn, len(result.rounds), len(result.tokens))
            result.rounds.append(record)
            emitted = emitted[: max_new_tokens - len(result.tokens)]
            stop_at = next((i for i, t in enumerate(emitted) if t in self.stop_ids), None)
            if stop_at is not None:
                emitted = emitted[: stop_at + 1]
            session.commit(emitted)
            result.tokens.extend(emitted)
            if stop_at is not None:
                result.stop_reason = "eos"
                break
        result.seconds = time.perf_counter() - start
        return result

    def _render(self, messages: list[dict], add_generation_prompt: bool) -> str:
        return self.tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=add_generation_prompt, **CHAT_TEMPLATE_KWARGS
        )

    def _encode(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def decode_conversation(
        self, turns: Sequence[str], max_new_tokens: int
    ) -> tuple[list[TurnResult], TargetSession]:
        """Answer each user turn in order; returns the turns' results and the session (all tokens, for tests).
        A later turn whose prompt leaves no room for one round within the target's positions is not started, and
        neither are the turns after it (a long conversation ends at the context limit)."""
        session = TargetSession(self.target, self.target_layer_ids)
        history: list[dict] = []
        results: list[TurnResult] = []
        for turn, user_text in enumerate(turns):
            if results:
                bridge = self._bridge(history, user_text, results[-1])
                if len(session.tokens) + len(bridge) + self.block_size > session.max_positions:
                    break
                session.extend(bridge)
                answer = self.tokenizer.decode(results[-1].tokens, skip_special_tokens=True)
                history.append({"role": "assistant", "content": answer})
            else:
                session.extend(self._encode(self._render([{"role": "user", "content": user_text}], True)))
            history.append({"role": "user", "content": user_text})
            results.append(self.generate_turn(session, max_new_tokens, turn))
        return results, session

    def _bridge(self, history: list[dict], user_text: str, answered: TurnResult) -> list[int]:
        """Tokens that close the answer just generated and open the next one: the template's text after the
        assistant content, through the next generation prompt. The cache keeps the tokens actually generated,
        so only this bridge is tokenised (never the answer text)."""
        messages = [*history, {"role": "assistant", "content": ANSWER_SENTINEL}, {"role": "user", "content": user_text}]
        rendered = self._render(messages, add_generation_prompt=True)
        ids = self._encode(rendered[rendered.rindex(ANSWER_SENTINEL) + len(ANSWER_SENTINEL) :])
        # The generated end-of-turn token already closes the answer; a cut-short answer gets the template's.
        if answered.stop_reason == "eos" and ids and ids[0] == answered.tokens[-1]:
            ids = ids[1:]
        return ids
