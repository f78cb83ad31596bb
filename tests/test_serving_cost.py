"""The serving-cost model against the project's own modules: the parameters each round reads are those of
``ParallelDrafter`` / ``Eagle3Drafter`` / the target built at Qwen3-8B widths (meta device, by name and size), the
FLOPs of a round are those ``torch.utils.flop_counter`` counts when the real decode step runs on a tiny shape,
and the roofline arithmetic is worked by hand on one case."""

from __future__ import annotations

import pytest
import torch
from torch.utils import flop_counter
from transformers import AutoModelForCausalLM, Qwen3Config

from deepspec_train.config.schema import DrafterConfig
from deepspec_train.costs.gpu_specs import gpu_spec
from deepspec_train.kinds.registry import kind_spec
from deepspec_train.models.block_drafting import DraftContext
from deepspec_train.models.geometry import geometry_from_target_config
from deepspec_train.models.reference_configs import qwen3_reference_configs
from deepspec_train.costs.serving_cost import (
    ServedDrafter, group_seconds, main, production_counterpart, round_seconds, round_times, served_recipe,
)
from deepspec_train.kinds.dflash2_round import dflash2_round
from deepspec_train.kinds.parallel_round import parallel_round
from deepspec_train.kinds.serving_kernels import (
    ACTIVATION_BYTES, LOGIT_BYTES, WEIGHT_BYTES, GroupRole, RoundShape, target_round,
)

PRODUCTION = [
    ("qwen3-8b", []), ("qwen3-8b", ["drafter.markov_head_type=rnn"]), ("qwen3-8b", ["drafter.markov_head_type=gated"]),
    ("qwen3-8b", ["drafter.draft_vocab_size=32000"]), ("qwen3-8b-dflash", []), ("qwen3-8b-eagle3", []),
]


def _meta_module(served: ServedDrafter) -> torch.nn.Module:
    with torch.device("meta"):
        counts = torch.ones(served.geometry.vocab_size, dtype=torch.long)
        return kind_spec(served.drafter.kind).build(served.drafter, served.geometry, list(range(served.taps)), counts)


def _sizes(module: torch.nn.Module) -> dict[str, int]:
    return {name: p.numel() for name, p in module.named_parameters()}


@pytest.mark.parametrize("recipe,overrides", PRODUCTION)
def test_a_round_reads_exactly_the_parameters_of_the_module_at_production_widths(recipe, overrides) -> None:
    served = served_recipe(recipe, overrides)
    assert served.geometry.hidden_size == 4096 and served.geometry.vocab_size == 151936
    module = _meta_module(served)
    assert served.round(RoundShape()).parameters() == _sizes(module)
    if served.drafter.draft_vocab_size:
        assert module.lm_head.weight.shape == (32000, 4096)


def test_weight_bytes_of_a_dspark_round_follow_from_its_parameters() -> None:
    """Batch 1: every tensor once, the layers' key / value projections twice (context rows, then the block), the
    Markov factor once per drafted token, and of the embeddings only the rows looked up."""
    served = served_recipe("qwen3-8b")
    sizes = _sizes(_meta_module(served))
    d, r, block, layers = 4096, 256, served.drafter.block_size, served.drafter.num_layers
    new_rows = block + 1
    kv = sum(n for name, n in sizes.items() if name.endswith(("k_proj.weight", "v_proj.weight", "k_norm.weight")))
    gathered = {"embed_tokens.weight": block * d, "markov_head.markov_w1.weight": block * r + block * r}
    expected = (sum(sizes.values()) - sizes["embed_tokens.weight"] - sizes["markov_head.markov_w1.weight"] + kv
                + (block - 1) * sizes["markov_head.markov_w2.weight"] + sum(gathered.values()))
    assert served.round(RoundShape(batch=1, new_rows=new_rows)).weight_bytes == WEIGHT_BYTES * expected
    assert layers == 5 and WEIGHT_BYTES * expected / 1e9 == pytest.approx(3.97, abs=0.01)


@pytest.mark.parametrize("name", ["Qwen3-8B", "Qwen3-4B"])
def test_the_target_pass_reads_exactly_the_target_parameters(name) -> None:
    config = qwen3_reference_configs()[name]
    with torch.device("meta"):
        target = AutoModelForCausalLM.from_config(config)
    assert target_round(config, 8, RoundShape()).parameters() == _sizes(target)


TINY = dict(hidden_size=32, intermediate_size=48, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
            vocab_size=97, num_hidden_layers=4, max_position_embeddings=512, rms_norm_eps=1e-6,
            tie_word_embeddings=False)
# The CPU kernel of scaled_dot_product_attention has no formula in torch's flop counter; give it the registered
# SDPA one (scores and values, 4 * batch * heads * queries * keys * head_dim).
CPU_SDPA = {torch.ops.aten._scaled_dot_product_flash_attention_for_cpu:
            lambda q, k, v, *args, out_shape=None, **kwargs: flop_counter.sdpa_flop_count(q, k, v)}
DRAFTERS = [
    DrafterConfig(num_layers=2, block_size=5, markov_rank=6, markov_head_type=head, mask_token_id=3)
    for head in ("vanilla", "gated", "rnn")
] + [
    DrafterConfig(num_layers=2, block_size=5, markov_rank=6, markov_head_type=head, mask_token_id=3, draft_vocab_size=40)
    for head in ("vanilla", "rnn")
] + [
    DrafterConfig(kind="dflash", num_layers=3, block_size=5, markov_rank=0, confidence_head=False, mask_token_id=3),
    DrafterConfig(kind="dflash", num_layers=1, block_size=5, markov_rank=0, confidence_head=False, mask_token_id=3,
                  labels="zlab"),
    DrafterConfig(kind="eagle3", num_layers=1, block_size=5, ttt_steps=5, markov_rank=0, confidence_head=False),
    DrafterConfig(kind="eagle3", num_layers=1, block_size=4, ttt_steps=4, markov_rank=0, confidence_head=False,
                  draft_vocab_size=40),
]


def _counted_flops(fn) -> int:
    with flop_counter.FlopCounterMode(display=False, custom_mapping=CPU_SDPA) as counter:
        fn()
    return counter.get_total_flops()


@pytest.mark.parametrize(
    "cfg", DRAFTERS, ids=lambda c: f"{c.kind}-{c.markov_head_type}-{c.labels}-{c.ttt_steps}-{c.draft_vocab_size}"
)
def test_round_flops_equal_a_brute_force_count_of_the_real_decode_step(cfg) -> None:
    """The evaluator's draft call on a context that gained ``new`` rows since the last round (so only those are
    projected), counted by torch: equal to the model's FLOPs for that round at batch 1, and linear in the batch."""
    torch.manual_seed(0)
    geometry = geometry_from_target_config(Qwen3Config(**TINY))
    taps, before, new = 3, 11, 4
    module = kind_spec(cfg.kind).build(cfg, geometry, list(range(taps)), torch.randint(1, 50, (97,)))
    drafter = kind_spec(cfg.kind).block_drafter(module, cfg.labels)
    features, tokens = torch.randn(before + new, taps * 32), torch.randint(4, 97, (before + new,))
    cache: dict = {}
    anchor = torch.tensor([5])
    drafter.draft(DraftContext(features[:before], tokens[:before], cache), anchor, drafter.max_block_size, 1.0)
    context = DraftContext(features, tokens, cache)
    counted = _counted_flops(lambda: drafter.draft(context, anchor, drafter.max_block_size, 1.0))
    served = ServedDrafter("tiny", cfg, taps, geometry, None)
    modeled = served.round(RoundShape(batch=1, context_len=before + new, new_rows=new))
    assert modeled.drafts == drafter.max_block_size
    assert modeled.flops == counted
    assert served.round(RoundShape(batch=3, context_len=before + new, new_rows=new)).flops == 3 * counted


def test_target_flops_equal_a_brute_force_count_of_its_forward() -> None:
    torch.manual_seed(0)
    config = Qwen3Config(**TINY)
    target = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa").eval()
    cached, tokens, batch = 9, 4, 2
    ids = torch.randint(0, 97, (batch, cached + tokens))
    with torch.no_grad():
        cache = target(ids[:, :cached], use_cache=True).cache
        counted = _counted_flops(lambda: target(ids[:, cached:], cache=cache, use_cache=True))
    assert target_round(config, tokens, RoundShape(batch=batch, context_len=cached)).flops == counted


def test_vllm_top_k_replaces_the_full_markov_product_by_k_gathered_rows() -> None:
    served = served_recipe("qwen3-8b")
    full, top = (served.round(RoundShape(batch=4, draft_topk=k)) for k in (None, 64))
    steps, b, r, vocab = served.drafter.block_size, 4, 256, 151936
    assert full.flops - top.flops == steps * 2 * b * r * (vocab - 64)
    w2 = r * vocab
    assert full.weight_bytes - top.weight_bytes == steps * WEIGHT_BYTES * (w2 - b * 64 * r)


def test_roofline_by_hand() -> None:
    """DSpark's LM head over a 7-slot block at batch 1 on an H200 is memory-bound; at batch 4,096 compute-bound."""
    served = served_recipe("qwen3-8b")
    h200 = gpu_spec("H200")
    d, vocab = 4096, 151936
    for batch in (1, 4096):
        rows = 7 * batch
        (head,) = [g for g in served.round(RoundShape(batch=batch)).groups if g.name == "LM head over the block"]
        weights = WEIGHT_BYTES * (d + d * vocab)
        activations = 2 * ACTIVATION_BYTES * rows * d + rows * (ACTIVATION_BYTES * d + LOGIT_BYTES * vocab)
        flops = 2 * rows * d * vocab
        assert (head.weight_bytes, head.activation_bytes, head.flops) == (weights, activations, flops)
        seconds = max((weights + activations) / 4.8e12, flops / 989e12)
        assert group_seconds(head, h200) == pytest.approx(seconds, rel=1e-12)
    times = round_times(served, h200, batch=1)
    shape = RoundShape(batch=1)
    assert times.draft_s == pytest.approx(sum(group_seconds(g, h200) for g in served.round(shape).groups))
    assert times.verify_s == pytest.approx(round_seconds(target_round(served.target_config, 8, shape), h200))
    assert times.speedup(3.0) == pytest.approx(3.0 * times.target_s / (times.verify_s + times.draft_s))


def test_production_counterparts_keep_the_structure_and_take_the_widths() -> None:
    tiny = DrafterConfig(num_layers=3, markov_rank=128, markov_head_type="rnn", mask_token_id=3)
    served = production_counterpart(tiny, 2, "tiny")
    assert (served.drafter.num_layers, served.drafter.markov_rank, served.drafter.markov_head_type) == (3, 128, "rnn")
    assert served.taps == 2 and served.drafter.mask_token_id == 151669 and served.geometry.hidden_size == 4096
    eagle = production_counterpart(DrafterConfig(kind="eagle3", num_layers=1, markov_rank=0, confidence_head=False),
                                   3, "tiny-eagle")
    assert eagle.drafter.draft_vocab_size == 32000 and eagle.sequential_passes() == 7
    tiny_dflash2 = DrafterConfig(kind="dflash2", num_layers=1, block_size=5, markov_rank=0, confidence_head=False,
                                 labels="zlab", conv_kernel_size=2, conv_group_size=8, selector_rank=8, selector_top_k=4)
    dflash2 = production_counterpart(tiny_dflash2, 1, "tiny-dflash2").drafter
    assert (dflash2.num_layers, dflash2.block_size, dflash2.conv_kernel_size, dflash2.selector_top_k) == (1, 5, 2, 4)
    assert (dflash2.conv_group_size, dflash2.selector_rank) == (128, 256)
    with pytest.raises(ValueError, match="no production recipe"):
        production_counterpart(tiny, 2, "tiny", production=("qwen3-8b-eagle3",))


def test_the_tiny_recipes_mirror_production_inside_the_cost_rule() -> None:
    """Issue 22's rule: the tiny DSpark recipes take the production structure (the RNN head, chosen on validation,
    or the vanilla one vLLM serves), DFlash its 5 layers, and at Qwen3-8B widths each DSpark drafts a round in at
    most EAGLE-3's modeled time at batch 1, in at most its 7 sequential layer passes."""
    from deepspec_train.kinds.recipe_validation import load_recipe

    production = {r: load_recipe(r, check_target=False).drafter for r in ("qwen3-8b", "qwen3-8b-dflash")}
    tiny = {r: load_recipe(r, check_target=False) for r in ("tiny-dspark", "tiny-dspark-vanilla", "tiny-dflash",
                                                             "tiny-eagle3")}
    for name in ("tiny-dspark", "tiny-dspark-vanilla"):
        for field in ("num_layers", "block_size", "markov_rank", "confidence_head", "labels"):
            assert getattr(tiny[name].drafter, field) == getattr(production["qwen3-8b"], field), (name, field)
    assert (tiny["tiny-dspark"].drafter.markov_head_type, tiny["tiny-dspark-vanilla"].drafter.markov_head_type,
            production["qwen3-8b"].markov_head_type) == ("rnn", "vanilla", "vanilla")
    assert tiny["tiny-dflash"].drafter.num_layers == production["qwen3-8b-dflash"].num_layers == 5
    served = {n: production_counterpart(c.drafter, len(c.target.layer_ids), n) for n, c in tiny.items()}
    h200 = gpu_spec("H200")
    eagle = served["tiny-eagle3"]
    assert eagle.sequential_passes() == 7
    for name in ("tiny-dspark", "tiny-dspark-vanilla"):
        assert served[name].sequential_passes() <= eagle.sequential_passes()
        assert round_times(served[name], h200, 1).draft_s <= round_times(eagle, h200, 1).draft_s


def test_the_printed_tables(capsys) -> None:
    main(["--context", "256"])
    out = capsys.readouterr().out
    for name in ("DSpark 5L r256 vanilla", "DSpark 5L r256 rnn", "DFlash 5L", "EAGLE-3 1x7", "tiny-dspark at Qwen3-8B"):
        assert f"### {name}: one round at batch 1, context 256, H200" in out
        for gpu in ("H100", "H200", "B200"):
            assert f"| {name} |" in out and f"| 32 | {gpu} |" in out
    assert "| EAGLE-3 1x7 | 7 | 1 | H200 |" in out and "GPU facts: H100 3.35 TB/s" in out


def test_dflash2_extends_the_dflash_round_by_group_role() -> None:
    """DFlash2's round finds the DFlash groups it extends (each backbone layer: the convolutions' weights join it)
    and the one it replaces (sampling: the selector's groups instead) by their roles; labels are for tables only."""
    geometry = geometry_from_target_config(Qwen3Config(**TINY))
    cfg = DrafterConfig(kind="dflash2", num_layers=2, block_size=5, markov_rank=0, confidence_head=False,
                        labels="zlab", conv_kernel_size=2, conv_group_size=8, selector_rank=8, selector_top_k=4)
    base, round_ = parallel_round(cfg, geometry, 3, RoundShape()), dflash2_round(cfg, geometry, 3, RoundShape())
    layers = [group for group in round_.groups if group.role is GroupRole.BACKBONE_LAYER]
    assert len(layers) == sum(group.role is GroupRole.BACKBONE_LAYER for group in base.groups) == cfg.num_layers
    assert all(any(w.name.endswith("attention_conv.base_kernel") for w in group.weights) for group in layers)
    assert any(group.role is GroupRole.SAMPLING for group in base.groups)
    assert not any(group.role is GroupRole.SAMPLING for group in round_.groups)
