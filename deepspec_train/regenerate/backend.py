"""What the regeneration runner needs from a backend that produces the target's answers.

A backend turns conversations (lists of ``{"role", "content"}`` messages ending in a user turn) into assistant
answers. Per-conversation failures that survived the backend's retries come back as ``GenerationError`` values
in the result list, so one bad request does not cost the other answers of the same call. A backend that decodes
many answers at once and can take a new conversation whenever one ends (``StreamingBackend``, the local one) is
fed conversations one at a time and hands each answer back as soon as it is done.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterator, Sequence
from dataclasses import dataclass
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


@dataclass
class Completion:
    text: str
    prompt_tokens: int
    completion_tokens: int
    # "stop": the model ended its turn; "length": cut at max_new_tokens (OpenAI's names).
    finish_reason: str


@dataclass(frozen=True)
class TurnRequest:
    """One assistant turn to generate: ``key`` names it for the caller; ``seed_key`` (the row id and the turn, say)
    names it for the backend's random stream, so two rows with the same prompt get their own answers."""

    key: Hashable
    conversation: list[Message]
    seed_key: str = ""


# Called after every decoding step with the answer tokens it generated and each unfinished answer's length so far,
# before the answers the step finished are handed back.
StepHook = Callable[[int, list[int]], None]


class StreamingBackend(ChatBackend, Protocol):
    def stream(
        self, next_request: Callable[[], TurnRequest | None], sampling: SamplingParams, on_step: StepHook | None = None
    ) -> Iterator[tuple[TurnRequest, Completion]]:
        """Answer every request ``next_request`` gives, each handed back as soon as it is done. ``next_request``
        returns None when it has nothing now; it is asked again while answers are in flight (the caller may add a
        conversation's next turn when its answer comes back), and the stream ends when it has nothing and no
        answer is left in flight."""
        ...
