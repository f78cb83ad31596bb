"""A drafter knows its target: training records the target's fingerprint (architecture fields of config.json and
a digest of the embedding / LM-head weights), and export and evaluation refuse any other target in one line that
names both, before any head weight is copied.

Probes from the issue: a target of the same shape with other weights used to export silently (its embedding /
LM head bundled into the drafter); a target of another width was refused with a message blaming the checkpoint.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from deepspec_train.commands.dispatch import main
from deepspec_train.export.exporter import export_drafter
from deepspec_train.formats.drafter_loader import FINGERPRINT_FIELD, load_exported_drafter
from deepspec_train.formats.trained_drafter import write_trained_drafter
from deepspec_train.target.fingerprint import TargetMismatch, target_fingerprint
from tests.helpers.trained_drafters import save_tiny_target, tiny_recipe, trained_drafter


@pytest.fixture(scope="module")
def targets(tmp_path_factory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("targets")
    original = save_tiny_target(root / "original")
    # Same config, other weights: one changed embedding row.
    retrained = root / "retrained"
    shutil.copytree(original, retrained)
    state = load_file(str(retrained / "model.safetensors"))
    state["model.embed_tokens.weight"][5] += 0.25
    save_file(state, str(retrained / "model.safetensors"), metadata={"format": "pt"})
    # Another width: the same recipe would need a drafter of another shape.
    wider = root / "wider"
    shutil.copytree(original, wider)
    config = json.loads((wider / "config.json").read_text())
    config["hidden_size"] = 48
    (wider / "config.json").write_text(json.dumps(config))
    return {"original": original, "retrained": str(retrained), "wider": str(wider)}


def _trained_run(tmp_path: Path, target: str) -> Path:
    cfg = tiny_recipe("dspark", target)
    out = tmp_path / "run" / "drafter"
    write_trained_drafter(trained_drafter(cfg), cfg, out, target_fingerprint(target).to_dict())
    return out


def test_fingerprint_depends_on_architecture_and_heads_only(targets, tmp_path) -> None:
    original = target_fingerprint(targets["original"])
    moved = tmp_path / "moved"
    shutil.copytree(targets["original"], moved)
    config = json.loads((moved / "config.json").read_text())
    config["transformers_version"] = "0.0.0"
    (moved / "config.json").write_text(json.dumps(config))
    assert original.same_target(target_fingerprint(moved))
    retrained, wider = target_fingerprint(targets["retrained"]), target_fingerprint(targets["wider"])
    assert retrained.architecture == original.architecture and retrained.heads != original.heads
    assert wider.architecture != original.architecture


def test_export_and_reload_with_the_training_target(targets, tmp_path) -> None:
    run = _trained_run(tmp_path, targets["original"])
    out = export_drafter(run, targets["original"], tmp_path / "export", dtype=torch.float32)
    recorded = json.loads((out / "config.json").read_text())[FINGERPRINT_FIELD]
    assert recorded == target_fingerprint(targets["original"]).to_dict()
    assert load_exported_drafter(out, targets["original"]).target_fingerprint == recorded


@pytest.mark.parametrize("other,differs", [("retrained", "embedding / LM-head weights"), ("wider", "architecture")])
def test_export_refuses_another_target(targets, tmp_path, other: str, differs: str) -> None:
    run = _trained_run(tmp_path, targets["original"])
    with pytest.raises(TargetMismatch) as info:
        export_drafter(run, targets[other], tmp_path / "export")
    message = str(info.value)
    assert targets["original"] in message and targets[other] in message and differs in message
    assert "\n" not in message and not (tmp_path / "export").exists()


def test_an_export_refuses_another_target_too(targets, tmp_path) -> None:
    out = export_drafter(_trained_run(tmp_path, targets["original"]), targets["original"], tmp_path / "export")
    with pytest.raises(TargetMismatch, match="embedding / LM-head weights differ"):
        load_exported_drafter(out, targets["retrained"])


def test_export_cli_names_both_targets_in_one_line(targets, tmp_path, capsys) -> None:
    run = _trained_run(tmp_path, targets["original"])
    code = main(["export", "--drafter", str(run), "--target", targets["retrained"], "--out", str(tmp_path / "e")])
    err = capsys.readouterr().err.strip()
    assert code != 0 and len(err.splitlines()) == 1 and targets["retrained"] in err and targets["original"] in err


def test_drafters_from_before_fingerprints_still_load(targets, tmp_path) -> None:
    cfg = tiny_recipe("dspark", targets["original"])
    out = tmp_path / "old" / "drafter"
    write_trained_drafter(trained_drafter(cfg), cfg, out)
    assert load_exported_drafter(out, targets["retrained"]).target_fingerprint is None
