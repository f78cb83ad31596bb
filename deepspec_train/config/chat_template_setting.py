"""What ``data.chat_template`` may name: a built-in template or a Jinja file.

The recipe rules (``config.rules``) check the setting before anything is loaded, so the names live here, below
the data code; ``data.chat_templates`` holds the built-in templates' text and renders with them.
"""

from __future__ import annotations

from pathlib import Path

CHATML = "chatml"
BUILT_IN_TEMPLATE_NAMES = (CHATML,)


def chat_template_problem(setting: str) -> str | None:
    """Why ``data.chat_template = setting`` is unusable (None when empty, a built-in name or a file)."""
    if not setting or setting in BUILT_IN_TEMPLATE_NAMES or Path(setting).expanduser().is_file():
        return None
    return (
        f"data.chat_template = {setting!r} is neither a built-in template ({', '.join(BUILT_IN_TEMPLATE_NAMES)}) nor "
        f"a Jinja file"
    )
