"""Sampling parameters used when the target rewrites the assistant turns of a prompt set.

Both backends (local transformers, OpenAI-compatible HTTP) take one ``SamplingParams``; the defaults are the
ones DeepSpec used to regenerate its training answers, and ``from_recipe`` reads them from a recipe's
``regenerate`` section so a run records which sampling produced its data.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from deepspec_train.regenerate.settings import RegenerateConfig


@dataclass(frozen=True)
class SamplingParams:
    """How the target samples an answer. ``temperature == 0`` means greedy decoding; ``top_k == 0`` disables
    top-k filtering."""

    temperature: float = 0.7
    top_p: float = 0.8
    top_k: int = 20
    max_new_tokens: int = 4096
    enable_thinking: bool = False

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0 (0 disables it), got {self.top_k}")
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    @classmethod
    def from_recipe(cls, cfg: RegenerateConfig) -> SamplingParams:
        return cls(
            temperature=cfg.temperature,
            top_p=cfg.top_p,
            top_k=cfg.top_k,
            max_new_tokens=cfg.max_new_tokens,
            enable_thinking=cfg.enable_thinking,
        )

    def with_overrides(self, **overrides: Any) -> SamplingParams:
        """A copy with the given fields replaced; ``None`` values mean "keep" (unset command-line flags)."""
        return dataclasses.replace(self, **{k: v for k, v in overrides.items() if v is not None})
