"""DFlash2's serving side: the ``dflash2`` layout round trip (training output -> export -> loader, bit-identical
block states, selector and drafts), what each engine's reader makes of it (captures, refusals, serve lines), the
layout's refusals, the Qwen3-8B recipe's export plan on the meta device, and its modeled round: the parameters it
reads are the module's at production widths and its FLOPs are what torch counts in the real decode step."""

from __future__ import annotations

import json

import pytest
import torch
from torch.utils import flop_counter
from transformers import Qwen3Config

from deepspec_train.config.schema import RecipeConfig, TargetConfig
from deepspec_train.export.engine_rules import check_engines, check_export_dir
from deepspec_train.export.exporter import export_drafter, plan_export
from deepspec_train.formats.drafter_loader import LoadedDrafter, load_exported_drafter, read_tensor_specs
from deepspec_train.serving_layouts.layout_registry import validate_layout
from deepspec_train.serving_layouts.layout_spec import LayoutError
from deepspec_train.kinds.registry import kind_spec
from deepspec_train.models.block_drafting import DraftContext
from deepspec_train.models.geometry import geometry_from_target_config
from deepspec_train.costs.serving_cost import ServedDrafter, served_recipe
from deepspec_train.kinds.serving_kernels import RoundShape
from tests.helpers.dflash2_drafters import LAYER_IDS, dflash2_config, randomize
from tests.helpers.tiny_geometry import BLOCK, HIDDEN, MASK_ID
from tests.helpers.trained_drafters import random_batch, save_tiny_target, write_training_output

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def target_dir(tmp_path_factory) -> str:
    return save_tiny_target(tmp_path_factory.mktemp("target"))


def _trained(target_dir: str, **drafter: object) -> tuple[RecipeConfig, torch.nn.Module]:
    cfg = RecipeConfig(drafter=dflash2_config(intermediate_size=48, **drafter),
                       target=TargetConfig(path=target_dir, layer_ids=LAYER_IDS))
    geometry = geometry_from_target_config(Qwen3Config.from_pretrained(target_dir), 48)
    torch.manual_seed(0)
    module = randomize(kind_spec("dflash2").build(cfg.drafter, geometry, LAYER_IDS, None))
    from deepspec_train.target.head_weights import load_head_weights

    kind_spec("dflash2").load_frozen_heads(module, *load_head_weights(target_dir))
    return cfg, module.eval()


def test_round_trip_is_bit_identical_and_both_engines_serve_it(tmp_path, target_dir):
    cfg, drafter = _trained(target_dir)
    run = write_training_output(drafter, cfg, tmp_path / "run")
    out = export_drafter(run, target_dir, tmp_path / "export", dtype=torch.float32)
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == ["DFlash2DraftModel"] and config["block_size"] == BLOCK
    assert config["dflash_config"] == {
        "mask_token_id": MASK_ID, "target_layer_ids": LAYER_IDS, "block_size": BLOCK, "sample_from_anchor": False,
        "conv_kernel_size": 3, "conv_group_size": 8, "selector_rank": 6, "selector_top_k": 4,
    }
    specs = read_tensor_specs(out / "model.safetensors")
    assert "embed_tokens.weight" not in specs and "lm_head.weight" not in specs
    assert specs["layers.1.mlp_conv.kernel_projection.weight"].shape == (2 * 3 * HIDDEN // 8, HIDDEN)
    loaded = load_exported_drafter(out, target_path=target_dir)
    assert (loaded.kind, loaded.labels, loaded.source, loaded.block_size) == ("dflash2", "zlab", "dflash2", BLOCK)
    assert loaded.settings.selector_top_k == 4 and loaded.settings.conv_group_size == 8
    batch = random_batch("dflash", 1, "zlab")
    with torch.no_grad():
        assert torch.equal(loaded.module.backbone(batch), drafter.backbone(batch))
    for name, tensor in drafter.state_dict().items():
        assert torch.equal(loaded.module.state_dict()[name], tensor), name
    context = DraftContext(batch.ctx_features[:9], batch.ctx_tokens[:9])
    anchors = torch.tensor([4, 7, 7])
    want = drafter_block(drafter, context, anchors)
    got = loaded.block_drafter().draft(context, anchors, BLOCK - 1, 1.0, torch.Generator().manual_seed(1))
    assert torch.equal(got.tokens, want.tokens) and torch.equal(got.probs, want.probs)

    vllm, sglang = check_export_dir(out, target_dir)
    assert vllm.captured_layers == sglang.captured_layers == LAYER_IDS
    assert not vllm.problems and not sglang.problems
    assert '"method":"dflash"' in vllm.serve_commands[0] and '"num_speculative_tokens":3' in vllm.serve_commands[0]
    assert "--speculative-algorithm DFLASH" in sglang.serve_commands[0]
    assert sglang.serve_commands[0].endswith(f"--speculative-num-draft-tokens {BLOCK}")


def drafter_block(drafter, context, anchors):
    return kind_spec("dflash2").block_drafter(drafter, "zlab").draft(
        context, anchors, BLOCK - 1, 1.0, torch.Generator().manual_seed(1))


def test_the_engines_rules_refuse_what_they_would_misread(tmp_path, target_dir):
    """SGLang's CUDA walk needs a power-of-two top-K; an embedding scale only vLLM applies; a layout missing a
    DFlash2 key or a tensor, or whose group size does not divide the width, is refused by the exporter's check."""
    cfg, drafter = _trained(target_dir)
    run = write_training_output(drafter, cfg, tmp_path / "run")
    out = export_drafter(run, target_dir, tmp_path / "export", dtype=torch.float32)
    config = json.loads((out / "config.json").read_text())
    specs = read_tensor_specs(out / "model.safetensors")
    target_config = Qwen3Config.from_pretrained(target_dir).to_dict()
    scaled = {**config, "dflash_config": {**config["dflash_config"], "input_embedding_scale": 2.0}}
    from deepspec_train.export.engine_rules import EngineRuleError

    with pytest.raises(EngineRuleError, match="input_embedding_scale"):
        check_engines(scaled, specs, target_config, LAYER_IDS)
    power = {**config, "dflash_config": {**config["dflash_config"], "selector_top_k": 6}}
    with pytest.raises(EngineRuleError, match="not a power of two"):
        check_engines(power, specs, target_config, LAYER_IDS)
    missing = {**config, "dflash_config": {k: v for k, v in config["dflash_config"].items() if k != "selector_rank"}}
    with pytest.raises(LayoutError, match="dflash_config.selector_rank is missing"):
        validate_layout("dflash2", missing, specs)
    with pytest.raises(LayoutError, match="does not divide hidden_size"):
        validate_layout("dflash2", {**config, "dflash_config": {**config["dflash_config"], "conv_group_size": 5}},
                        specs)
    with pytest.raises(LayoutError, match="tensor candidate_selector.successor_codebook is missing"):
        validate_layout("dflash2", config, {k: v for k, v in specs.items() if "successor" not in k})


def _qwen3_8b_meta() -> tuple[ServedDrafter, torch.nn.Module]:
    served = served_recipe("qwen3-8b-dflash2")
    with torch.device("meta"):
        module = kind_spec("dflash2").build(served.drafter, served.geometry, list(range(served.taps)), None)
    return served, module


def test_the_qwen3_8b_recipe_plans_an_export_both_engines_serve():
    """The production recipe's drafter at Qwen3-8B widths (meta device): a valid dflash2 layout plan, served by
    both engines on taps [1, 9, 17, 25, 33], and a modeled round that reads exactly the module's parameters."""
    from deepspec_train.models.reference_configs import REFERENCE_LAYER_IDS, qwen3_reference_configs

    served, module = _qwen3_8b_meta()
    taps = REFERENCE_LAYER_IDS["Qwen3-8B"]
    with torch.device("meta"):
        module = kind_spec("dflash2").build(served.drafter, served.geometry, taps, None)
    loaded = LoadedDrafter(module, "dflash2", 8, taps, 151669, None, "zlab", "training")
    target = qwen3_reference_configs()["Qwen3-8B"].to_dict()
    plan = plan_export(loaded, target)
    assert plan.layout == "dflash2"
    vllm, sglang = check_engines(plan.config, plan.tensors, target, taps)
    assert vllm.captured_layers == sglang.captured_layers == taps
    assert served.round(RoundShape()).parameters() == {n: p.numel() for n, p in module.named_parameters()}
    assert served.round(RoundShape()).drafts == 7 and served.sequential_passes() == 5


CPU_SDPA = {torch.ops.aten._scaled_dot_product_flash_attention_for_cpu:
            lambda q, k, v, *args, out_shape=None, **kwargs: flop_counter.sdpa_flop_count(q, k, v)}


def test_round_flops_equal_a_brute_force_count_of_the_real_decode_step():
    tiny = Qwen3Config(hidden_size=32, intermediate_size=48, num_attention_heads=4, num_key_value_heads=2,
                       head_dim=8, vocab_size=97, num_hidden_layers=4, max_position_embeddings=512)
    cfg = dflash2_config(block_size=5, mask_token_id=3)
    geometry = geometry_from_target_config(tiny)
    taps, before, new = 3, 11, 4
    module = randomize(kind_spec("dflash2").build(cfg, geometry, list(range(taps)), None)).eval()
    drafter = kind_spec("dflash2").block_drafter(module, cfg.labels)
    features, tokens = torch.randn(before + new, taps * 32), torch.randint(4, 97, (before + new,))
    cache: dict = {}
    anchor = torch.tensor([5])
    drafter.draft(DraftContext(features[:before], tokens[:before], cache), anchor, drafter.max_block_size, 1.0)
    with flop_counter.FlopCounterMode(display=False, custom_mapping=CPU_SDPA) as counter:
        drafter.draft(DraftContext(features, tokens, cache), anchor, drafter.max_block_size, 1.0)
    served = ServedDrafter("tiny", cfg, taps, geometry, None)
    modeled = served.round(RoundShape(batch=1, context_len=before + new, new_rows=new))
    assert modeled.drafts == drafter.max_block_size == 4
    assert modeled.flops == counter.get_total_flops()
