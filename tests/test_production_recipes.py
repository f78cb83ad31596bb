"""Production recipes (Qwen3-4B/8B/14B x DSpark/DFlash/EAGLE-3) and the sizing arithmetic behind their docs.

Every recipe validates with DESIGN.md's values, its drafter instantiates on the meta device from the target's
published config, and ``deepspec_train.sizing`` is checked against brute force: payload bytes against the
tensors ``pack_sequences`` builds, target parameter counts against a ``Qwen3ForCausalLM`` on the meta device,
target FLOPs against ``torch.utils.flop_counter``.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode
from transformers import Qwen3Config, Qwen3ForCausalLM

from deepspec_train.config.loader import load_recipe
from deepspec_train.config.schema import RecipeConfig
from deepspec_train.models.geometry import geometry_from_target_config
from deepspec_train.models.reference_configs import REFERENCE_LAYER_IDS, qwen3_reference_configs
from deepspec_train.models.scale_targets import scale_target_config, shrink_dense_qwen3
from deepspec_train.packing.packer import SequenceItem, pack_sequences
from deepspec_train.sizing import (
    balance_workers,
    meta_drafter,
    nominal_anchors,
    payload_bytes,
    reference_target_config,
    target_decoder_params,
    target_flops_per_sequence,
    target_total_params,
)

REPO = Path(__file__).resolve().parents[1]
SIZES = {"4b": "Qwen3-4B", "8b": "Qwen3-8B", "14b": "Qwen3-14B"}
RECIPES = [f"qwen3-{size}{variant}" for size in SIZES for variant in ("", "-dflash", "-eagle3")]


def _model_name(recipe: str) -> str:
    return SIZES[recipe.split("-")[1]]


@pytest.mark.parametrize("recipe", RECIPES)
def test_recipe_has_design_values(recipe: str) -> None:
    cfg = load_recipe(recipe, check_target=False)
    path = REPO / "recipes" / f"{recipe}.yaml"
    assert path.read_text().splitlines()[0] == f"# Launch: accelerate launch train.py recipe={recipe}"
    assert cfg.run.name == recipe
    name = _model_name(recipe)
    num_layers = qwen3_reference_configs()[name].num_hidden_layers
    assert Path(cfg.target.path).name == name
    assert cfg.drafter.block_size == 7 and cfg.drafter.mask_token_id == 151669
    assert cfg.anchors.num_per_sequence == 512
    t = cfg.train
    assert (t.lr, t.warmup_frac, t.global_batch_sequences, t.epochs, t.grad_clip) == (6e-4, 0.04, 512, 10.0, 1.0)
    assert t.mixed_precision == "bf16" and t.max_steps is None
    if recipe.endswith("-eagle3"):
        assert cfg.target.layer_ids == [1, num_layers // 2 - 1, num_layers - 4]
        d = cfg.drafter
        assert (d.kind, d.num_layers, d.ttt_steps, d.ttt_decay, d.draft_vocab_size) == ("eagle3", 1, 7, 0.8, 32000)
    else:
        assert cfg.target.layer_ids == REFERENCE_LAYER_IDS[name]
        assert cfg.drafter.num_layers == 5
        assert cfg.drafter.markov_rank == (0 if recipe.endswith("-dflash") else 256)
    for source in cfg.data.train + cfg.data.validation:
        assert source.startswith("data/open-perfectblend/")
    # Drafter ranks split the global batch evenly.
    world = 8 * (2 if cfg.topology.target_workers == 8 else 1)
    drafters = world - cfg.topology.target_workers
    assert t.global_batch_sequences % drafters == 0


@pytest.mark.parametrize("recipe", RECIPES)
def test_drafter_instantiates_on_meta_device(recipe: str) -> None:
    cfg = load_recipe(recipe, check_target=False)
    hf_config = reference_target_config(cfg)
    drafter = meta_drafter(cfg, hf_config)
    params = dict(drafter.named_parameters())
    assert all(p.is_meta for p in params.values())
    d, vocab = hf_config.hidden_size, hf_config.vocab_size
    assert params["fc.weight"].shape == (d, len(cfg.target.layer_ids) * d)
    if cfg.drafter.kind == "eagle3":
        assert params["lm_head.weight"].shape == (32000, d)
    else:
        assert params["lm_head.weight"].shape == (vocab, d)
        assert len(drafter.layers) == 5
    if cfg.drafter.kind == "dspark":
        assert params["markov_head.markov_w2.weight"].shape == (vocab, 256)


@pytest.mark.parametrize("recipe", RECIPES)
def test_streamed_payload_per_recipe(recipe: str) -> None:
    """One 2048-token sequence with 512 anchors fits one micro-batch: the bytes follow in closed form."""
    cfg = load_recipe(recipe, check_target=False)
    hf_config = reference_target_config(cfg)
    geometry = geometry_from_target_config(hf_config)
    seq_len, anchors = 2048, 512
    payload = payload_bytes(cfg, geometry, 1, seq_len, anchors)
    d, taps = hf_config.hidden_size, len(cfg.target.layer_ids)
    # Anchors i * 2046 // 511: the last two (2041 and 2046) are cut by the sequence end to 6 and 1 slots.
    assert payload.micro_batches == 1 and payload.context_rows == seq_len - 2 and payload.blocks == anchors
    assert nominal_anchors(seq_len, anchors)[-2:] == [2041, 2046]
    assert payload.supervised == 510 * 7 + 6 + 1
    assert payload.feature_bytes == 2 * ((seq_len - 2) * taps * d + payload.supervised * d)
    assert payload.metadata_bytes == 8 * (3 * (seq_len - 2) + 3 * anchors * 7 + 2 * anchors + 1)


def _tiny_cfg(labels: str, token_budget: int, micro_batch: int, dtype: str) -> RecipeConfig:
    cfg = RecipeConfig()
    cfg.target = dataclasses.replace(cfg.target, layer_ids=[0, 2, 3], dtype=dtype)
    kind = "dflash" if labels == "zlab" else "dspark"
    cfg.drafter = dataclasses.replace(cfg.drafter, kind=kind, block_size=4, labels=labels, mask_token_id=0)
    cfg.anchors = dataclasses.replace(cfg.anchors, token_budget=token_budget)
    cfg.train = dataclasses.replace(cfg.train, micro_batch_sequences=micro_batch)
    return cfg


@pytest.mark.parametrize(
    "labels, token_budget, micro_batch, dtype, num_sequences, seq_len, anchors",
    [
        ("dspark", 256, 8, "bfloat16", 3, 40, 6),
        ("dspark", 64, 2, "bfloat16", 5, 50, 12),  # sequences split by the budget, micro-batches capped at 2
        ("zlab", 128, 3, "float32", 4, 30, 40),  # more anchors than valid positions
        ("dspark", 32, 8, "auto", 2, 5, 3),
    ],
)
def test_payload_bytes_match_packed_tensors(
    labels: str, token_budget: int, micro_batch: int, dtype: str, num_sequences: int, seq_len: int, anchors: int
) -> None:
    cfg = _tiny_cfg(labels, token_budget, micro_batch, dtype)
    hf_config = Qwen3Config(hidden_size=8, intermediate_size=16, num_hidden_layers=4, num_attention_heads=2,
                            num_key_value_heads=1, head_dim=4, vocab_size=50)
    geometry = geometry_from_target_config(hf_config)
    float_dtype = torch.float32 if dtype == "float32" else torch.bfloat16
    d, taps = geometry.hidden_size, len(cfg.target.layer_ids)
    generator = torch.Generator().manual_seed(0)
    items = [
        SequenceItem(
            input_ids=torch.randint(1, 50, (seq_len,), generator=generator),
            loss_mask=torch.ones(seq_len, dtype=torch.long),
            ctx_features=torch.randn(seq_len, taps * d, generator=generator).to(float_dtype),
            final_hidden=torch.randn(seq_len, d, generator=generator).to(float_dtype),
            sample_id=i,
        )
        for i in range(num_sequences)
    ]
    anchor_sets = [torch.tensor(nominal_anchors(seq_len, anchors))] * num_sequences
    batches = pack_sequences(items, anchor_sets, cfg.drafter.block_size, token_budget, 0, labels, micro_batch)
    expected = payload_bytes(cfg, geometry, num_sequences, seq_len, anchors)
    nbytes = [{n: t.numel() * t.element_size() for n, t in b.tensors().items()} for b in batches]
    assert expected.micro_batches == len(batches)
    assert expected.packed_sequences == sum(b.sample_ids.numel() for b in batches)
    assert expected.context_rows == sum(b.ctx_features.shape[0] for b in batches)
    assert expected.blocks == sum(b.num_blocks for b in batches)
    assert expected.supervised == sum(b.num_supervised for b in batches)
    assert expected.feature_bytes == sum(n["ctx_features"] + n["target_hidden"] for n in nbytes)
    assert expected.total_bytes == sum(sum(n.values()) for n in nbytes)


@pytest.mark.parametrize("name", sorted(qwen3_reference_configs()))
def test_target_parameter_counts_match_the_model(name: str) -> None:
    hf_config = qwen3_reference_configs()[name]
    with torch.device("meta"):
        model = Qwen3ForCausalLM(hf_config)
    total = sum(p.numel() for p in model.parameters())
    embed = model.get_input_embeddings().weight.numel()
    head = 0 if hf_config.tie_word_embeddings else model.get_output_embeddings().weight.numel()
    assert target_total_params(hf_config) == total
    assert target_decoder_params(hf_config) == total - embed - head


def test_target_flops_match_flop_counter() -> None:
    """Matmul FLOPs exactly as torch counts them (eager attention, so the score and value products are explicit
    batched matmuls), with attention halved for the causal mask (the counter counts every (query, key) pair)
    and the norm weights, which the estimate counts as parameters, added back."""
    heads, head_dim, hidden, layers, seq_len = 4, 8, 32, 2, 24
    hf_config = Qwen3Config(hidden_size=hidden, intermediate_size=64, num_hidden_layers=layers,
                            num_attention_heads=heads, num_key_value_heads=2, head_dim=head_dim, vocab_size=64,
                            attn_implementation="eager")
    model = Qwen3ForCausalLM(hf_config).eval()
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        model.model(torch.randint(0, 64, (1, seq_len)))
    attention_all_pairs = 4 * heads * head_dim * seq_len * seq_len * layers
    attention_causal = 4 * heads * head_dim * seq_len * (seq_len + 1) // 2 * layers
    norm_params = layers * (2 * head_dim + 2 * hidden) + hidden
    expected = counter.get_total_flops() - attention_all_pairs + attention_causal + 2 * norm_params * seq_len
    assert target_flops_per_sequence(hf_config, seq_len) == expected


def test_balance_workers_follows_routing() -> None:
    # Drafter work twice the target's: 3 targets feed 5 drafters at best, but 512 sequences only split over
    # drafter counts that divide 512, so 4:4 wins; each target feeds one drafter at half the drafter's speed.
    split = balance_workers(1.0, 2.0, 8, 1.0, 512)
    assert (split.target_workers, split.drafter_workers) == (4, 4)
    assert split.sequences_per_s == pytest.approx(4 * 0.5)
    # Unconstrained: 3:5 -> each target feeds 2 drafters (rate 1/2 each, capped by drafters at 1/2): 5 * 0.5.
    free = balance_workers(1.0, 2.0, 8, 1.0)
    assert free.sequences_per_s == pytest.approx(2.5)
    # Target work 3x: 6 targets feed 2 drafters, 3 each taking turns -> 2 * min(3 * 1/3, 1) = 2.
    heavy = balance_workers(3.0, 1.0, 8, 1.0, 512)
    assert (heavy.target_workers, heavy.drafter_workers) == (6, 2)
    assert heavy.sequences_per_s == pytest.approx(2.0)


@pytest.mark.parametrize("name", sorted(qwen3_reference_configs()))
def test_scale_target_widths_follow_one_factor(name: str) -> None:
    """The scale-model tier's targets (``models/scale_targets.py``): the widths divided by 32, nothing else."""
    reference, scaled = qwen3_reference_configs()[name], scale_target_config(name)
    assert (scaled.head_dim, scaled.hidden_size * 32, scaled.intermediate_size * 32) == (
        4, reference.hidden_size, reference.intermediate_size)
    assert (scaled.num_hidden_layers, scaled.num_attention_heads, scaled.vocab_size, scaled.tie_word_embeddings) == (
        reference.num_hidden_layers, reference.num_attention_heads, 151936, reference.tie_word_embeddings)
    with pytest.raises(ValueError, match="does not divide the widths"):
        shrink_dense_qwen3(reference, head_dim=3)
