"""The generation settings of ``deepspec regenerate``: a recipe's ``regenerate`` section, read by that verb only.

Training never reads them, so they are not part of the training schema (``config.schema``); a recipe may still
carry the section, to record next to the training settings which sampling produced its data. Defaults are
DeepSpec's (temperature 0.7, top_p 0.8, top_k 20, up to 4096 new tokens, thinking off).
"""

from __future__ import annotations

from dataclasses import dataclass, field

SECTION = "regenerate"


@dataclass
class RegenerateConfig:
    temperature: float = 0.7
    top_p: float = 0.8
    top_k: int = 20
    max_new_tokens: int = 4096
    enable_thinking: bool = False
    endpoints: list[str] = field(default_factory=list)
    model: str = ""
    concurrency: int = 16
    retries: int = 3
    timeout_s: float = 600.0
    batch_size: int = 16
