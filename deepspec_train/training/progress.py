"""Console progress bar for training: step, loss, throughput and ETA, shown by rank 0 only.

The trainer calls ``update`` on logging steps with the loss and throughput it has just reduced over the ranks, and
``advance`` on the others (reading the loss every step would stall a GPU stream); the bar's ETA comes from tqdm's
own rate estimate over optimizer steps, which already includes evaluation and checkpoint pauses.
"""

from __future__ import annotations

from typing import IO, Optional

from tqdm.auto import tqdm

from deepspec_train.common.console import is_main_process


class TrainProgress:
    """A tqdm bar over optimizer steps; a silent no-op when ``enabled`` is false or off rank 0.

    ``initial_step`` lets a resumed run start the bar where the checkpoint left off, so the ETA covers only the
    remaining steps.
    """

    def __init__(
        self,
        total_steps: int,
        enabled: bool = True,
        initial_step: int = 0,
        file: Optional[IO[str]] = None,
    ) -> None:
        self._bar: Optional[tqdm] = None
        if enabled and is_main_process():
            self._bar = tqdm(
                total=total_steps,
                initial=initial_step,
                desc="train",
                unit="step",
                dynamic_ncols=True,
                file=file,
                # Keep the bar's rate about the recent steps; the first steps include compilation and warm-up.
                smoothing=0.1,
            )

    @property
    def active(self) -> bool:
        return self._bar is not None

    def update(self, step: int, samples_per_s: float, sup_tokens_per_s: float, loss: float) -> None:
        """Move the bar to optimizer step ``step`` (absolute, not a delta) and show the latest measurements."""
        if self._bar is None:
            return
        advance = step - self._bar.n
        if advance > 0:
            self._bar.update(advance)
        self._bar.set_postfix(
            {"loss": f"{loss:.4f}", "samples/s": f"{samples_per_s:.1f}", "sup_tok/s": f"{sup_tokens_per_s:.0f}"},
            refresh=True,
        )

    def advance(self, step: int) -> None:
        """Move the bar to optimizer step ``step``, keeping the measurements shown."""
        if self._bar is not None and step > self._bar.n:
            self._bar.update(step - self._bar.n)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None

    def __enter__(self) -> "TrainProgress":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
