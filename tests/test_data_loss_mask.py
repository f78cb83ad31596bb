"""Golden tests of the ChatML template and of the assistant-only loss mask built from message boundaries."""

from __future__ import annotations

import pytest

from deepspec_train.data.conversations import BadRow, normalize_conversation
from deepspec_train.data.loss_mask import TemplateNotPrefixStableError, assistant_char_spans, render_with_loss_mask
from tests.helpers.chat_tokenizer import build_chat_tokenizer


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    return build_chat_tokenizer(tmp_path_factory.mktemp("chat_tokenizer"))


def split_by_mask(tokenizer, input_ids, loss_mask):
    """Decoded text of the supervised tokens and of the others (specials kept)."""
    supervised = [t for t, m in zip(input_ids, loss_mask) if m]
    context = [t for t, m in zip(input_ids, loss_mask) if not m]
    return (
        tokenizer.decode(supervised, skip_special_tokens=False),
        tokenizer.decode(context, skip_special_tokens=False),
    )


def supervised_runs(tokenizer, input_ids, loss_mask):
    """Decoded text of each maximal run of supervised tokens."""
    runs, current = [], []
    for token, flag in zip(input_ids, loss_mask):
        if flag:
            current.append(token)
        elif current:
            runs.append(tokenizer.decode(current, skip_special_tokens=False))
            current = []
    if current:
        runs.append(tokenizer.decode(current, skip_special_tokens=False))
    return runs


def test_template_renders_chatml_and_generation_prompts(tokenizer):
    messages = [{"role": "user", "content": "Hi"}]
    assert tokenizer.apply_chat_template(messages, tokenize=False) == "<|im_start|>user\nHi<|im_end|>\n"
    prompt = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert prompt == "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    no_think = tokenizer.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=True, enable_thinking=False
    )
    assert no_think == "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
    thinking = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True, enable_thinking=True)
    assert thinking == prompt


def test_single_turn_golden(tokenizer):
    messages = [{"role": "user", "content": "What is two plus three?"}, {"role": "assistant", "content": "It is 5."}]
    input_ids, loss_mask = render_with_loss_mask(tokenizer, messages)
    assert len(input_ids) == len(loss_mask) and set(loss_mask) == {0, 1}
    supervised, context = split_by_mask(tokenizer, input_ids, loss_mask)
    assert supervised == "It is 5.<|im_end|>"
    assert context == "<|im_start|>user\nWhat is two plus three?<|im_end|>\n<|im_start|>assistant\n\n"
    assert tokenizer.decode(input_ids, skip_special_tokens=False) == tokenizer.apply_chat_template(
        messages, tokenize=False
    )


def test_multi_turn_with_system_golden(tokenizer):
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hello!"},
        {"role": "assistant", "content": "Hello! How can I help?"},
        {"role": "user", "content": "Add 2 and 3."},
        {"role": "assistant", "content": "5"},
    ]
    input_ids, loss_mask = render_with_loss_mask(tokenizer, messages)
    assert supervised_runs(tokenizer, input_ids, loss_mask) == ["Hello! How can I help?<|im_end|>", "5<|im_end|>"]
    _, context = split_by_mask(tokenizer, input_ids, loss_mask)
    assert context == (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHello!<|im_end|>\n<|im_start|>assistant\n"
        "\n<|im_start|>user\nAdd 2 and 3.<|im_end|>\n<|im_start|>assistant\n\n"
    )


def test_think_block_is_supervised(tokenizer):
    answer = "<think>\nTwo plus three: add them.\n</think>\n\nThe answer is 5."
    messages = [{"role": "user", "content": "What is two plus three?"}, {"role": "assistant", "content": answer}]
    input_ids, loss_mask = render_with_loss_mask(tokenizer, messages)
    assert supervised_runs(tokenizer, input_ids, loss_mask) == [answer + "<|im_end|>"]
    think_open = tokenizer.convert_tokens_to_ids("<think>")
    assert loss_mask[input_ids.index(think_open)] == 1


def test_thinking_disabled_leaves_empty_think_block_in_the_prompt(tokenizer):
    messages = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello! How can I help?"}]
    input_ids, loss_mask = render_with_loss_mask(tokenizer, messages, chat_template_kwargs={"enable_thinking": False})
    supervised, context = split_by_mask(tokenizer, input_ids, loss_mask)
    assert supervised == "Hello! How can I help?<|im_end|>"
    assert context == "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n\n"


def test_thinking_disabled_with_a_thought_is_not_prefix_stable(tokenizer):
    messages = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "<think>\nhm\n</think>\n\nHello"}]
    with pytest.raises(TemplateNotPrefixStableError, match="not prefix-stable"):
        render_with_loss_mask(tokenizer, messages, chat_template_kwargs={"enable_thinking": False})


def test_sharegpt_form_equals_openai_form(tokenizer):
    openai = {
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Add 2 and 3."},
            {"role": "assistant", "content": "<think>\nadd\n</think>\n\n5"},
        ]
    }
    sharegpt = {
        "conversations": [
            {"from": "system", "value": "Be brief."},
            {"from": "human", "value": "Add 2 and 3."},
            {"from": "gpt", "value": "<think>\nadd\n</think>\n\n5"},
        ]
    }
    from_openai = render_with_loss_mask(tokenizer, normalize_conversation(openai, "a:1"))
    from_sharegpt = render_with_loss_mask(tokenizer, normalize_conversation(sharegpt, "b:1"))
    assert from_openai == from_sharegpt


def test_mask_matches_character_spans_brute_force(tokenizer):
    messages = [
        {"role": "user", "content": "Write add."},
        {"role": "assistant", "content": "def add(a, b):\n    return a + b\n"},
        {"role": "user", "content": "Thanks"},
        {"role": "assistant", "content": " You are welcome "},
    ]
    text, spans = assistant_char_spans(tokenizer, messages)
    inside = [any(start <= i < end for start, end in spans) for i in range(len(text))]
    _, loss_mask = render_with_loss_mask(tokenizer, messages)
    offsets = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]
    assert loss_mask == [int(inside[start]) for start, _ in offsets]
    assert [text[start:end] for start, end in spans] == [
        "def add(a, b):\n    return a + b\n<|im_end|>",
        " You are welcome <|im_end|>",
    ]


def test_too_long_and_nothing_to_supervise(tokenizer):
    messages = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}]
    input_ids, _ = render_with_loss_mask(tokenizer, messages)
    assert render_with_loss_mask(tokenizer, messages, max_length=len(input_ids))[0] == input_ids
    with pytest.raises(BadRow) as too_long:
        render_with_loss_mask(tokenizer, messages, max_length=len(input_ids) - 1)
    assert too_long.value.reason == "too_long"
    with pytest.raises(BadRow) as unsupervised:
        render_with_loss_mask(tokenizer, [{"role": "system", "content": "x"}, {"role": "user", "content": "Hi"}])
    assert unsupervised.value.reason == "nothing_to_supervise"


def test_template_that_drops_earlier_thoughts_is_rejected(tokenizer):
    # Qwen3's own template strips reasoning from earlier assistant turns; a prefix then no longer matches.
    stripping = (
        "{%- for m in messages -%}<|im_start|>{{ m['role'] }}\n"
        "{%- if m['role'] == 'assistant' and not loop.last -%}{{ m['content'].split('</think>')[-1].lstrip() }}"
        "{%- else -%}{{ m['content'] }}{%- endif -%}<|im_end|>\n{%- endfor -%}"
        "{%- if add_generation_prompt -%}<|im_start|>assistant\n{%- endif -%}"
    )
    messages = [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "<think>\nhm\n</think>\n\nHello"},
        {"role": "user", "content": "Bye"},
        {"role": "assistant", "content": "Bye"},
    ]
    original = tokenizer.chat_template
    tokenizer.chat_template = stripping
    try:
        with pytest.raises(TemplateNotPrefixStableError, match=r"messages\[:2\]"):
            render_with_loss_mask(tokenizer, messages)
    finally:
        tokenizer.chat_template = original
