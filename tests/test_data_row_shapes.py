"""Row shapes (``data.format``, ``data.fields``): what each shape reads, per-source detection and its refusal of
mixed sources, plain text supervised on every token, pre-rendered chat text masked as a rendered conversation,
the chat template a base model needs, and the one-line refusal of data a run cannot use.

Masks are checked against brute force: the pair shapes against the same conversation rendered directly, plain
text against its own tokenisation, pre-rendered text against ``render_with_loss_mask`` of the conversation it
was rendered from.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from transformers import AutoTokenizer

from deepspec_train.data import token_shards
from deepspec_train.config.chat_template_setting import BUILT_IN_TEMPLATE_NAMES
from deepspec_train.data.chat_templates import (
    BUILT_IN_TEMPLATES, ChatTemplateMissingError, chat_template_problem, with_chat_template,
)
from deepspec_train.data.chatml_template import CHATML_TEMPLATE
from deepspec_train.data.data_summary import DataSummary, SourceSummary
from deepspec_train.data.loss_mask import render_text, render_with_loss_mask
from deepspec_train.data.row_shapes import SHAPES, field_map
from deepspec_train.data.shape_detection import MixedShapesError
from deepspec_train.data.turn_markers import turn_markers
from deepspec_train.data.usable_rows import UnusableDataError, require_usable_rows
from tests.helpers.chat_tokenizer import build_chat_tokenizer

MAX_LENGTH = 128
THINKING_OFF = {"enable_thinking": False}


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    return build_chat_tokenizer(tmp_path_factory.mktemp("chat_tokenizer"))


@pytest.fixture(scope="module")
def base_tokenizer(tmp_path_factory, tokenizer):
    """The chat tokenizer saved without its chat template and loaded back, as a pretrained checkpoint's is."""
    directory = tmp_path_factory.mktemp("base_tokenizer")
    tokenizer.save_pretrained(str(directory))
    for name in ("chat_template.jinja", "chat_template.json"):
        (directory / name).unlink(missing_ok=True)
    config = json.loads((directory / "tokenizer_config.json").read_text())
    config.pop("chat_template", None)
    (directory / "tokenizer_config.json").write_text(json.dumps(config))
    loaded = AutoTokenizer.from_pretrained(str(directory))
    assert not loaded.chat_template
    return loaded


def write_rows(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def build(tokenizer, sources, cache: Path, row_format: str = "auto", fields=None, kwargs=None):
    renderer = token_shards.ConversationRenderer(
        tokenizer, MAX_LENGTH, kwargs, row_format=row_format, fields=field_map(fields or {})
    )
    return token_shards.build_token_dataset([str(s) for s in sources], renderer, str(cache), progress=False)


def user_assistant(prompt: str, answer: str) -> list[dict]:
    return [{"role": "user", "content": prompt}, {"role": "assistant", "content": answer}]


PAIRS = {
    "prompt_completion": ({"prompt": "Hi there", "completion": "Hello, how are you?"},
                          user_assistant("Hi there", "Hello, how are you?")),
    "prompt_response": ({"prompt": "2+3?", "response": "<think>\nadd\n</think>\n\n5"},
                        [{"role": "user", "content": "2+3?"},
                         {"role": "assistant", "content": "5", "reasoning_content": "add"}]),
    "question_answer": ({"question": "What is two plus three?", "answer": "Five."},
                        user_assistant("What is two plus three?", "Five.")),
    "alpaca": ({"instruction": "Add the numbers.", "input": "2 and 3", "output": "5"},
               user_assistant("Add the numbers.\n\n2 and 3", "5")),
    "alpaca without input": ({"instruction": "Say hello.", "input": "", "output": "Hello!"},
                             user_assistant("Say hello.", "Hello!")),
}


@pytest.mark.parametrize("case", sorted(PAIRS))
def test_a_pair_row_is_the_user_and_assistant_conversation(tokenizer, tmp_path, case) -> None:
    row, messages = PAIRS[case]
    dataset, summary = build(tokenizer, [write_rows(tmp_path / "rows.jsonl", [row, row])], tmp_path / "cache")
    expected = render_with_loss_mask(tokenizer, messages, MAX_LENGTH)
    assert summary.kept == 2 and summary.sources[0].shape == case.split()[0] and summary.sources[0].detected
    assert (dataset[0]["input_ids"], dataset[0]["loss_mask"]) == expected


def test_renamed_fields_are_read_and_detected(tokenizer, tmp_path) -> None:
    rows = [{"query": "Hi there", "reply": "Hello, how are you?"}] * 3
    source = write_rows(tmp_path / "rows.jsonl", rows)
    renamed = {"prompt": "query", "completion": "reply"}
    dataset, summary = build(tokenizer, [source], tmp_path / "cache", fields=renamed)
    assert summary.sources[0].shape == "prompt_completion" and summary.kept == 3
    assert (dataset[0]["input_ids"], dataset[0]["loss_mask"]) == render_with_loss_mask(
        tokenizer, user_assistant("Hi there", "Hello, how are you?"), MAX_LENGTH
    )
    _, unnamed = build(tokenizer, [source], tmp_path / "unnamed")
    assert unnamed.kept == 0 and unnamed.skipped == {"missing_field": 3} and unnamed.sources[0].shape is None
    assert unnamed.first_bad["where"] == f"{source}:1" and "match no row shape" in unnamed.first_bad["detail"]


def test_each_source_gets_its_own_shape(tokenizer, tmp_path) -> None:
    chat = write_rows(tmp_path / "chat.jsonl", [{"messages": user_assistant("Hi", "Hello!")}])
    qa = write_rows(tmp_path / "qa.jsonl", [{"question": "Hi", "answer": "Hello!"}])
    dataset, summary = build(tokenizer, [chat, qa], tmp_path / "cache")
    assert [(s.shape, s.kept, s.read) for s in summary.sources] == [("chat", 1, 1), ("question_answer", 1, 1)]
    assert dataset[0]["input_ids"] == dataset[1]["input_ids"] and dataset["sample_id"] == [0, 1]


def test_a_source_that_mixes_shapes_is_refused_in_one_line(tokenizer, tmp_path) -> None:
    source = write_rows(tmp_path / "mixed.jsonl", [{"question": "a", "answer": "b"}, {"text": "plain"}])
    with pytest.raises(MixedShapesError) as caught:
        build(tokenizer, [source], tmp_path / "cache")
    message = str(caught.value)
    assert "\n" not in message and f"{source}:1 is a question_answer row" in message
    assert f"{source}:2 is a text row" in message and "data.format" in message
    # A named format reads every row as that shape: the other rows are skipped, counted and located.
    _, summary = build(tokenizer, [source], tmp_path / "named", row_format="question_answer")
    assert summary.kept == 1 and summary.skipped == {"missing_field": 1}
    assert summary.first_bad["where"] == f"{source}:2"


def test_openai_and_sharegpt_rows_may_still_share_a_source(tokenizer, tmp_path) -> None:
    rows = [{"messages": user_assistant("Hi", "Hello!")},
            {"conversations": [{"from": "human", "value": "Hi"}, {"from": "gpt", "value": "Hello!"}]}]
    dataset, summary = build(tokenizer, [write_rows(tmp_path / "rows.jsonl", rows)], tmp_path / "cache")
    assert summary.kept == 2 and dataset[0]["input_ids"] == dataset[1]["input_ids"]


def test_text_rows_are_supervised_on_every_token_but_the_first(base_tokenizer, tmp_path) -> None:
    texts = ["The quick brown fox jumps over the lazy dog.", "def add(a, b): return a + b", "x"]
    source = write_rows(tmp_path / "text.jsonl", [{"text": text} for text in texts] + [{"text": "  "}])
    dataset, summary = build(base_tokenizer, [source], tmp_path / "cache")
    assert summary.sources[0].shape == "text"
    ids = [base_tokenizer(text)["input_ids"] for text in texts[:2]]
    assert dataset["input_ids"] == ids
    assert dataset["loss_mask"] == [[0] + [1] * (len(i) - 1) for i in ids]
    assert summary.skipped == {"nothing_to_supervise": 2}


def test_preformatted_text_gets_the_mask_of_the_conversation_it_renders(tokenizer, tmp_path) -> None:
    conversations = [
        user_assistant("Hi there", "Hello, how are you?"),
        [{"role": "system", "content": "Be brief."}, *user_assistant("Hello", "Hi"), *user_assistant("Bye", "Bye!")],
        [{"role": "user", "content": "2+3?"}, {"role": "assistant", "content": "5", "reasoning_content": "add"}],
    ]
    for kwargs in (None, THINKING_OFF):
        usable = [m for m in conversations if kwargs is None or "reasoning_content" not in m[-1]]
        rows = [{"text": render_text(tokenizer, messages, False, kwargs)} for messages in usable]
        source = write_rows(tmp_path / f"pre-{kwargs is None}.jsonl", rows)
        cache = tmp_path / f"cache-{kwargs is None}"
        dataset, summary = build(tokenizer, [source], cache, "preformatted", kwargs=kwargs)
        assert summary.kept == len(usable)
        for index, messages in enumerate(usable):
            expected = render_with_loss_mask(tokenizer, messages, MAX_LENGTH, kwargs)
            assert (dataset[index]["input_ids"], dataset[index]["loss_mask"]) == expected


def test_turn_markers_come_from_the_template(tokenizer) -> None:
    markers = turn_markers(tokenizer, THINKING_OFF)
    assert markers.opening == "<|im_start|>assistant\n<think>\n\n</think>\n\n" and markers.closing == "<|im_end|>"


def test_chat_rows_for_a_tokenizer_without_template_stop_in_one_line(base_tokenizer, tmp_path) -> None:
    source = write_rows(tmp_path / "qa.jsonl", [{"question": "Hi", "answer": "Hello!"}])
    for row_format in ("auto", "preformatted"):
        with pytest.raises(ChatTemplateMissingError) as caught:
            build(base_tokenizer, [source], tmp_path / f"cache-{row_format}", row_format)
        assert "data.chat_template" in str(caught.value) and "\n" not in str(caught.value)
    assert not any((tmp_path / "cache-auto").iterdir()), "a refused build leaves no cache entry"


def test_data_chat_template_gives_a_base_model_a_template(base_tokenizer, tokenizer, tmp_path) -> None:
    jinja = tmp_path / "template.jinja"
    jinja.write_text(CHATML_TEMPLATE)
    messages = user_assistant("Hi there", "Hello, how are you?")
    expected = render_with_loss_mask(tokenizer, messages, MAX_LENGTH)
    for setting in ("chatml", str(jinja)):
        loaded = AutoTokenizer.from_pretrained(base_tokenizer.name_or_path)
        assert render_with_loss_mask(with_chat_template(loaded, setting), messages, MAX_LENGTH) == expected
    assert "neither a built-in template (chatml) nor a Jinja file" in chat_template_problem("no-such-template")


def test_the_recipe_rules_know_every_built_in_template() -> None:
    """The recipe check (``config``, below ``data``) names the built-in templates; each name has a template here."""
    assert tuple(BUILT_IN_TEMPLATES) == BUILT_IN_TEMPLATE_NAMES


def test_rows_that_cannot_fill_a_step_are_refused_naming_source_reason_and_line() -> None:
    source = SourceSummary("gsm8k.jsonl", "chat", False, read=10, kept=2, skipped={"missing_field": 8},
                           first_bad={"reason": "missing_field", "where": "gsm8k.jsonl:3", "detail": "no list"})
    summary = DataSummary(kept=2, skipped={"missing_field": 8}, sources=[source])
    with pytest.raises(UnusableDataError) as caught:
        require_usable_rows(summary, "train", 4, "one step's 4 (train.global_batch_sequences)", 1.0)
    message = str(caught.value)
    assert message.startswith("data.train: 2 usable rows, fewer than one step's 4 (train.global_batch_sequences)")
    assert "gsm8k.jsonl: 10 rows read as chat (data.format=chat), 2 kept, skipped 8 missing_field" in message
    assert "(first: gsm8k.jsonl:3: missing_field (no list))" in message
    assert all(shape in message for shape in SHAPES) and "change data.format, data.fields" in message
    with pytest.raises(UnusableDataError, match=r"more than 50% of a source's rows skipped .*max_skipped_fraction"):
        require_usable_rows(summary, "train", 2, "one step", 0.5)
    require_usable_rows(summary, "train", 2, "one step", 0.8)
    too_long = SourceSummary("long.jsonl", "text", True, read=4, kept=1, skipped={"too_long": 3})
    with pytest.raises(UnusableDataError, match="change data.max_length"):
        require_usable_rows(DataSummary(kept=1, sources=[too_long]), "validation", 2, "one validation pass", 1.0)


def test_the_data_page_shows_every_shape_with_its_example() -> None:
    page = (Path(__file__).resolve().parents[1] / "docs" / "howto" / "data.md").read_text()
    for shape in SHAPES.values():
        # Pipes are escaped inside the page's table.
        assert f"| `{shape.name}` | `{shape.example_line().replace('|', chr(92) + '|')}`" in page, shape.name
