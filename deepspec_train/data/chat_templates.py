"""The chat template that renders chat-shaped rows: the target tokenizer's own, or ``data.chat_template``.

A base model's tokenizer (a pretrained checkpoint) has no chat template. Such a target trains on plain ``text``
rows as it is; chat-shaped rows (and ``preformatted`` ones, whose turn markers are read off the template) need
``data.chat_template``: a built-in name (``BUILT_IN_TEMPLATES``) or a Jinja file, which then also replaces a
template the tokenizer has. Training, ``deepspec data check``, regeneration and the evaluator's prompt rendering
all ask ``require_chat_template`` before they render, so each stops with the same one line instead of
transformers' traceback.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from deepspec_train.config.chat_template_setting import CHATML, chat_template_problem
from deepspec_train.data.chatml_template import CHATML_TEMPLATE
from deepspec_train.common.errors import UserError

BUILT_IN_TEMPLATES = {CHATML: CHATML_TEMPLATE}


class ChatTemplateMissingError(UserError):
    """Rows that are rendered with a chat template, for a tokenizer that has none and no ``data.chat_template``."""


def with_chat_template(tokenizer: Any, setting: str, setting_name: str = "data.chat_template") -> Any:
    """``tokenizer`` with the template ``setting`` names (unchanged when ``setting`` is empty)."""
    problem = chat_template_problem(setting)
    if problem is not None:
        raise UserError(problem.replace("data.chat_template", setting_name, 1))
    if setting:
        built_in = BUILT_IN_TEMPLATES.get(setting)
        tokenizer.chat_template = built_in if built_in is not None else Path(setting).expanduser().read_text()
    return tokenizer


def require_chat_template(tokenizer: Any, what: str, setting_name: str = "data.chat_template") -> None:
    """Raise ``ChatTemplateMissingError`` naming ``what`` and the setting that gives a template (``setting_name``:
    the recipe key, or a command's option) when ``tokenizer`` has no chat template."""
    if getattr(tokenizer, "chat_template", None):
        return
    text_rows = ", or give plain text rows (data.format=text)" if setting_name == "data.chat_template" else ""
    raise ChatTemplateMissingError(
        f"{what} needs a chat template, and the target's tokenizer has none (a base model): set {setting_name} "
        f"(a built-in name: {', '.join(BUILT_IN_TEMPLATES)}; or a Jinja file){text_rows}"
    )


def chat_tokenizer(tokenizer: Any, setting: str, what: str, setting_name: str) -> Any:
    """``tokenizer`` with ``setting``'s template, checked to have one (what regeneration and the evaluator,
    which render every prompt with it, call before they load the model)."""
    tokenizer = with_chat_template(tokenizer, setting, setting_name)
    require_chat_template(tokenizer, what, setting_name)
    return tokenizer
