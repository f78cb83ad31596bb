"""Tests for the progress of ``deepspec regenerate`` (``regenerate.progress``): rows of work that move with every
decoding step, an ETA from the work left at this run's rate, and the bar as a user sees it (or does not, with
``--no-progress``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from deepspec_train.regenerate import cli, runner
from deepspec_train.regenerate.local_backend import LocalBackend
from deepspec_train.regenerate.progress import RegenerateProgress
from deepspec_train.regenerate.runner import regenerate_file
from tests.helpers.regeneration import SAMPLING, write_jsonl
from tests.helpers.tiny_chat_model import save_tiny_chat_model

pytestmark = pytest.mark.usefixtures("one_torch_thread")

ROWS = [{"id": n, "messages": [{"role": "user", "content": f"question {n}"}]} for n in range(5)]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    return save_tiny_chat_model(tmp_path_factory.mktemp("tiny_chat_model"))


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_rows_of_work_and_eta_from_the_work_left() -> None:
    clock = Clock()
    progress = RegenerateProgress(total_rows=10, max_new_tokens=400, enabled=False, clock=clock)
    progress.skip()
    progress.skip()
    # Before any row ends an answer is expected to run to max_new_tokens: two rows a quarter of the way are half a
    # row of work.
    clock.now = 10.0
    progress.step(200, [100, 100])
    assert progress.work_done() == pytest.approx(0.5)
    # Half a row of work in 10 s; 10 rows, 2 skipped on resume (not this run's work, not in the rate): 150 s left.
    assert progress.eta_seconds() == pytest.approx(150.0)
    assert progress.describe() == "20.0 answer tok/s, ETA 02:30, failed 0"
    # A row ends at 120 tokens and another takes its slot. Expected now: 200 + 20 tokens generated per row ended;
    # the row in flight at 110 tokens is half way, the new one at 10 a 22nd of the way.
    clock.now = 20.0
    progress.step(20, [110])
    progress.row_finished(failed=False)
    progress.step(10, [110, 10])
    assert progress.expected_tokens() == 230
    assert progress.work_done() == pytest.approx(1 + 120 / 230)
    assert progress.eta_seconds() == pytest.approx((10 - 2 - (1 + 120 / 230)) / ((1 + 120 / 230) / 20))
    progress.row_finished(failed=True)
    assert progress.describe().endswith("failed 1")


def test_progress_without_total_or_tokens_moves_row_by_row() -> None:
    clock = Clock()
    progress = RegenerateProgress(total_rows=None, max_new_tokens=100, enabled=False, clock=clock)
    clock.now = 4.0
    progress.row_finished(failed=False)
    assert progress.work_done() == 1 and progress.eta_seconds() is None
    assert progress.describe() == "failed 0"


def test_local_regeneration_moves_the_bar_before_any_row_ends(model_dir: str, tmp_path: Path, monkeypatch) -> None:
    seen: list[tuple[int, float]] = []
    counted: list[int] = []

    class Recording(RegenerateProgress):
        def step(self, new_tokens, in_flight):
            super().step(new_tokens, in_flight)
            seen.append((self.answered, self.work_done()))

        def row_finished(self, failed):
            super().row_finished(failed)
            counted.append(self.answered + len(self.in_flight))

    monkeypatch.setattr(runner, "RegenerateProgress", Recording)
    source = write_jsonl(tmp_path / "prompts.jsonl", ROWS)
    summary = regenerate_file(source, str(tmp_path / "out.jsonl"), LocalBackend(model_dir, batch_size=2), SAMPLING)
    assert summary.done == 5
    assert any(answered == 0 and 0 < work < 1 for answered, work in seen), seen
    # A row that ends is counted once: done, and no longer in flight.
    assert max(counted) == 5 and counted[-1] == 5
    # Reported at every step, not once per row.
    assert len(seen) > 2 * summary.done


def test_bar_shows_tokens_per_second_and_no_progress_hides_it(model_dir: str, tmp_path: Path, capsys) -> None:
    source = write_jsonl(tmp_path / "prompts.jsonl", ROWS[:2])
    argv = ["--input", source, "--backend", "local", "--model", model_dir, "--max-new-tokens", "4"]
    assert cli.main([*argv, "--out", str(tmp_path / "shown.jsonl")]) == 0
    shown = capsys.readouterr().err
    assert "regenerate: 100%" in shown and "2.0/2 rows" in shown and "answer tok/s" in shown, shown
    assert cli.main([*argv, "--out", str(tmp_path / "hidden.jsonl"), "--no-progress"]) == 0
    assert "regenerate" not in capsys.readouterr().err
