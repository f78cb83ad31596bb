"""The side files SGLang reads next to a DSpark export, and the strict JSON they must be written in.

- STS file (``--speculative-dspark-confidence-sts-path``), written by ``deepspec calibrate`` and copied next to
  the export by ``deepspec export --calibration``: ``{"temperatures": [T_1..T_gamma], "num_samples": int,
  "ece_before": [...], "ece_after": [...], "dataset": str}``; only ``temperatures`` (all > 0) is required.
  SGLang applies them as ``sigmoid(z_k / T_k)``. vLLM reads no temperatures.
- SPS table (``--speculative-dspark-sps-table-path``), written by ``deepspec profile-sps``:
  ``{"sample_batch_tokens": [strictly increasing ints >= 1], "sample_steps_per_sec": [floats],
  "max_batch_tokens": int >= the last probe}``. The batch axis is the total verify tokens of a step (requests +
  admitted drafts); SGLang looks up the largest probe <= B with no interpolation (hence dense probes), and
  treats a one-probe table as not profiled. vLLM profiles its own cost curves.

SGLang decodes both with msgspec, which refuses a bare ``NaN`` / ``Infinity`` anywhere in the file, so every
file here goes through ``strict_json_dumps`` (non-finite floats become ``null`` or are refused) and is read back
with ``strict_json_loads`` (which refuses them).
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

STS_FILENAME = "sglang_sts.json"


def _finite_or_none(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite_or_none(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite_or_none(v) for v in value]
    return value


def strict_json_dumps(data: Any) -> str:
    """JSON text with every non-finite float written as ``null`` (never a bare NaN / Infinity)."""
    return json.dumps(_finite_or_none(data), indent=2, allow_nan=False) + "\n"


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"non-standard JSON constant {name} (strict parsers such as SGLang's refuse it)")


def strict_json_loads(text: str) -> Any:
    """``json.loads`` that refuses ``NaN``, ``Infinity`` and ``-Infinity`` as a strict parser does."""
    return json.loads(text, parse_constant=_refuse_constant)


def write_strict_json(path: str | os.PathLike, data: Any) -> Path:
    """Write ``data`` as strict JSON, atomically (a crash never leaves a truncated file)."""
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text(strict_json_dumps(data))
    os.replace(tmp, out)
    return out


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def check_sts(data: Any, where: str = "STS file") -> None:
    """Raise ``ValueError`` (one line) unless ``data`` is an STS file SGLang accepts."""
    if not isinstance(data, dict):
        raise ValueError(f"{where}: expected a JSON object, got {type(data).__name__}")
    temps = data.get("temperatures")
    if not isinstance(temps, list) or not temps or not all(_is_number(t) and t > 0 for t in temps):
        raise ValueError(f"{where}: temperatures = {temps!r} is not a non-empty list of positive numbers")
    if "num_samples" in data and (not isinstance(data["num_samples"], int) or isinstance(data["num_samples"], bool)
                                  or data["num_samples"] < 0):
        raise ValueError(f"{where}: num_samples = {data['num_samples']!r} is not a non-negative integer")
    for key in ("ece_before", "ece_after"):
        if key in data and not (isinstance(data[key], list) and all(_is_number(v) for v in data[key])):
            raise ValueError(f"{where}: {key} = {data[key]!r} is not a list of finite numbers")
    if "dataset" in data and not isinstance(data["dataset"], str):
        raise ValueError(f"{where}: dataset = {data['dataset']!r} is not a string")
    unknown = set(data) - {"temperatures", "num_samples", "ece_before", "ece_after", "dataset"}
    if unknown:
        raise ValueError(f"{where}: unknown keys {sorted(unknown)}")


def sts_payload(
    temperatures: Sequence[float],
    num_samples: int,
    ece_before: Sequence[float] | None = None,
    ece_after: Sequence[float] | None = None,
    dataset: str | None = None,
) -> dict[str, Any]:
    """The STS file's content. ECE lists with a non-finite entry (a position without data) are left out rather
    than written as numbers they are not."""
    data: dict[str, Any] = {"temperatures": [float(t) for t in temperatures], "num_samples": int(num_samples)}
    for key, values in (("ece_before", ece_before), ("ece_after", ece_after)):
        if values is not None and all(math.isfinite(v) for v in values):
            data[key] = [float(v) for v in values]
    if dataset:
        data["dataset"] = dataset
    check_sts(data)
    return data


def _read_checked(path: str | os.PathLike, check: Callable[[Any, str], None]) -> dict[str, Any]:
    data = strict_json_loads(Path(path).read_text())
    check(data, str(path))
    return data


def read_sts(path: str | os.PathLike) -> dict[str, Any]:
    """A validated STS file."""
    return _read_checked(path, check_sts)


def check_sps(data: Any, where: str = "SPS table") -> None:
    """Raise ``ValueError`` (one line) unless ``data`` is an SPS table SGLang accepts and can use."""
    if not isinstance(data, dict):
        raise ValueError(f"{where}: expected a JSON object, got {type(data).__name__}")
    probes, speeds = data.get("sample_batch_tokens"), data.get("sample_steps_per_sec")
    top = data.get("max_batch_tokens")
    ints = isinstance(probes, list) and all(isinstance(b, int) and not isinstance(b, bool) for b in probes)
    if not ints or len(probes) < 2 or probes[0] < 1 or any(b <= a for a, b in zip(probes, probes[1:])):
        raise ValueError(f"{where}: sample_batch_tokens must be >= 2 strictly increasing ints >= 1 (one probe "
                         f"reads as not profiled), got {probes!r}")
    if not isinstance(speeds, list) or len(speeds) != len(probes) or not all(_is_number(s) and s > 0 for s in speeds):
        raise ValueError(f"{where}: sample_steps_per_sec must hold {len(probes)} positive numbers, got {speeds!r}")
    if not isinstance(top, int) or isinstance(top, bool) or top < probes[-1]:
        raise ValueError(f"{where}: max_batch_tokens = {top!r} must be an int >= the last probe ({probes[-1]})")
    unknown = set(data) - {"sample_batch_tokens", "sample_steps_per_sec", "max_batch_tokens"}
    if unknown:
        raise ValueError(f"{where}: unknown keys {sorted(unknown)}")


def sps_payload(batch_tokens: Sequence[int], steps_per_s: Sequence[float], max_batch_tokens: int) -> dict[str, Any]:
    """SGLang's SPS table for probes ``batch_tokens`` (validated)."""
    data = {
        "sample_batch_tokens": [int(b) for b in batch_tokens],
        "sample_steps_per_sec": [float(s) for s in steps_per_s],
        "max_batch_tokens": int(max_batch_tokens),
    }
    check_sps(data)
    return data


def read_sps(path: str | os.PathLike) -> dict[str, Any]:
    """A validated SGLang SPS table."""
    return _read_checked(path, check_sps)
