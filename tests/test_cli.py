"""The `deepspec` console script: every verb is wired and answers --help; bad verbs fail."""

from __future__ import annotations

import subprocess
import sys

import pytest

from deepspec_train.jobs.cli import VERBS, main


def test_unknown_verb_fails(capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit) as info:
        main(["no-such-verb"])
    assert info.value.code == 2
    assert "invalid choice" in capsys.readouterr().err


@pytest.mark.parametrize("verb", sorted(VERBS))
def test_every_verb_has_help(verb: str) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "deepspec_train.jobs.cli", verb, "--help"], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    assert f"deepspec {verb}" in proc.stdout
