"""The drafter's RoPE follows the target's ``rope_parameters`` exactly as transformers applies them.

Checked against transformers' own ``Qwen3RotaryEmbedding`` built from the same config (a fresh module per call,
as a model sees its first batch): cos / sin for default, linear, dynamic (below and past the trained length),
YaRN (with and without explicit attention factor / truncation) and llama3 scaling; then a whole drafter forward
whose rotary embedding is swapped for transformers' equals ours, and differs from plain RoPE, so the test can fail.
Unsupported types are refused before a drafter is built; drafter_config.json files written before the geometry
carried RoPE settings still load as plain RoPE.
"""

from __future__ import annotations

import json

import pytest
import torch
from transformers import Qwen3Config
from transformers.models.qwen3.modeling_qwen3 import Qwen3RotaryEmbedding

from deepspec_train.config.schema import DrafterConfig
from deepspec_train.export.exporter import export_drafter
from deepspec_train.formats.drafter_loader import load_exported_drafter
from deepspec_train.models.eagle3_drafter import Eagle3Drafter
from deepspec_train.models.draft_vocab import build_draft_vocab
from deepspec_train.models.geometry import check_target_rope, geometry_from_target_config
from deepspec_train.models.parallel_drafter import ParallelDrafter
from deepspec_train.models.qwen3_layers import RotaryEmbedding
from tests.helpers.scaled_rope_targets import HEAD_DIM, MAX_POS, SCALINGS, scaled_config
from tests.helpers.trained_drafters import random_batch, tiny_recipe, trained_drafter, write_training_output
from tests.helpers.slot_logits import slot_logits


def transformers_cos_sin(config: Qwen3Config, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    rotary = Qwen3RotaryEmbedding(config)
    return rotary(torch.zeros(1, dtype=torch.float32), positions.reshape(1, -1))


POSITIONS = {"short": torch.tensor([0, 1, 5, 17, 40, 63]), "long": torch.tensor([0, 3, 70, 150, 299])}


@pytest.mark.parametrize("span", sorted(POSITIONS))
@pytest.mark.parametrize("name", sorted(SCALINGS))
def test_cos_sin_equal_transformers(name, span):
    config = scaled_config(name)
    positions = POSITIONS[span]
    geometry = geometry_from_target_config(config)
    cos, sin = RotaryEmbedding.for_geometry(geometry).cos_sin(positions.reshape(1, -1))
    hf_cos, hf_sin = transformers_cos_sin(config, positions)
    torch.testing.assert_close(cos, hf_cos, rtol=0, atol=1e-6)
    torch.testing.assert_close(sin, hf_sin, rtol=0, atol=1e-6)
    if name != "default" and not (name == "dynamic" and span == "short"):
        plain_cos, _ = RotaryEmbedding(HEAD_DIM, 10000.0).cos_sin(positions.reshape(1, -1))
        assert not torch.allclose(cos, plain_cos, atol=1e-3)


class _TransformersRotary(torch.nn.Module):
    """Our ``cos_sin`` interface on top of a fresh transformers rotary module per call."""

    def __init__(self, config: Qwen3Config) -> None:
        super().__init__()
        self.config = config
        # Ask the drafters for the forward's length, whatever the type (transformers ignores it unless dynamic).
        self.dynamic = True

    def cos_sin(self, positions: torch.Tensor, seq_len: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        # One transformers forward whose largest position is seq_len - 1 (its dynamic scaling length).
        flat = positions.reshape(-1)
        if seq_len is not None and seq_len > 0:
            flat = torch.cat([flat, torch.tensor([seq_len - 1])])
        cos, sin = transformers_cos_sin(self.config, flat)
        n = positions.numel()
        return cos[0, :n].reshape(*positions.shape, -1), sin[0, :n].reshape(*positions.shape, -1)


def _drafter_for(config: Qwen3Config, kind: str) -> torch.nn.Module:
    geometry = geometry_from_target_config(config)
    torch.manual_seed(0)
    if kind == "eagle3":
        cfg = DrafterConfig(kind="eagle3", num_layers=1, block_size=4, ttt_steps=4)
        return Eagle3Drafter(geometry, cfg, [0, 1, 2], build_draft_vocab(torch.ones(97), None)).eval()
    cfg = DrafterConfig(kind="dspark", num_layers=2, block_size=4, markov_rank=8, mask_token_id=96)
    return ParallelDrafter(geometry, cfg, [0, 2]).eval()


@pytest.mark.parametrize("kind", ["dspark", "eagle3"])
@pytest.mark.parametrize("name", ["linear", "dynamic", "yarn", "llama3"])
def test_drafter_forward_equals_one_with_transformers_rotary(name, kind):
    # Positions past the trained length, where dynamic scaling moves too: long sequences, anchors up to 200+.
    config = scaled_config(name)
    drafter = _drafter_for(config, kind)
    batch = random_batch(kind, seed=3)
    if kind == "eagle3":
        # EAGLE-3 pairs context rows with their successor positions: keep them consecutive, shift them far out.
        batch.ctx_pos = batch.ctx_pos + 150
        batch.block_anchor = batch.block_anchor + 150
    else:
        batch.ctx_pos = batch.ctx_pos * 7
        batch.block_anchor = batch.block_anchor * 7
    with torch.no_grad():
        ours = slot_logits(drafter, batch)
        drafter.rotary = _TransformersRotary(config)
        reference = slot_logits(drafter, batch)
        drafter.rotary = RotaryEmbedding(HEAD_DIM, 10000.0)
        plain = slot_logits(drafter, batch)
    torch.testing.assert_close(ours, reference, rtol=1e-5, atol=1e-5)
    assert (ours - plain).abs().max() > 1e-2


def test_eagle3_drafter_uses_the_target_rope():
    config = scaled_config("yarn")
    geometry = geometry_from_target_config(config)
    cfg = DrafterConfig(kind="eagle3", num_layers=1, block_size=4, ttt_steps=4)
    drafter = Eagle3Drafter(geometry, cfg, [0, 1, 2], build_draft_vocab(torch.ones(97), None))
    positions = torch.arange(100).reshape(1, -1)
    hf_cos, hf_sin = transformers_cos_sin(config, positions)
    cos, sin = drafter.rotary.cos_sin(positions)
    torch.testing.assert_close((cos, sin), (hf_cos, hf_sin), rtol=0, atol=1e-6)


@pytest.mark.parametrize(
    "params, message",
    [
        ({"rope_type": "longrope", "long_factor": [1.0] * 8, "short_factor": [1.0] * 8, "factor": 2.0},
         "rope_type 'longrope' is not implemented"),
        ({"rope_type": "default", "partial_rotary_factor": 0.5}, "partial_rotary_factor 0.5 is not implemented"),
        ({"rope_type": "linear"}, "lack \\['factor'\\]"),
    ],
)
def test_unsupported_rope_is_refused_before_building(params, message):
    raw = {"hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": HEAD_DIM,
           "intermediate_size": 96, "num_hidden_layers": 4, "vocab_size": 97, "max_position_embeddings": MAX_POS,
           "rms_norm_eps": 1e-6, "rope_parameters": {"rope_theta": 1e4, **params}}
    with pytest.raises(ValueError, match=message):
        check_target_rope(raw)
    with pytest.raises(ValueError, match=message):
        geometry_from_target_config(type("Config", (), raw)())


def test_legacy_rope_scaling_fields_are_read():
    legacy = {"rope_theta": 5e5, "rope_scaling": {"type": "linear", "factor": 2.0}, "max_position_embeddings": 64}
    check_target_rope(legacy)
    config = type("Config", (), {**legacy, "hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2,
                                 "head_dim": 16, "intermediate_size": 96, "num_hidden_layers": 4,
                                 "vocab_size": 97, "rms_norm_eps": 1e-6})()
    geometry = geometry_from_target_config(config)
    assert geometry.rope_parameters == {"rope_type": "linear", "factor": 2.0, "rope_theta": 5e5}


def test_scaled_target_exports_and_old_drafter_configs_load_as_plain_rope(tmp_path):
    target = tmp_path / "target"
    from transformers import Qwen3ForCausalLM

    torch.manual_seed(1)
    Qwen3ForCausalLM(scaled_config("linear", tie_word_embeddings=False)).save_pretrained(str(target))
    cfg = tiny_recipe("dspark", str(target), intermediate_size=48)
    cfg.drafter.mask_token_id = 96
    drafter = trained_drafter(cfg)
    run = write_training_output(drafter, cfg, tmp_path / "run")
    meta = json.loads((run / "drafter_config.json").read_text())
    assert meta["geometry"]["rope_parameters"] == {"rope_type": "linear", "factor": 4.0, "rope_theta": 10000.0}
    out = export_drafter(run, str(target), tmp_path / "export", dtype=torch.float32)
    loaded = load_exported_drafter(out)
    assert loaded.module.geometry.rope_parameters["rope_type"] == "linear"
    batch = random_batch("dspark", 2)
    with torch.no_grad():
        torch.testing.assert_close(slot_logits(loaded.module, batch), slot_logits(drafter, batch), rtol=0, atol=0)
    # A drafter_config.json from before the field existed: plain RoPE, which no longer fits the scaled target.
    del meta["geometry"]["rope_parameters"]
    (run / "drafter_config.json").write_text(json.dumps(meta))
    old = load_exported_drafter(run)
    assert old.module.geometry.rope_parameters == {"rope_type": "default", "rope_theta": 10000.0}
    with pytest.raises(ValueError, match="rope_parameters: drafter"):
        export_drafter(run, str(target), tmp_path / "again")
