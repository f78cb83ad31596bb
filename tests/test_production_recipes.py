"""Production recipes (Qwen3-4B/8B/14B x DSpark/DFlash/EAGLE-3, DSpark for the mixture-of-experts Qwen3-30B-A3B
and Qwen3-235B-A22B, Qwen3-8B's 32K DSpark and EAGLE-3, each its 4,096-token recipe but for the long-context keys)
and the sizing arithmetic behind their docs.

Every recipe validates with the design values, its drafter instantiates on the meta device from the target's
published config, its topology launches on the nodes its Slurm line names, and ``deepspec_train.costs`` is
checked against brute force: payload bytes against the tensors ``pack_sequences`` builds, target parameter
counts against ``Qwen3ForCausalLM`` / ``Qwen3MoeForCausalLM`` on the meta device, target FLOPs (dense and routed
experts) against ``torch.utils.flop_counter``, split rates against the routing worked out by hand.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode
from transformers import Qwen3Config, Qwen3ForCausalLM, Qwen3MoeConfig, Qwen3MoeForCausalLM

from deepspec_train.kinds.recipe_validation import load_recipe
from deepspec_train.config.loader import load_recipe_section
from deepspec_train.config.rules import launch_problems, tensor_parallel_problems
from deepspec_train.packing.anchor_counts import anchor_count
from deepspec_train.config.schema import RecipeConfig
from deepspec_train.models.geometry import geometry_from_target_config
from deepspec_train.models.reference_configs import REFERENCE_LAYER_IDS, qwen3_reference_configs, reference_configs
from deepspec_train.models.scale_targets import scale_target_config, shrink_dense_qwen3
from deepspec_train.packing.packer import SequenceItem, pack_sequences
from deepspec_train.costs.gpu_split import StreamedSplit, balance_workers, group_plans
from deepspec_train.costs.reference_targets import meta_drafter, reference_target_config
from deepspec_train.costs.sizing_tables import cluster_row
from deepspec_train.costs.stream_payload import nominal_anchors, payload_bytes, stream_bytes_in_flight
from deepspec_train.costs.training_flops import (
    target_active_decoder_params, target_attention_params, target_decoder_params, target_flops_per_sequence,
    target_total_params,
)
from deepspec_train.regenerate.settings import SECTION, RegenerateConfig
from tests.helpers.scale_checks import flat_config
from tests.helpers.tiny_geometry import tiny_qwen3_config

REPO = Path(__file__).resolve().parents[1]
SIZES = {"4b": "Qwen3-4B", "8b": "Qwen3-8B", "14b": "Qwen3-14B"}
MOE_RECIPES = {"qwen3-30b-a3b": "Qwen3-30B-A3B", "qwen3-235b-a22b": "Qwen3-235B-A22B"}
# The long-context recipes and the recipe each is at 4,096 tokens.
LONG_CONTEXT_RECIPES = {"qwen3-8b-32k": "qwen3-8b", "qwen3-8b-eagle3-32k": "qwen3-8b-eagle3"}
RECIPES = [f"qwen3-{size}{variant}" for size in SIZES for variant in ("", "-dflash", "-eagle3")] + list(MOE_RECIPES)
RECIPES += list(LONG_CONTEXT_RECIPES)


def _model_name(recipe: str) -> str:
    return MOE_RECIPES.get(recipe) or SIZES[recipe.split("-")[1]]


def _nodes(recipe: str) -> int:
    """The node count of the recipe's Slurm line (``# Slurm: sbatch --nodes=N ...``; a colocated recipe's ``N``
    means any count: 1 is checked)."""
    slurm = (REPO / "recipes" / f"{recipe}.yaml").read_text().splitlines()[1]
    count = slurm.split("--nodes=")[1].split()[0]
    return 1 if count == "N" else int(count)


@pytest.mark.parametrize("recipe", RECIPES)
def test_recipe_has_design_values(recipe: str) -> None:
    cfg = load_recipe(recipe, check_target=False)
    path = REPO / "recipes" / f"{recipe}.yaml"
    assert path.read_text().splitlines()[0] == f"# Launch: accelerate launch train.py recipe={recipe}"
    assert cfg.run.name == recipe
    name = _model_name(recipe)
    num_layers = reference_configs()[name].num_hidden_layers
    assert Path(cfg.target.path).name == name
    assert cfg.drafter.block_size == 7 and cfg.drafter.mask_token_id == 151669
    assert cfg.anchors.num_per_sequence == 512
    t = cfg.train
    assert (t.lr, t.warmup_frac, t.global_batch_sequences, t.epochs, t.grad_clip) == (6e-4, 0.04, 512, 10.0, 1.0)
    assert t.mixed_precision == "bf16" and t.max_steps is None
    if "-eagle3" in recipe:
        assert cfg.target.layer_ids == [1, num_layers // 2 - 1, num_layers - 4]
        d = cfg.drafter
        assert (d.kind, d.num_layers, d.ttt_steps, d.ttt_decay, d.draft_vocab_size) == ("eagle3", 1, 7, 0.8, 32000)
    else:
        assert cfg.target.layer_ids == REFERENCE_LAYER_IDS[name]
        assert cfg.drafter.num_layers == 5
        assert cfg.drafter.markov_rank == (0 if recipe.endswith("-dflash") else 256)
    for source in cfg.data.train + cfg.data.validation:
        assert source.startswith("data/open-perfectblend/")
    # The topology launches on the recipe's nodes (8 GPUs each) and its groups split the target's heads.
    assert launch_problems(cfg, 8 * _nodes(recipe)) == []
    config = reference_configs()[name].to_dict()
    assert tensor_parallel_problems(config, cfg.topology.target_tp, cfg.topology.target_tp_plan) == []


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
    assert payload.largest_micro_batch_bytes == payload.total_bytes


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
    assert expected.largest_micro_batch_bytes == max(sum(n.values()) for n in nbytes)


@pytest.mark.parametrize("name", sorted(reference_configs()))
def test_target_parameter_counts_match_the_model(name: str) -> None:
    hf_config = reference_configs()[name]
    with torch.device("meta"):
        model = (Qwen3MoeForCausalLM if isinstance(hf_config, Qwen3MoeConfig) else Qwen3ForCausalLM)(hf_config)
    total = sum(p.numel() for p in model.parameters())
    embed = model.get_input_embeddings().weight.numel()
    head = 0 if hf_config.tie_word_embeddings else model.get_output_embeddings().weight.numel()
    assert target_total_params(hf_config) == total
    assert target_decoder_params(hf_config) == total - embed - head
    assert target_attention_params(hf_config) == sum(p.numel() for n, p in model.named_parameters() if ".self_attn." in n)


def test_reference_configs_match_published_sizes() -> None:
    moe = {
        name: (c.hidden_size, c.num_hidden_layers, c.num_attention_heads, c.num_key_value_heads,
               c.moe_intermediate_size, c.num_experts, c.num_experts_per_tok)
        for name, c in reference_configs().items() if isinstance(c, Qwen3MoeConfig)
    }
    assert moe == {"Qwen3-30B-A3B": (2048, 48, 32, 4, 768, 128, 8), "Qwen3-235B-A22B": (4096, 94, 64, 4, 1536, 128, 8)}
    # The "A3B" / "A22B" of the names: parameters a token is multiplied with, embedding and LM head included.
    for name, billions in (("Qwen3-30B-A3B", 3.3), ("Qwen3-235B-A22B", 22.1)):
        c = reference_configs()[name]
        active = target_active_decoder_params(c) + 2 * c.vocab_size * c.hidden_size
        assert active / 1e9 == pytest.approx(billions, abs=0.1)
    assert reference_configs()["Qwen3-32B"].num_hidden_layers == 64


def _counted_flops(model, seq_len: int) -> int:
    """Matmul FLOPs of ``model``'s decoder over one sequence as torch counts them, with attention halved for the
    causal mask (the counter counts every (query, key) pair) and the norm weights, which the estimate counts as
    parameters, added back."""
    c = model.config
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        model.model(torch.randint(0, c.vocab_size, (1, seq_len)))
    attention_all_pairs = 4 * c.num_attention_heads * c.head_dim * seq_len * seq_len * c.num_hidden_layers
    attention_causal = 4 * c.num_attention_heads * c.head_dim * seq_len * (seq_len + 1) // 2 * c.num_hidden_layers
    norm_params = c.num_hidden_layers * (2 * c.head_dim + 2 * c.hidden_size) + c.hidden_size
    return counter.get_total_flops() - attention_all_pairs + attention_causal + 2 * norm_params * seq_len


def test_target_flops_match_flop_counter() -> None:
    """Matmul FLOPs exactly as torch counts them (eager attention, so the score and value products are explicit
    batched matmuls)."""
    hf_config = tiny_qwen3_config(intermediate_size=64, num_hidden_layers=2, head_dim=8, vocab_size=64,
                                  attn_implementation="eager")
    assert target_flops_per_sequence(hf_config, 24) == _counted_flops(Qwen3ForCausalLM(hf_config).eval(), 24)


def test_moe_target_flops_count_only_the_routed_experts() -> None:
    """The same count for a mixture-of-experts target with one dense layer (``mlp_only_layers``): the router and
    the top-2 of 8 experts per token are multiplied (the experts run eagerly, one matmul per expert, so the
    counter sees exactly the routed tokens)."""
    hf_config = Qwen3MoeConfig(hidden_size=32, intermediate_size=48, moe_intermediate_size=16, num_experts=8,
                               num_experts_per_tok=2, num_hidden_layers=3, num_attention_heads=4,
                               num_key_value_heads=2, head_dim=8, vocab_size=64, mlp_only_layers=[1],
                               attn_implementation="eager")
    hf_config._experts_implementation = "eager"
    assert target_flops_per_sequence(hf_config, 20) == _counted_flops(Qwen3MoeForCausalLM(hf_config).eval(), 20)


def test_split_rates_follow_routing_with_uneven_shares() -> None:
    # 10 sequences over 3 drafters: shares 4, 3, 3. Two groups: group 0 computes drafters 0 and 2 (7 sequences),
    # group 1 drafter 1 (3). At 1 sequence/s per group and 2 per drafter the step takes max(7/1, 4/2) = 7 s.
    split = StreamedSplit(1.0, 2.0, groups=2, tp=1, drafters=3, global_batch=10)
    assert split.step_seconds == pytest.approx(7.0) and split.sequences_per_s == pytest.approx(10 / 7)
    # Three groups of 2 GPUs for 2 drafters (shares 5, 5): drafter 0 takes turns between groups 0 and 2, drafter 1
    # has group 1 alone: max(5 / (2 * 1), 5 / (1 * 1), 5 / 4) = 5 s.
    split = StreamedSplit(1.0, 4.0, groups=3, tp=2, drafters=2, global_batch=10)
    assert split.step_seconds == pytest.approx(5.0) and split.gpus == 8 and split.label == "3x2:2"


def test_balance_workers_needs_no_divisor_of_the_batch() -> None:
    # Drafter work twice the target's: 3 targets feed 5 drafters (512 sequences: shares 103, 103, 102, 102,
    # 102); each target computes 2 or 1 shares at rate 1, the drafters run at 1/2.
    split = balance_workers({1: 1.0}, 0.5, 8, 512)
    assert (split.groups, split.drafters) == (3, 5)
    assert split.sequences_per_s == pytest.approx(512 / max(103 + 102, 103 / 0.5))
    # Target work 3x: 6 targets feed 2 drafters, 3 each taking turns -> 256 / max(256 / 1, 256 / (3 * 1/3)).
    heavy = balance_workers({1: 1 / 3}, 1.0, 8, 512)
    assert (heavy.groups, heavy.drafters) == (6, 2)
    assert heavy.sequences_per_s == pytest.approx(2.0)
    # Groups of 4 at 4x the rate beat nothing here; with only that size on offer 1 group of 4 feeds 4 drafters.
    grouped = balance_workers({4: 4.0}, 1.0, 8, 512)
    assert (grouped.groups, grouped.tp, grouped.drafters) == (1, 4, 4)


def test_group_plans_split_heads_where_they_divide_and_experts_otherwise() -> None:
    """Qwen3-235B-A22B has 4 key/value heads: transformers' plan splits it 2 or 4 ways; 8 ways only with the
    attention replicated on every rank and the experts split (each rank then holds all attention weights)."""
    hf_config = reference_configs()["Qwen3-235B-A22B"]
    plans = {p.tp: p for p in group_plans(hf_config, 2048)}
    assert [(tp, p.plan) for tp, p in sorted(plans.items())] == [(1, "auto"), (2, "auto"), (4, "auto"), (8, "experts")]
    total, attention = 2 * target_total_params(hf_config), 2 * target_attention_params(hf_config)
    assert plans[4].rank_weight_bytes == total / 4
    assert plans[8].rank_weight_bytes == attention + (total - attention) / 8
    assert "num_key_value_heads = 4 not a multiple of 8" in tensor_parallel_problems(hf_config.to_dict(), 8)[0]


def test_cluster_table_fits_what_fits() -> None:
    """The docs' cluster table: 8B fits colocated; 14B and 32B only streamed; 235B-A22B needs 2 nodes, one
    8-GPU group with split experts; 30B-A3B needs no group larger than one GPU."""
    assert isinstance(cluster_row("qwen3-8b", None, 1, 2048)["colocated_seq_s_node"], float)
    assert cluster_row("qwen3-14b", None, 1, 2048)["colocated_seq_s_node"] == "does not fit"
    assert cluster_row("qwen3-8b", "Qwen3-32B", 2, 2048)["colocated_seq_s_node"] == "does not fit"
    assert cluster_row("qwen3-235b-a22b", None, 1, 2048)["best_split"] == "none fits"
    big = cluster_row("qwen3-235b-a22b", None, 2, 2048)
    assert (big["best_split"], big["plan"]) == ("1x8:8", "experts") and big["target_rank_gb"] <= 80
    assert cluster_row("qwen3-30b-a3b", None, 1, 2048)["best_split"] == "4:4"


def test_stream_in_flight_is_bounded_by_micro_batches() -> None:
    """The 14B recipe at L = 2048: two sequences per 16,384-token micro-batch, three micro-batches in flight
    (stream.depth 2 queued + 1 being sent), where a whole-step message of 512 / 4 sequences was ~18 GB."""
    cfg = load_recipe("qwen3-14b", check_target=False)
    geometry = geometry_from_target_config(reference_target_config(cfg))
    one = payload_bytes(cfg, geometry, 1, 2048, 512).total_bytes
    assert stream_bytes_in_flight(cfg, geometry, 2048) == (cfg.stream.depth + 1) * 2 * one
    step = payload_bytes(cfg, geometry, cfg.train.global_batch_sequences // 4, 2048, 512).total_bytes
    assert step > 20 * stream_bytes_in_flight(cfg, geometry, 2048)


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


# What a long-context recipe may change from its 4,096-token one: the run, the (thinking) data, its length, the
# anchor rate, the packer's budget and order, and activation checkpointing; the drafter, loss and schedule are the
# same.
LONG_CONTEXT_KEYS = {"run.name", "run.output_dir", "data.train", "data.validation", "data.max_length",
                     "data.enable_thinking", "anchors.per_1k_tokens", "anchors.token_budget", "anchors.packing",
                     "drafter.activation_checkpointing"}
# data/prepare_open_perfectblend.py --max-prompt-tokens 2048 (data/README.md).
MAX_PROMPT_TOKENS = 2048


@pytest.mark.parametrize("recipe, short", list(LONG_CONTEXT_RECIPES.items()))
def test_long_context_recipe_is_its_short_one_at_32k(recipe: str, short: str) -> None:
    long_cfg, short_cfg = load_recipe(recipe, check_target=False), load_recipe(short, check_target=False)
    got, base = flat_config(dataclasses.asdict(long_cfg)), flat_config(dataclasses.asdict(short_cfg))
    assert {key for key in got if got[key] != base[key]} == LONG_CONTEXT_KEYS
    assert long_cfg.data.max_length == 32768 and long_cfg.data.enable_thinking
    assert long_cfg.drafter.activation_checkpointing
    assert long_cfg.anchors.token_budget >= long_cfg.data.max_length + long_cfg.drafter.block_size
    # The rate keeps the short recipe's anchors up to its length and that density beyond it; a fully supervised
    # 32K sequence with all its blocks fits one micro-batch, so its context is sent once.
    floor, rate = long_cfg.anchors.num_per_sequence, long_cfg.anchors.per_1k_tokens
    assert anchor_count(4095, floor, rate) == short_cfg.anchors.num_per_sequence
    longest = anchor_count(32767, floor, rate)
    assert longest == 4096 and 32767 + longest * long_cfg.drafter.block_size <= long_cfg.anchors.token_budget
    regenerate = load_recipe_section(recipe, SECTION, RegenerateConfig)
    assert regenerate.enable_thinking
    # The longest prompt and its answer fit the training length, and the answer may use nearly all of it.
    assert MAX_PROMPT_TOKENS + regenerate.max_new_tokens == long_cfg.data.max_length
    assert all("thinking" in source for source in long_cfg.data.train + long_cfg.data.validation)
