"""What the regeneration runner needs from a backend that produces the target's answers.

A backend turns conversations (lists of ``{"role", "content"}`` messages ending in a user turn) into assistant
answers. Per-conversation failures that survived the backend's retries come back as ``GenerationError`` values
in the result list, so one bad request does not cost the other answers of the same call.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from deepspec_train.regenerate.sampling import SamplingParams

Message = dict[str, str]


class GenerationError(Exception):
    """One conversation could not be answered. ``reason`` is short and free of per-request detail (it is used
    to count failures by kind); ``detail`` carries the rest."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason
        self.detail = detail


class ChatBackend(Protocol):
    # How many conversations the runner should hand over at once (a batch, or the number of requests in flight).
    max_in_flight: int
    # True: answers are produced together in one ``generate`` call (a padded batch), so the runner should call
    # it with whole chunks. False: requests are independent, so the runner keeps ``max_in_flight`` rows going
    # and writes each as soon as it finishes.
    batched: bool

    def generate(
        self, conversations: Sequence[Sequence[Message]], sampling: SamplingParams
    ) -> list[str | GenerationError]: ...
