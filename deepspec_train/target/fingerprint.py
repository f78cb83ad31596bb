"""Which target a drafter was trained for: a fingerprint of the target's architecture and of the two tensors a
drafter copies from it (embedding and LM head), recorded at training time and checked by export and evaluation.

Two targets of the same shape with other weights (another fine-tune, another checkpoint) give drafters that
look loadable but draft for the wrong model; comparing fingerprints refuses that pairing in one line naming both
targets. The fingerprint is computed from the target directory's files alone (``config.json`` and the safetensors
header / data of the two head tensors, read in their stored dtype), so the colocated run, a streamed drafter
worker, ``deepspec export`` and ``deepspec eval`` all compute the same value. Hashing streams the two tensors'
bytes through BLAKE2b: about 2.5 GB for Qwen3-8B's bf16 heads, a few seconds once per run.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Mapping, Optional

from deepspec_train.common.errors import UserError

# The config.json fields that define what a drafter for this target computes (not paths, versions or dtypes).
ARCHITECTURE_FIELDS = (
    "model_type", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
    "num_key_value_heads", "head_dim", "vocab_size", "rms_norm_eps", "rope_theta", "rope_parameters",
    "rope_scaling", "tie_word_embeddings", "max_position_embeddings", "num_experts", "num_experts_per_tok",
)


class TargetMismatch(UserError, ValueError):
    """A drafter paired with a target other than the one it was trained for (one-line message)."""


@dataclass(frozen=True)
class TargetFingerprint:
    """``architecture``: digest of the architecture fields of config.json; ``heads``: digest of the embedding and
    LM-head tensors; ``path``: where the target was when the fingerprint was taken (for messages only)."""

    architecture: str
    heads: str
    path: str

    def to_dict(self) -> dict[str, str]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "TargetFingerprint":
        return cls(str(data["architecture"]), str(data["heads"]), str(data.get("path", "")))

    def same_target(self, other: "TargetFingerprint") -> bool:
        return self.architecture == other.architecture and self.heads == other.heads


def _architecture_digest(config: Mapping[str, Any]) -> str:
    fields = {key: config[key] for key in ARCHITECTURE_FIELDS if key in config}
    return hashlib.blake2b(json.dumps(fields, sort_keys=True).encode(), digest_size=16).hexdigest()


def _heads_digest(target_path: Path) -> str:
    import torch
    from safetensors import safe_open

    from deepspec_train.target.head_weights import EMBED_KEYS, LM_HEAD_KEYS, tensor_locations

    locations = tensor_locations(target_path)
    digest = hashlib.blake2b(digest_size=16)
    for keys in (EMBED_KEYS, LM_HEAD_KEYS):
        key = next((k for k in keys if k in locations), None)
        digest.update((key or "tied").encode())
        if key is None:
            continue
        with safe_open(str(locations[key]), framework="pt") as f:
            tensor = f.get_tensor(key)
        digest.update(str(tuple(tensor.shape)).encode() + str(tensor.dtype).encode())
        # Row blocks keep the temporary byte copy small for a 151,936-row vocabulary.
        for rows in tensor.split(8192):
            digest.update(rows.contiguous().view(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def target_fingerprint(target_path: str | Path) -> TargetFingerprint:
    """The fingerprint of the target directory ``target_path`` (config.json + safetensors)."""
    root = Path(target_path)
    config = json.loads((root / "config.json").read_text())
    return TargetFingerprint(_architecture_digest(config), _heads_digest(root), str(root))


def check_same_target(recorded: Optional[Mapping[str, Any]], target_path: str | Path, what: str) -> None:
    """Refuse ``target_path`` when ``recorded`` (a fingerprint dict saved with ``what``) names another target;
    nothing to check when ``what`` predates fingerprints (``recorded`` None)."""
    if not recorded:
        return
    trained = TargetFingerprint.from_dict(recorded)
    given = target_fingerprint(target_path)
    if trained.same_target(given):
        return
    differs = "architecture (config.json)" if trained.architecture != given.architecture else "embedding / LM-head weights"
    raise TargetMismatch(
        f"{what} was trained for the target at {trained.path or '(unrecorded path)'} but --target {target_path} is "
        f"a different model: its {differs} differ (fingerprints {trained.architecture}/{trained.heads} vs "
        f"{given.architecture}/{given.heads})"
    )
