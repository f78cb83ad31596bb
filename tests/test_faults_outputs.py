"""Fault matrix, outputs: every command that writes makes its output folders, or refuses in one line with exit
status 2, before it does any work.

Each verb gets an output path it cannot write (a file standing where its folder must be; a folder on a
read-only filesystem mounted here; a folder its user has no permission to write) and inputs that do not exist:
the refusal must name the output, so it came before the inputs were even read. A writable output path that
does not exist yet is created (``profile-sps --out sps/sps.json`` used to lose its whole measurement at the save).
"""

from __future__ import annotations

import os
import subprocess
import sys
import traceback
from pathlib import Path

import pytest

from deepspec_train.commands.dispatch import main
from deepspec_train.common.output_paths import ensure_output_dir, ensure_output_file
from tests.helpers.streaming_world import REPO, recipe_overrides


def verb_argv(verb: str, out: Path, missing: Path, world: dict[str, str]) -> list[str]:
    """The command line of ``verb`` writing to ``out`` (a folder, or a file inside it) and reading ``missing``."""
    argv = {
        "train": ["train", *recipe_overrides(world, out)],
        "train-cache": ["train", *recipe_overrides(world, missing, **{"data.cache_dir": str(out)})],
        "eval": ["eval", "--target", str(missing), "--drafter", str(missing), "--suite", str(missing),
                 "--out", str(out / "results.json")],
        "eval-traces": ["eval", "--target", str(missing), "--drafter", str(missing), "--suite", str(missing),
                        "--out", str(missing.with_name("results.json")), "--save-traces", str(out / "traces.jsonl")],
        "calibrate": ["calibrate", "--traces", str(missing), "--out", str(out)],
        "export": ["export", "--drafter", str(missing), "--target", str(missing), "--out", str(out)],
        "profile-sps": ["profile-sps", "--target", str(missing), "--out", str(out / "sps.json")],
        "simulate": ["simulate", "--traces", str(missing), "--sps", str(missing), "--out", str(out)],
        "compare": ["compare", str(missing), "--out", str(out)],
        "regenerate": ["regenerate", "--input", str(missing), "--out", str(out / "answers.jsonl")],
        "tinyworld": ["tinyworld", "build", "--out", str(out)],
    }
    return argv[verb]


VERBS = ["train", "train-cache", "eval", "eval-traces", "calibrate", "export", "profile-sps", "simulate", "compare",
         "regenerate", "tinyworld"]


def refusal(capsys: pytest.CaptureFixture, argv: list[str]) -> str:
    assert main(argv) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), lines
    return lines[0]


@pytest.mark.parametrize("verb", VERBS)
def test_a_file_where_the_output_folder_must_be_is_refused_first(verb, streaming_world, tmp_path, capsys) -> None:
    blocker = tmp_path / "taken"
    blocker.write_text("a file, not a folder\n")
    out = blocker / "out"
    line = refusal(capsys, verb_argv(verb, out, tmp_path / "missing", streaming_world))
    assert str(out) in line and "a file stands where a folder must be" in line, line
    assert not (tmp_path / "missing").exists()


@pytest.fixture
def read_only_dir(tmp_path: Path):
    """A folder on a read-only filesystem (a tmpfs mounted read-only here); skipped where mounting is refused."""
    folder = tmp_path / "ro"
    folder.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", str(folder)],
                             capture_output=True, text=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a read-only tmpfs here: {mounted.stderr.strip()}")
    try:
        yield folder
    finally:
        subprocess.run(["umount", str(folder)], check=True)


@pytest.mark.parametrize("verb", VERBS)
def test_a_read_only_filesystem_is_refused_first(verb, streaming_world, read_only_dir, tmp_path, capsys) -> None:
    out = read_only_dir / "out"
    line = refusal(capsys, verb_argv(verb, out, tmp_path / "missing", streaming_world))
    assert str(out) in line and "read-only filesystem" in line, line


def run_as_nobody(argv: list[str], log: Path) -> tuple[int, str]:
    """``deepspec *argv`` in a forked child that became user nobody (root may write anywhere); its exit status and
    stderr. Forked rather than started: nobody may not read this machine's Python installation, and the verb's
    module is imported before the fork for the same reason."""
    from deepspec_train.commands.dispatch import VERBS

    VERBS[argv[0]].load()
    with open(log, "w") as err:
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                sys.stderr = err
                os.setgid(65534)
                os.setuid(65534)
                code = main(argv)
            except BaseException:
                traceback.print_exc(file=err)
            finally:
                err.flush()
                os._exit(code)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status), log.read_text()


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0, reason="switching to user nobody needs root")
@pytest.mark.parametrize("verb", ["profile-sps", "export", "simulate", "eval"])
def test_no_permission_is_refused_first(verb, streaming_world, tmp_path) -> None:
    closed = tmp_path / "closed"
    closed.mkdir(mode=0o755)
    out = closed / "out"
    code, err = run_as_nobody(verb_argv(verb, out, tmp_path / "missing", streaming_world), tmp_path / "stderr")
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1, err
    assert str(out) in lines[0] and "no permission" in lines[0], lines[0]


def test_the_data_preparation_script_refuses_a_read_only_output(read_only_dir, tmp_path) -> None:
    out = read_only_dir / "prompts"
    proc = subprocess.run(
        [sys.executable, "data/prepare_open_perfectblend.py", "--source", str(tmp_path / "missing"), "--out", str(out)],
        cwd=REPO, capture_output=True,
        text=True, timeout=120, env=os.environ | {"PYTHONPATH": str(REPO), "DEEPSPEC_DEBUG": "0"},
    )
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert str(out) in proc.stderr and "read-only filesystem" in proc.stderr, proc.stderr


def test_missing_output_folders_are_created(tmp_path) -> None:
    nested = tmp_path / "a" / "b"
    assert ensure_output_dir(nested) == nested and nested.is_dir()
    sps = tmp_path / "sps" / "sps.json"
    assert ensure_output_file(sps) == sps and sps.parent.is_dir() and not sps.exists()
    # No probe file is left behind.
    assert list(nested.iterdir()) == [] and list(sps.parent.iterdir()) == []
    with pytest.raises(Exception, match="a folder stands where the file must be"):
        ensure_output_file(nested)
