"""Answer conversations with a local transformers model (batched ``generate``): the backend for small targets.

The prompt is the model's own chat template with the generation prompt appended, so the answers are what the
target would say when served. Prompts are left-padded into batches (decoder-only models continue from the last
position) and sorted by length first so a batch wastes little compute on padding.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from deepspec_train.data.chat_templates import chat_tokenizer
from deepspec_train.families.own_tokens import chat_turn_end
from deepspec_train.regenerate.backend import GenerationError, Message
from deepspec_train.regenerate.sampling import SamplingParams

# ChatML ends every turn with this token; a model whose generation config only names <|endoftext|> as EOS
# would otherwise run on past the end of its answer into a made-up next turn.
TURN_END_TOKEN = "<|im_end|>"


@dataclass
class Completion:
    text: str
    prompt_tokens: int
    completion_tokens: int
    # "stop": the model ended its turn; "length": cut at max_new_tokens (OpenAI's names).
    finish_reason: str


class LocalBackend:
    """``generate`` answers conversations in batches of ``batch_size`` on ``device``.

    Sampling is reproducible: each batch's random stream is seeded from ``seed`` and the batch's prompts, so the
    same batch gives the same answers whatever ran before it (a resumed run reproduces an interrupted one).
    """

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
        self.tokenizer.padding_side = "left"
        if self.tokenizer.pad_token_id is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        torch_dtype = dtype if dtype == "auto" else getattr(torch, dtype)
        self.model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch_dtype).to(self.device).eval()
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
        prompts = [self.render_prompt(c, sampling) for c in conversations]
        lengths = [len(self.tokenizer(p, add_special_tokens=False)["input_ids"]) for p in prompts]
        order = sorted(range(len(prompts)), key=lambda i: lengths[i])
        results: list[Completion | None] = [None] * len(prompts)
        for start in range(0, len(order), self.batch_size):
            batch = order[start : start + self.batch_size]
            for i, completion in zip(batch, self._complete_batch([prompts[i] for i in batch], sampling)):
                results[i] = completion
        return [r for r in results if r is not None]

    def _batch_seed(self, prompts: list[str]) -> int:
        digest = hashlib.sha256(json.dumps([self.seed, prompts]).encode()).digest()
        return int.from_bytes(digest[:8], "little") & (2**63 - 1)

    @torch.no_grad()
    def _complete_batch(self, prompts: list[str], sampling: SamplingParams) -> list[Completion]:
        enc = self.tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=False).to(self.device)
        sample_kwargs = (
            {"do_sample": False, "temperature": None, "top_p": None, "top_k": None}
            if sampling.greedy
            else {
                "do_sample": True,
                "temperature": sampling.temperature,
                "top_p": sampling.top_p,
                "top_k": sampling.top_k,
            }
        )
        fork_devices = [self.device] if self.device.type == "cuda" else []
        # fork_rng keeps the caller's global RNG untouched while this batch uses its own seeded stream.
        with torch.random.fork_rng(devices=fork_devices):
            torch.manual_seed(self._batch_seed(prompts))
            output = self.model.generate(
                **enc,
                max_new_tokens=sampling.max_new_tokens,
                eos_token_id=self.eos_token_ids,
                pad_token_id=self.tokenizer.pad_token_id,
                **sample_kwargs,
            )
        prompt_width = enc["input_ids"].shape[1]
        prompt_lengths = enc["attention_mask"].sum(dim=1).tolist()
        stops = set(self.eos_token_ids)
        completions = []
        for row, n_prompt in zip(output[:, prompt_width:].tolist(), prompt_lengths):
            end = next((j for j, tok in enumerate(row) if tok in stops), None)
            answer = row if end is None else row[:end]
            completions.append(
                Completion(
                    # skip_special_tokens drops control tokens but keeps <think>...</think>: Qwen3 registers
                    # those as non-special added tokens, and a thinking answer must keep its reasoning text.
                    text=self.tokenizer.decode(answer, skip_special_tokens=True),
                    prompt_tokens=int(n_prompt),
                    completion_tokens=len(answer) + (0 if end is None else 1),
                    finish_reason="length" if end is None else "stop",
                )
            )
        self.completion_tokens += sum(c.completion_tokens for c in completions)
        return completions
