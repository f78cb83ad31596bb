"""Rebuild a drafter module from an export (any layout in ``serving_layouts.layout_registry``) or from a training output
dir.

``load_exported_drafter(path)`` accepts:

- an export directory (``config.json`` + ``model.safetensors``): the layout is read from ``architectures``, the
  checkpoint goes through ``validate_layout`` (the exporter's own check) before anything is built, and the layout
  record's ``read`` turns the config back into drafter settings (the kind registry tells the kind from them);
- a training output directory ``<run>/drafter`` (``drafter_config.json`` + ``drafter.safetensors``, trainable
  weights only), or the run directory ``<run>`` itself, so evaluation works before export.

An export's config is checked by its layout (``validate_layout``, and the layout record's reading) on fields that
no kind can load; no recipe is rebuilt from it. A training directory's config was written from a recipe that
passed ``kinds.recipe_validation.load_recipe`` and is trusted.

Frozen target heads come from the export when it holds them (DSpark layout), otherwise (the layout's
``from_target`` tensors) from ``target_path`` (default: the training run's recorded target) via
``load_head_weights``. The module is built on the meta device and its tensors assigned from the checkpoint, so no
random initialisation runs for production-size drafters. It is returned in eval mode with gradients off, in the
checkpoint's float dtype unless ``dtype`` is given.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

import torch
from safetensors import safe_open
from torch import nn

from deepspec_train.config.schema import DrafterConfig
from deepspec_train.formats.published_drafters import check_fits_target, read_drafter_weights
from deepspec_train.serving_layouts.eagle3_layout import check_draft_vocab
from deepspec_train.serving_layouts.layout_registry import layout_of_config, serving_layout, validate_layout
from deepspec_train.serving_layouts.layout_checks import TensorSpec
from deepspec_train.formats.trained_drafter import is_trained_drafter_dir, read_trained_drafter
from deepspec_train.kinds.registry import kind_of_export, kind_spec
from deepspec_train.models.draft_vocab import stored_draft_vocab
from deepspec_train.models.geometry import DrafterGeometry, geometry_from_target_config
from deepspec_train.target.fingerprint import check_same_target
from deepspec_train.target.head_weights import load_head_weights

# A training output's tensors indexed by target token id (its trainable tensors and the vocabulary maps).
TRAINED_VOCAB_TENSORS = ("markov_head.markov_w1.weight", "t2d")

if TYPE_CHECKING:
    from deepspec_train.models.block_drafting import BlockDrafter

EXPORT_CONFIG = "config.json"
# Our addition to an export's config.json (engines ignore it): the fingerprint of the target it was trained for.
FINGERPRINT_FIELD = "training_target_fingerprint"
EXPORT_WEIGHTS = "model.safetensors"

_SAFETENSORS_DTYPES = {
    "F64": torch.float64,
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "I64": torch.int64,
    "I32": torch.int32,
    "I16": torch.int16,
    "I8": torch.int8,
    "U8": torch.uint8,
    "BOOL": torch.bool,
}


@dataclass
class LoadedDrafter:
    """A drafter ready for inference, with what an evaluator needs to drive it.

    ``source`` is ``"training"`` or the export layout it was read from. ``mask_token_id`` is None for EAGLE-3.
    ``labels`` is the label convention the weights were trained with (``"dspark"``: slot k predicts the token
    after its position; ``"zlab"``: slot j >= 1 predicts the token at its own position).
    """

    module: nn.Module
    kind: str
    block_size: int
    target_layer_ids: list[int]
    mask_token_id: int | None
    confidence_temperatures: list[float] | None
    labels: str
    source: str
    # The training target's fingerprint (``target.fingerprint``), when the files recorded one.
    target_fingerprint: dict[str, Any] | None = None
    # The drafter settings the files describe (a training directory's recipe section, or an export's config as
    # its layout reads it); None for a drafter built in memory.
    settings: DrafterConfig | None = None

    def block_drafter(self) -> "BlockDrafter":
        """The evaluator's drafting strategy for this drafter (its kind's, with its label convention)."""
        return kind_spec(self.kind).block_drafter(self.module, self.labels)

    def confidences(self, logits: torch.Tensor) -> torch.Tensor:
        """Calibrated conditional confidences ``sigmoid(z_k / T_k)`` for ``logits [..., K]``, ``K <= block_size``
        (``T_k = 1`` when the drafter is uncalibrated)."""
        num = logits.shape[-1]
        if num > self.block_size:
            raise ValueError(f"{num} confidence logits for a block of {self.block_size}")
        temps = self.confidence_temperatures or [1.0] * self.block_size
        scale = torch.tensor(temps[:num], dtype=logits.dtype, device=logits.device)
        return torch.sigmoid(logits / scale)


def read_tensor_specs(path: str | Path) -> dict[str, TensorSpec]:
    """Name -> shape/dtype of every tensor in a safetensors file, read from its header only."""
    specs = {}
    with safe_open(str(path), framework="pt") as f:
        for name in f.keys():  # noqa: SIM118 - safe_open handles are not mappings
            view = f.get_slice(name)
            dtype = view.get_dtype()
            if dtype not in _SAFETENSORS_DTYPES:
                raise ValueError(f"{path}: tensor {name} has unsupported dtype {dtype}")
            specs[name] = TensorSpec(tuple(int(n) for n in view.get_shape()), _SAFETENSORS_DTYPES[dtype])
    return specs


def resolve_drafter_dir(path: str | Path) -> Path:
    """The directory holding the drafter files: ``path`` itself, or ``path/drafter`` for a training run dir."""
    root = Path(path)
    if is_trained_drafter_dir(root) or (root / EXPORT_CONFIG).is_file():
        return root
    if is_trained_drafter_dir(root / "drafter"):
        return root / "drafter"
    raise FileNotFoundError(f"{root}: neither an export ({EXPORT_CONFIG}) nor a training output (<run>/drafter)")


def _weights_dtype(state: dict[str, torch.Tensor]) -> torch.dtype:
    for tensor in state.values():
        if tensor.is_floating_point():
            return tensor.dtype
    raise ValueError("checkpoint holds no floating-point weights")


def _target_heads(target_path: str | None, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    if not target_path:
        raise ValueError("this checkpoint omits the frozen target embedding / LM head: pass target_path")
    embed, lm_head = load_head_weights(target_path)
    embed, lm_head = embed.to(dtype), lm_head.to(dtype)
    # A tied target returns one tensor for both; two module parameters must not share storage (safetensors
    # refuses to save shared tensors, and an in-place update of one would change the other).
    if lm_head.data_ptr() == embed.data_ptr():
        lm_head = lm_head.clone()
    return embed, lm_head


def _materialise(build: Callable[[], nn.Module], state: dict[str, torch.Tensor]) -> nn.Module:
    """Build on the meta device, then assign every tensor from ``state`` (all must be present, no extra)."""
    with torch.device("meta"):
        module = build()
    try:
        module.load_state_dict(state, strict=True, assign=True)
    except RuntimeError as err:
        raise ValueError(f"checkpoint does not fit the drafter it describes: {err}") from err
    leftover = [name for name, t in [*module.named_parameters(), *module.named_buffers()] if t.is_meta]
    if leftover:
        raise ValueError(f"checkpoint left drafter tensors unset: {leftover}")
    return module.eval().requires_grad_(False)


def _build(
    drafter_cfg: DrafterConfig,
    geometry: DrafterGeometry,
    layer_ids: list[int],
    state: dict[str, torch.Tensor],
) -> nn.Module:
    spec = kind_spec(drafter_cfg.kind)
    if "d2t" in state and "t2d" in state:
        check_draft_vocab(state["d2t"], state["t2d"])
    # Built outside the meta context first: the kind may add the buffers it derives (identity maps) to ``state``.
    spec.complete_state(drafter_cfg, geometry, state)
    return _materialise(lambda: spec.build_from_state(drafter_cfg, geometry, layer_ids, state), state)


def _from_training_dir(root: Path, target_path: str | None, check_target: bool) -> LoadedDrafter:
    trained = read_trained_drafter(root)
    drafter_cfg, geometry, layer_ids = trained.drafter, trained.geometry, trained.target_layer_ids
    target_path = target_path or trained.target_path
    if target_path and check_target:
        check_same_target(trained.target_fingerprint, target_path, f"the drafter in {root}")
    elif target_path:
        check_fits_target(TRAINED_VOCAB_TENSORS,
                          {"hidden_size": geometry.hidden_size, "vocab_size": geometry.vocab_size},
                          trained.weights, layer_ids, None, target_path, f"the drafter in {root}")
    state = dict(trained.weights)
    spec = kind_spec(trained.kind)
    embed, lm_head = _target_heads(target_path, _weights_dtype(state))
    state.update(spec.frozen_head_state(embed, lm_head, stored_draft_vocab(state)))
    module = _build(drafter_cfg, geometry, layer_ids, state)
    return LoadedDrafter(
        module=module,
        kind=trained.kind,
        block_size=drafter_cfg.block_size,
        target_layer_ids=layer_ids,
        mask_token_id=drafter_cfg.mask_token_id if spec.uses_mask_token else None,
        confidence_temperatures=None,
        labels=drafter_cfg.labels,
        source="training",
        target_fingerprint=trained.target_fingerprint,
        settings=drafter_cfg,
    )


def _export_geometry(config: dict[str, Any], num_target_layers: int) -> DrafterGeometry:
    # An export config is the target's config with the drafter's depth in num_hidden_layers; the geometry reader
    # expects the target's depth there.
    return geometry_from_target_config(SimpleNamespace(**{**config, "num_hidden_layers": num_target_layers}))


def _from_export_dir(root: Path, target_path: str | None, check_target: bool) -> LoadedDrafter:
    config = json.loads((root / EXPORT_CONFIG).read_text())
    fingerprint = config.get(FINGERPRINT_FIELD)
    if target_path and check_target:
        check_same_target(fingerprint, target_path, f"the export in {root}")
    layout = serving_layout(layout_of_config(config))
    # Published drafters come sharded, pickled or (EAGLE-3) without taps: see formats.published_drafters.
    state = read_drafter_weights(root)
    config, state = layout.complete_published(config, state, target_path)
    validate_layout(layout.name, config, state)
    dtype = _weights_dtype(state)
    reading = layout.read(config)
    kind = kind_of_export(layout.name, reading.drafter)
    drafter_cfg = dataclasses.replace(reading.drafter, kind=kind.name)
    geometry = _export_geometry(config, reading.num_target_layers)
    if target_path and (fingerprint is None or not check_target):
        # Nothing records the training target: check that the drafter's shapes and vocabulary fit this one.
        check_fits_target(layout.target_vocab_tensors, config, state, list(reading.target_layer_ids),
                          reading.mask_token_id, target_path, f"the drafter in {root}")
    if layout.from_target:
        heads = kind.frozen_head_state(*_target_heads(target_path, dtype), stored_draft_vocab(state))
        state.update({name: tensor for name, tensor in heads.items() if name in layout.from_target})
    module = _build(drafter_cfg, geometry, reading.target_layer_ids, state)
    return LoadedDrafter(
        module=module,
        kind=drafter_cfg.kind,
        block_size=drafter_cfg.block_size,
        target_layer_ids=list(reading.target_layer_ids),
        mask_token_id=reading.mask_token_id,
        confidence_temperatures=reading.confidence_temperatures,
        labels=drafter_cfg.labels,
        source=layout.name,
        target_fingerprint=fingerprint,
        settings=drafter_cfg,
    )


def load_exported_drafter(
    path: str | Path,
    target_path: str | None = None,
    device: str | torch.device = "cpu",
    dtype: torch.dtype | None = None,
    check_target: bool = True,
) -> LoadedDrafter:
    """Load a drafter export or training output (see the module docstring) onto ``device``. ``check_target``
    False (fine-tuning a drafter for another target) replaces the fingerprint check by ``check_fits_target``."""
    root = resolve_drafter_dir(path)
    if is_trained_drafter_dir(root):
        loaded = _from_training_dir(root, target_path, check_target)
    else:
        loaded = _from_export_dir(root, target_path, check_target)
    loaded.module.to(device=device, dtype=dtype)
    return loaded
