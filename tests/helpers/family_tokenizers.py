"""Test helper: fast tokenizers laid out like the published ones of Llama 3, Gemma 3, GPT-OSS (o200k_harmony),
DeepSeek-V3 and Kimi-K2, for the family scale tier and the target-distribution tests.

A layout keeps what a drafter or the data path reads: ``len(tokenizer)``, every special token at its real id
(with the learned tokens and filler entries around them), the bos / eos / pad tokens, and a chat template whose
renderings have the real template's shape. The BPE merges are learned from the test texts, so the ids of ordinary
text differ from the real tokenizer's (Gemma's SentencePiece, Kimi's tiktoken ranks and the others' byte-level
BPE are all stood for by one byte-level BPE); special ids, turn markers and what the loss mask supervises do not.
Kimi-K2 ships a tiktoken tokenizer that needs remote code; this copy is a plain fast tokenizer with its ids.
Reserved special tokens are named ``<|reserved_..._N|>`` as in the real files where that is their name (Llama,
GPT-OSS) and ``<|reserved_token_N|>`` for Kimi's unnamed ids.

The chat templates are written here (not copied) from the rendered formats:

- Llama 3.1: ``<|begin_of_text|>``, a system header that always carries the knowledge-cutoff lines, then
  ``<|start_header_id|>role<|end_header_id|>\\n\\ncontent<|eot_id|>``; generation prompt: the assistant header.
- Gemma 3: ``<bos>``, the system text folded into the first user turn, ``<start_of_turn>user|model\\n ...
  <end_of_turn>\\n``; generation prompt ``<start_of_turn>model\\n``.
- GPT-OSS harmony: the default system message (``Reasoning: medium``, valid channels), the recipe's system
  prompt as the developer message, ``<|start|>user<|message|>...<|end|>``; an assistant message is its reasoning
  (``thinking``, the field the real template reads; transformers' ``apply_chat_template`` fills it from the
  normalised ``reasoning_content``) as an analysis message
  ``<|start|>assistant<|channel|>analysis<|message|>...<|end|>`` when it has one, then its answer as the final
  message ``<|start|>assistant<|channel|>final<|message|>...<|return|>``; generation prompt ``<|start|>assistant``.
  The real template renders a training row's last assistant turn exactly so (analysis, final, ``<|return|>``, the
  token the target stops on), but renders earlier turns without their analysis and ending in ``<|end|>``, as the
  conversation's history reads at inference. That is not prefix-stable (``messages[:i+1]`` would render turn
  ``i`` as a last turn, the whole row as an earlier one), so this copy renders every assistant turn as the last one
  is rendered: a single-turn row reads as with the real template, and a multi-turn row keeps its earlier analyses
  and ``<|return|>`` tokens in the context of later turns (which the target saw without them). The loss mask
  supervises what the target writes after ``<|start|>assistant``: with reasoning supervised (the default) the
  ``<|channel|>analysis<|message|>`` header, the analysis text, its ``<|end|>``, the
  ``<|start|>assistant<|channel|>final<|message|>`` header, the final text and ``<|return|>``; with
  ``data.supervise_reasoning: false`` the turn's reasoning segment (everything before the final text) is context
  and only the final text and ``<|return|>`` are supervised. A turn without reasoning supervises
  ``<|channel|>final<|message|>``, the final text and ``<|return|>``.
- DeepSeek-V3: ``<｜begin▁of▁sentence｜>`` + system text, ``<｜User｜>...``, ``<｜Assistant｜>...<｜end▁of▁sentence｜>``.
- Kimi-K2: ``<|im_system|>system<|im_middle|>...<|im_end|>`` (Kimi's default system prompt when none is given),
  ``<|im_user|>user<|im_middle|>``, ``<|im_assistant|>assistant<|im_middle|>...<|im_end|>``.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import AutoTokenizer, PreTrainedTokenizerBase, PreTrainedTokenizerFast

LEARNED_MERGES_VOCAB = 1024


@dataclass(frozen=True)
class TokenizerLayout:
    """``size``: ``len(tokenizer)``; ``specials``: id -> special token; ``pinned``: the ids tests check."""

    name: str
    size: int
    specials: Mapping[int, str]
    bos: str | None
    eos: str
    pad: str
    chat_template: str
    pinned: Mapping[str, int]


def _llama3_specials() -> dict[int, str]:
    named = {128000: "<|begin_of_text|>", 128001: "<|end_of_text|>", 128004: "<|finetune_right_pad_id|>",
             128006: "<|start_header_id|>", 128007: "<|end_header_id|>", 128008: "<|eom_id|>", 128009: "<|eot_id|>",
             128010: "<|python_tag|>"}
    reserved = [i for i in range(128000, 128256) if i not in named]
    return named | {i: f"<|reserved_special_token_{n}|>" for n, i in enumerate(reserved)}


_LLAMA3_TEMPLATE = (
    "{{- bos_token -}}"
    "{%- if messages[0]['role'] == 'system' -%}{%- set system = messages[0]['content'] | trim -%}"
    "{%- set turns = messages[1:] -%}{%- else -%}{%- set system = '' -%}{%- set turns = messages -%}{%- endif -%}"
    "{{- '<|start_header_id|>system<|end_header_id|>\\n\\nCutting Knowledge Date: December 2023\\n"
    "Today Date: 26 Jul 2024\\n\\n' ~ system ~ '<|eot_id|>' -}}"
    "{%- for m in turns -%}"
    "{{- '<|start_header_id|>' ~ m['role'] ~ '<|end_header_id|>\\n\\n' ~ (m['content'] | trim) ~ '<|eot_id|>' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' -}}{%- endif -%}"
)

_GEMMA3_TEMPLATE = (
    "{{- bos_token -}}"
    "{%- if messages[0]['role'] == 'system' -%}{%- set prefix = (messages[0]['content'] | trim) ~ '\\n\\n' -%}"
    "{%- set turns = messages[1:] -%}{%- else -%}{%- set prefix = '' -%}{%- set turns = messages -%}{%- endif -%}"
    "{%- for m in turns -%}"
    "{%- set role = 'model' if m['role'] == 'assistant' else m['role'] -%}"
    "{{- '<start_of_turn>' ~ role ~ '\\n' ~ (prefix if loop.first else '') ~ (m['content'] | trim) "
    "~ '<end_of_turn>\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<start_of_turn>model\\n' -}}{%- endif -%}"
)

# The default system message the harmony template opens with (its date fixed: the real one writes today's).
HARMONY_SYSTEM_MESSAGE = (
    "<|start|>system<|message|>You are ChatGPT, a large language model trained by OpenAI.\nKnowledge cutoff: "
    "2024-06\nCurrent date: 2025-06-28\n\nReasoning: medium\n\n# Valid channels: analysis, commentary, final. "
    "Channel must be included for every message.<|end|>"
)

_HARMONY_TEMPLATE = (
    "{{- " + json.dumps(HARMONY_SYSTEM_MESSAGE) + " -}}"
    "{%- for m in messages -%}"
    "{%- if m['role'] == 'system' -%}"
    "{{- '<|start|>developer<|message|># Instructions\\n\\n' ~ m['content'] ~ '<|end|>' -}}"
    "{%- elif m['role'] == 'user' -%}{{- '<|start|>user<|message|>' ~ m['content'] ~ '<|end|>' -}}"
    "{%- else -%}"
    "{%- if m['thinking'] is string -%}"
    "{{- '<|start|>assistant<|channel|>analysis<|message|>' ~ m['thinking'] ~ '<|end|>' -}}"
    "{%- endif -%}"
    "{{- '<|start|>assistant<|channel|>final<|message|>' ~ m['content'] ~ '<|return|>' -}}{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|start|>assistant' -}}{%- endif -%}"
)

_DEEPSEEK_V3_TEMPLATE = (
    "{{- bos_token -}}"
    "{%- for m in messages -%}"
    "{%- if m['role'] == 'system' -%}{{- m['content'] -}}"
    "{%- elif m['role'] == 'user' -%}{{- '<｜User｜>' ~ m['content'] -}}"
    "{%- else -%}{{- '<｜Assistant｜>' ~ m['content'] ~ '<｜end▁of▁sentence｜>' -}}{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<｜Assistant｜>' -}}{%- endif -%}"
)

_KIMI_K2_TEMPLATE = (
    "{%- if messages[0]['role'] != 'system' -%}"
    "{{- '<|im_system|>system<|im_middle|>You are Kimi, an AI assistant created by Moonshot AI.<|im_end|>' -}}"
    "{%- endif -%}"
    "{%- for m in messages -%}"
    "{%- set marker = {'system': '<|im_system|>', 'user': '<|im_user|>', 'assistant': '<|im_assistant|>'}"
    "[m['role']] -%}"
    "{{- marker ~ m['role'] ~ '<|im_middle|>' ~ m['content'] ~ '<|im_end|>' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_assistant|>assistant<|im_middle|>' -}}{%- endif -%}"
)


def _gemma3_specials() -> dict[int, str]:
    return {0: "<pad>", 1: "<eos>", 2: "<bos>", 3: "<unk>", 4: "<mask>", 105: "<start_of_turn>",
            106: "<end_of_turn>", 255999: "<start_of_image>", 256000: "<end_of_image>", 262144: "<image_soft_token>"}


def _harmony_specials() -> dict[int, str]:
    named = {199998: "<|startoftext|>", 199999: "<|endoftext|>", 200002: "<|return|>", 200003: "<|constrain|>",
             200005: "<|channel|>", 200006: "<|start|>", 200007: "<|end|>", 200008: "<|message|>", 200012: "<|call|>"}
    return named | {i: f"<|reserved_{i}|>" for i in range(200000, 201088) if i not in named}


def _deepseek_v3_specials() -> dict[int, str]:
    named = {128798: "<think>", 128799: "</think>", 128800: "<｜fim▁hole｜>", 128801: "<｜fim▁begin｜>",
             128802: "<｜fim▁end｜>", 128803: "<｜User｜>", 128804: "<｜Assistant｜>", 128805: "<|EOT|>",
             128806: "<｜tool▁calls▁begin｜>", 128807: "<｜tool▁calls▁end｜>", 128808: "<｜tool▁call▁begin｜>",
             128809: "<｜tool▁call▁end｜>", 128810: "<｜tool▁outputs▁begin｜>", 128811: "<｜tool▁outputs▁end｜>",
             128812: "<｜tool▁output▁begin｜>", 128813: "<｜tool▁output▁end｜>", 128814: "<｜tool▁sep｜>"}
    placeholders = {i: f"<｜place▁holder▁no▁{i - 128000}｜>" for i in range(128000, 128798)}
    return {0: "<｜begin▁of▁sentence｜>", 1: "<｜end▁of▁sentence｜>", 2: "<｜▁pad▁｜>"} | placeholders | named


def _kimi_k2_specials() -> dict[int, str]:
    named = {163584: "[BOS]", 163585: "[EOS]", 163586: "<|im_end|>", 163587: "<|im_user|>",
             163588: "<|im_assistant|>", 163590: "<|start_header_id|>", 163591: "<|end_header_id|>", 163593: "[EOT]",
             163594: "<|im_system|>", 163595: "<|tool_calls_section_begin|>", 163596: "<|tool_calls_section_end|>",
             163597: "<|tool_call_begin|>", 163598: "<|tool_call_argument_begin|>", 163599: "<|tool_call_end|>",
             163601: "<|im_middle|>", 163838: "[UNK]", 163839: "[PAD]"}
    return named | {i: f"<|reserved_token_{i - 163584}|>" for i in range(163584, 163840) if i not in named}


LLAMA3 = TokenizerLayout("llama3", 128256, _llama3_specials(), "<|begin_of_text|>", "<|eot_id|>",
                         "<|finetune_right_pad_id|>", _LLAMA3_TEMPLATE,
                         {"<|begin_of_text|>": 128000, "<|reserved_special_token_0|>": 128002,
                          "<|start_header_id|>": 128006, "<|eot_id|>": 128009})
GEMMA3 = TokenizerLayout("gemma3", 262145, _gemma3_specials(), "<bos>", "<eos>", "<pad>", _GEMMA3_TEMPLATE,
                         {"<pad>": 0, "<eos>": 1, "<bos>": 2, "<mask>": 4, "<start_of_turn>": 105,
                          "<end_of_turn>": 106})
HARMONY = TokenizerLayout("gpt-oss", 201088, _harmony_specials(), "<|startoftext|>", "<|return|>", "<|endoftext|>",
                          _HARMONY_TEMPLATE,
                          {"<|endoftext|>": 199999, "<|reserved_200000|>": 200000, "<|return|>": 200002,
                           "<|channel|>": 200005, "<|start|>": 200006, "<|end|>": 200007, "<|message|>": 200008})
DEEPSEEK_V3 = TokenizerLayout("deepseek-v3", 128815, _deepseek_v3_specials(), "<｜begin▁of▁sentence｜>",
                              "<｜end▁of▁sentence｜>", "<｜end▁of▁sentence｜>", _DEEPSEEK_V3_TEMPLATE,
                              {"<｜begin▁of▁sentence｜>": 0, "<｜end▁of▁sentence｜>": 1, "<｜User｜>": 128803,
                               "<｜Assistant｜>": 128804})
KIMI_K2 = TokenizerLayout("kimi-k2", 163840, _kimi_k2_specials(), "[BOS]", "[EOS]", "[PAD]", _KIMI_K2_TEMPLATE,
                          {"[BOS]": 163584, "[EOS]": 163585, "<|im_end|>": 163586, "<|im_assistant|>": 163588,
                           "<|im_middle|>": 163601, "<|reserved_token_5|>": 163589})

# Scale target (``models.scale_targets``) -> the layout of its tokenizer.
TOKENIZER_LAYOUTS = {
    "Llama-3.1-8B-Instruct": LLAMA3, "Llama-3.3-70B-Instruct": LLAMA3, "gemma-3-12b-it": GEMMA3,
    "gemma-3-27b-it": GEMMA3, "gpt-oss-20b": HARMONY, "gpt-oss-120b": HARMONY, "DeepSeek-V3": DEEPSEEK_V3,
    "Kimi-K2-Instruct": KIMI_K2,
}


def _learned(texts: Iterable[str]) -> tuple[list[str], list[tuple[str, str]]]:
    learner = Tokenizer(models.BPE())
    learner.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(vocab_size=LEARNED_MERGES_VOCAB,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    learner.train_from_iterator(texts, trainer=trainer)
    model = json.loads(learner.to_str())["model"]
    tokens = sorted(model["vocab"], key=model["vocab"].get)
    merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in model["merges"]]
    return tokens, merges


def build_layout_tokenizer(directory: str | Path, layout: TokenizerLayout,
                           texts: Iterable[str]) -> PreTrainedTokenizerBase:
    """Build, save to ``directory`` and reload (``AutoTokenizer``) a tokenizer laid out as ``layout``."""
    # The template's own words (Llama's knowledge-cutoff lines, harmony's system message) are learned too, so that
    # a rendered conversation is about as short as with the real tokenizer.
    learned, merges = _learned([*texts, layout.chat_template])
    free = (i for i in range(layout.size) if i not in layout.specials)
    vocab = {token: next(free) for token in learned}
    # Entries no merge produces: they only hold the ids of the real tokenizer's other learned tokens.
    vocab.update({f"<unused_{i}>": i for i in free})
    vocab.update({token: i for i, token in layout.specials.items()})
    backend = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    # Offsets keep the leading space of a byte-level token, so the loss mask assigns every character once.
    backend.post_processor = processors.ByteLevel(trim_offsets=False)
    backend.add_special_tokens([AddedToken(t, special=True, normalized=False)
                                for _, t in sorted(layout.specials.items())])
    wrapped = PreTrainedTokenizerFast(tokenizer_object=backend, bos_token=layout.bos, eos_token=layout.eos,
                                      pad_token=layout.pad, model_max_length=131072)
    wrapped.chat_template = layout.chat_template
    wrapped.save_pretrained(str(directory))
    tokenizer = AutoTokenizer.from_pretrained(str(directory))
    wrong = {t: tokenizer.convert_tokens_to_ids(t) for t, i in layout.pinned.items()
             if tokenizer.convert_tokens_to_ids(t) != i}
    if wrong or len(tokenizer) != layout.size:
        raise AssertionError(f"{layout.name}: ids differ from the real layout: {wrong}, {len(tokenizer)} entries")
    return tokenizer
