"""Tests for the local backend's decoding: continuous batching (``regenerate.decode_loop`` over
``regenerate.slot_cache``) against ``generate`` as the brute-force reference, and the sampling law
(``regenerate.token_sampler``) against transformers' own logits warpers.

The model is a small random-weight Llama built from a config; prompts are token ids, so no tokenizer is involved.
"""

from __future__ import annotations

from collections import deque

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, MistralConfig, MistralForCausalLM, Qwen3Config
from transformers.generation.logits_process import (
    LogitsProcessorList, TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper,
)

from deepspec_train.regenerate import slot_cache
from deepspec_train.regenerate.decode_loop import (
    ContinuousDecoder, DecodeRequest, DecodedAnswer, check_full_attention,
)
from deepspec_train.regenerate.sampling import SamplingParams
from deepspec_train.regenerate.token_sampler import candidate_law, next_tokens

VOCAB = 101
GREEDY = SamplingParams(temperature=0, max_new_tokens=24)
SAMPLED = SamplingParams(temperature=0.7, top_p=0.8, top_k=20, max_new_tokens=24)

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def model() -> LlamaForCausalLM:
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                         initializer_range=0.5)
    torch.manual_seed(0)
    return LlamaForCausalLM(config).eval()


@pytest.fixture(scope="module")
def prompts() -> list[list[int]]:
    generator = torch.Generator().manual_seed(1)
    lengths = torch.randint(2, 40, (14,), generator=generator).tolist()
    return [torch.randint(3, VOCAB, (n,), generator=generator).tolist() for n in lengths]


def decode(model, prompts, sampling, slots, stop_ids, order=None, seeds=None) -> dict[int, DecodedAnswer]:
    order = list(range(len(prompts))) if order is None else order
    waiting = deque(DecodeRequest(i, prompts[i], i if seeds is None else seeds[i]) for i in order)
    decoder = ContinuousDecoder(model, stop_ids, slots)
    answers = decoder.run(lambda: waiting.popleft() if waiting else None, sampling)
    return {answer.request.key: answer for answer in answers}


def generate_greedy(model, prompt: list[int], stop_ids: list[int], max_new_tokens: int) -> list[int]:
    """``generate``'s greedy answer to one prompt, up to (without) its first stop token."""
    output = model.generate(torch.tensor([prompt]), max_new_tokens=max_new_tokens, do_sample=False,
                            eos_token_id=stop_ids, pad_token_id=0)[0, len(prompt) :].tolist()
    return next((output[:j] for j, token in enumerate(output) if token in stop_ids), output)


def stop_tokens(model, prompts) -> list[int]:
    """Two tokens that end some greedy answers early and leave others to run to the length cap: the tokens at
    positions 6 and 12 of the first prompt's unstopped greedy answer."""
    answer = generate_greedy(model, prompts[0], [], GREEDY.max_new_tokens)
    return [answer[6], answer[12]]


@pytest.mark.parametrize("slots", [1, 3, 14])
def test_greedy_answers_equal_generate_token_for_token(model, prompts, slots: int, monkeypatch) -> None:
    # One spare column: the cache is rebuilt (shifted and regrown) many times during the run.
    monkeypatch.setattr(slot_cache, "_MIN_SPARE_COLUMNS", 1)
    stops = stop_tokens(model, prompts)
    answers = decode(model, prompts, GREEDY, slots, stops)
    for key, prompt in enumerate(prompts):
        reference = generate_greedy(model, prompt, stops, GREEDY.max_new_tokens)
        answer = answers[key]
        assert answer.token_ids == reference, key
        stopped = len(reference) < GREEDY.max_new_tokens
        assert answer.finish_reason == ("stop" if stopped else "length")
        assert answer.completion_tokens == len(reference) + stopped
    reasons = {answer.finish_reason for answer in answers.values()}
    assert reasons == {"stop", "length"}, "the test needs answers of both kinds"


def test_finished_rows_cost_no_compute(model, prompts) -> None:
    """Every row a decoding step computes yields a token of an unfinished answer: a step's rows sum to the
    tokens generated after each answer's first (which comes from its prefill)."""
    stops = stop_tokens(model, prompts)
    step_rows: list[int] = []

    def count_rows(module, args, kwargs) -> None:
        if isinstance(kwargs.get("cache"), slot_cache.SlotCache):
            step_rows.append(kwargs["input_ids"].shape[0])

    handle = model.register_forward_pre_hook(count_rows, with_kwargs=True)
    try:
        answers = decode(model, prompts, GREEDY, 4, stops)
    finally:
        handle.remove()
    assert sum(step_rows) == sum(answer.completion_tokens - 1 for answer in answers.values())
    # The batch was full while prompts waited, and drained at the end.
    assert max(step_rows) == 4 and step_rows[-1] < 4


def test_sampled_answers_depend_only_on_the_prompt_and_its_seed(model, prompts) -> None:
    stops = stop_tokens(model, prompts)
    first = decode(model, prompts, SAMPLED, 4, stops)
    reordered = decode(model, prompts, SAMPLED, 2, stops, order=list(reversed(range(len(prompts)))))
    other_seeds = decode(model, prompts, SAMPLED, 4, stops, seeds=[1000 + i for i in range(len(prompts))])
    tokens = {key: answer.token_ids for key, answer in first.items()}
    assert tokens == {key: answer.token_ids for key, answer in reordered.items()}
    assert tokens != {key: answer.token_ids for key, answer in other_seeds.items()}
    assert tokens != {key: answer.token_ids for key, answer in decode(model, prompts, GREEDY, 4, stops).items()}


def test_a_stop_token_drawn_first_ends_the_answer_empty(model, prompts) -> None:
    first_token = generate_greedy(model, prompts[0], [], 1)[0]
    answers = decode(model, prompts[:1], GREEDY, 2, [first_token])
    assert (answers[0].token_ids, answers[0].finish_reason, answers[0].completion_tokens) == ([], "stop", 1)


def test_models_with_sliding_window_layers_are_refused(model) -> None:
    check_full_attention(model.config)
    check_full_attention(Qwen3Config(num_hidden_layers=2))
    with pytest.raises(ValueError, match="sliding_attention"):
        check_full_attention(Qwen3Config(num_hidden_layers=2, use_sliding_window=True, max_window_layers=1))
    mistral = MistralForCausalLM(MistralConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64,
                                               num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2))
    with pytest.raises(ValueError, match="full-attention models only"):
        ContinuousDecoder(mistral, [2], slots=2)


@pytest.mark.parametrize(
    "temperature, top_k, top_p",
    [(0.7, 20, 0.8), (1.0, 0, 0.9), (1.3, 5, 1.0), (0.5, 0, 1.0), (1.0, 1, 0.5), (0.9, 200, 0.95)],
)
def test_candidate_law_equals_transformers_warpers(temperature: float, top_k: int, top_p: float) -> None:
    logits = torch.randn(6, VOCAB, generator=torch.Generator().manual_seed(3)) * 3
    sampling = SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p)
    warpers = LogitsProcessorList([TemperatureLogitsWarper(temperature)])
    if top_k:
        warpers.append(TopKLogitsWarper(top_k))
    if top_p < 1:
        warpers.append(TopPLogitsWarper(top_p))
    reference = warpers(None, logits.clone()).softmax(dim=-1)
    ids, probs = candidate_law(logits, sampling)
    dense = torch.zeros_like(reference).scatter_add_(-1, ids, probs)
    torch.testing.assert_close(dense, reference, atol=1e-6, rtol=1e-5)


def test_inverse_cdf_draws_follow_the_law() -> None:
    logits = torch.randn(1, VOCAB, generator=torch.Generator().manual_seed(4)) * 2
    draws = 20_000
    uniforms = (torch.arange(draws, dtype=torch.float64) + 0.5) / draws
    tokens = next_tokens(logits.expand(draws, -1), SAMPLED, uniforms)
    ids, probs = candidate_law(logits, SAMPLED)
    law = torch.zeros(VOCAB, dtype=torch.float64).scatter_add_(0, ids[0], probs[0].double())
    counts = torch.bincount(tokens, minlength=VOCAB).double()
    # Evenly spaced uniforms put within one of draws * p of them in each token's interval.
    assert (counts - draws * law).abs().max() <= 1
    assert bool((counts[law == 0] == 0).all()) and int((law > 0).sum()) > 1
    assert torch.equal(next_tokens(logits, GREEDY, torch.zeros(1)), logits.argmax(dim=-1))
