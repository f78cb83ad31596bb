"""The Qwen3-style ChatML chat template used by the tiny world's tokenizer and by the data tests.

Turns render as ``<|im_start|>{role}\\n{content}<|im_end|>\\n``. ``add_generation_prompt`` appends the
assistant header. Like Qwen3, the template reads an ``enable_thinking`` keyword: when it is passed and false,
the generation prompt ends with an empty ``<think>\\n\\n</think>\\n\\n`` block, which is what a Qwen3 target
sees when it answers with thinking disabled. An assistant message with a ``reasoning_content`` field (the
normalised form of ``data.conversations``) is written as Qwen3 writes it, ``<think>\\n{reasoning}\\n</think>\\n\\n``
before the content; Qwen3's own template reads the same field.

Unlike Qwen3's own template, earlier assistant turns are rendered verbatim, reasoning included (Qwen3 strips
the reasoning of turns before the last user message), so that the rendering of ``messages[:i]`` plus a
generation prompt is a prefix of the rendering of ``messages[:i+1]``: the loss-mask builder relies on this to
find each assistant span. For the same reason, with thinking disabled an assistant turn without reasoning (and
whose content does not open with ``<think>``, for callers that pass un-normalised messages) is rendered after
the same empty think block the generation prompt ends with.
"""

THINK_OPEN = "<think>"
EMPTY_THINK_BLOCK = "<think>\n\n</think>\n\n"

CHATML_TEMPLATE = (
    "{%- set thinking_off = enable_thinking is defined and not enable_thinking -%}"
    "{%- for message in messages -%}"
    "{%- if message['role'] not in ['system', 'user', 'assistant'] -%}"
    "{{- raise_exception('ChatML template: unsupported role ' ~ message['role']) -}}"
    "{%- endif -%}"
    "{{- '<|im_start|>' ~ message['role'] ~ '\\n' -}}"
    "{%- if message['role'] == 'assistant' and message['reasoning_content'] is string -%}"
    "{{- '<think>\\n' ~ message['reasoning_content'] ~ '\\n</think>\\n\\n' -}}"
    "{%- elif message['role'] == 'assistant' and thinking_off"
    " and not message['content'].startswith('" + THINK_OPEN + "') -%}"
    "{{- '<think>\\n\\n</think>\\n\\n' -}}"
    "{%- endif -%}"
    "{{- message['content'] ~ '<|im_end|>\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}"
    "{{- '<|im_start|>assistant\\n' -}}"
    "{%- if thinking_off -%}{{- '<think>\\n\\n</think>\\n\\n' -}}{%- endif -%}"
    "{%- endif -%}"
)
