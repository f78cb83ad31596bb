"""Answer conversations with a local transformers model: the backend for small targets.

The prompt is the model's own chat template with the generation prompt appended, so the answers are what the
target would say when served. Decoding is continuous batching over a key/value cache (``decode_loop``): up to
``batch_size`` answers decode together, an answer leaves at its turn end, and the next prompt takes its place.

Sampling is reproducible and independent of batching: each answer's random stream is seeded from ``seed``, the
request's ``seed_key`` (the row id and turn, given by the runner) and the prompt, so a resumed run writes the
answers an uninterrupted one would have, whatever batch size or row order. (Until this backend decoded by itself,
one seed was drawn per batch of ``generate``: the same seed gives other answers than it gave then.) Greedy
decoding equals ``generate``'s token for token.
"""

from __future__ import annotations

import hashlib
import itertools
import json
from collections import deque
from collections.abc import Callable, Iterator, Sequence

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from deepspec_train.data.chat_templates import chat_tokenizer
from deepspec_train.families.own_tokens import chat_turn_end
from deepspec_train.regenerate.backend import Completion, GenerationError, Message, StepHook, TurnRequest
from deepspec_train.regenerate.decode_loop import ContinuousDecoder, DecodeRequest, check_full_attention
from deepspec_train.regenerate.sampling import SamplingParams

# ChatML ends every turn with this token; a model whose generation config only names <|endoftext|> as EOS
# would otherwise run on past the end of its answer into a made-up next turn.
TURN_END_TOKEN = "<|im_end|>"


class LocalBackend:
    """Answers conversations on ``device``, up to ``batch_size`` at once (see the module docstring)."""

    batched = True

    def __init__(
        self, model_path: str, batch_size: int = 16, device: str = "cpu", seed: int = 0, dtype: str = "auto",
        chat_template: str = "",
    ) -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        self.batch_size = batch_size
        self.model_path = model_path
        self.max_in_flight = batch_size
        self.device = torch.device(device)
        self.seed = seed
        # Prompts are rendered with a chat template: a base model needs ``chat_template``, checked before it loads.
        self.tokenizer = chat_tokenizer(
            AutoTokenizer.from_pretrained(model_path), chat_template, f"regenerating with {model_path}",
            "--chat-template",
        )
        torch_dtype = dtype if dtype == "auto" else getattr(torch, dtype)
        self.model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch_dtype).to(self.device).eval()
        check_full_attention(self.model.config)
        self.eos_token_ids = self._stop_token_ids()
        # Answer tokens generated so far (the stop token included), for the tokens/s report.
        self.completion_tokens = 0

    def _stop_token_ids(self) -> list[int]:
        ids: list[int] = []
        configured = self.model.generation_config.eos_token_id
        if configured is not None:
            ids.extend([configured] if isinstance(configured, int) else configured)
        if self.tokenizer.eos_token_id is not None:
            ids.append(self.tokenizer.eos_token_id)
        # ChatML's turn end, and the one the target's own chat template writes (``families.own_tokens``).
        for token in {TURN_END_TOKEN, chat_turn_end(self.tokenizer)} - {None}:
            turn_end = self.tokenizer.convert_tokens_to_ids(token)
            if isinstance(turn_end, int) and turn_end != self.tokenizer.unk_token_id:
                ids.append(turn_end)
        if not ids:
            raise ValueError("the model has no end-of-sequence token; cannot tell where an answer ends")
        return sorted(set(ids))

    def render_prompt(self, conversation: Sequence[Message], sampling: SamplingParams) -> str:
        return self.tokenizer.apply_chat_template(
            list(conversation), tokenize=False, add_generation_prompt=True, enable_thinking=sampling.enable_thinking
        )

    def generate(
        self, conversations: Sequence[Sequence[Message]], sampling: SamplingParams
    ) -> list[str | GenerationError]:
        return [c.text for c in self.complete(conversations, sampling)]

    def complete(self, conversations: Sequence[Sequence[Message]], sampling: SamplingParams) -> list[Completion]:
        """Answers with token counts and finish reasons, in the order of ``conversations``."""
        waiting = deque(TurnRequest(index, list(c)) for index, c in enumerate(conversations))
        answered = self.stream(lambda: waiting.popleft() if waiting else None, sampling)
        answers = {request.key: completion for request, completion in answered}
        return [answers[index] for index in range(len(conversations))]

    def stream(
        self, next_request: Callable[[], TurnRequest | None], sampling: SamplingParams, on_step: StepHook | None = None
    ) -> Iterator[tuple[TurnRequest, Completion]]:
        """Answer requests as ``backend.StreamingBackend`` says, continuously batched."""
        requests: dict[int, TurnRequest] = {}
        numbers = itertools.count()

        def next_prompt() -> DecodeRequest | None:
            request = next_request()
            if request is None:
                return None
            prompt = self.render_prompt(request.conversation, sampling)
            ids = self.tokenizer(prompt, add_special_tokens=False)["input_ids"]
            number = next(numbers)
            requests[number] = request
            return DecodeRequest(number, ids, self._answer_seed(request.seed_key, prompt))

        decoder = ContinuousDecoder(self.model, self.eos_token_ids, self.batch_size)
        for answer in decoder.run(next_prompt, sampling, on_step):
            self.completion_tokens += answer.completion_tokens
            completion = Completion(
                # skip_special_tokens drops control tokens but keeps <think>...</think>: Qwen3 registers those as
                # non-special added tokens, and a thinking answer must keep its reasoning text.
                text=self.tokenizer.decode(answer.token_ids, skip_special_tokens=True),
                prompt_tokens=len(answer.request.prompt_ids),
                completion_tokens=answer.completion_tokens,
                finish_reason=answer.finish_reason,
            )
            yield requests.pop(answer.request.key), completion

    def _answer_seed(self, seed_key: str, prompt: str) -> int:
        digest = hashlib.sha256(json.dumps([self.seed, seed_key, prompt]).encode()).digest()
        return int.from_bytes(digest[:8], "little")
