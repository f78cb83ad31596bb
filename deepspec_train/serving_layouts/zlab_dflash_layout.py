"""The ``zlab-dflash`` serving layout: z-lab's ``DFlashDraftModel``, only for a DFlash trained with z-lab labels.

Slot ``j >= 1`` of a block drafts the token at its own position, so a block of B drafts B - 1 tokens (vLLM's
``dflash`` method and SGLang's DFLASH). ``dflash_config`` holds the mask token and the taps, in our convention (both
engines add 1 inside). ``embed_tokens`` / ``lm_head`` are not stored: the engines use the target's. Next to the
weights goes ``dflash.py`` (``serving_layouts/zlab_dflash_modeling.py``), which config.json's ``auto_map`` points
``AutoModel`` at, so that ``AutoModel.from_pretrained(DIR, trust_remote_code=True)`` builds this drafter (without
it transformers silently builds a plain ``Qwen3Model``).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

from deepspec_train.config.schema import ZLAB_LABELS, DrafterConfig
from deepspec_train.families.records import BLOCK_CAPTURE
from deepspec_train.serving_layouts.draft_layers import QWEN3_MODEL_TYPE
from deepspec_train.serving_layouts.engine_reading import (
    EngineReading, ServePaths, TargetFacts, sglang_launch, speculative_config,
)
from deepspec_train.serving_layouts.layout_checks import (
    ConfigCheck, TensorSpec, config_geometry, mask_in_vocab, parallel_backbone,
)
from deepspec_train.serving_layouts.layout_spec import (
    ExportReading, ServingLayout, WrittenDrafter, holds_full_vocabulary, published_as_is, stacked_depth,
)
from deepspec_train.serving_layouts.parallel_engine_readers import BlockServing, always_served, block_layout_engines

if TYPE_CHECKING:
    from torch import nn

NAME = "zlab-dflash"
MODELING_FILE = "dflash.py"
_MODELING_SOURCE = Path(__file__).with_name("zlab_dflash_modeling.py")
_FROM_TARGET = ("embed_tokens.weight", "lm_head.weight")


def _fields(drafter: WrittenDrafter) -> dict[str, Any]:
    return {
        "model_type": QWEN3_MODEL_TYPE,
        "num_target_layers": drafter.module.geometry.num_target_layers,
        "block_size": drafter.block_size,
        "dflash_config": {"mask_token_id": drafter.mask_token_id, "target_layer_ids": list(drafter.target_layer_ids)},
        "auto_map": {"AutoModel": f"{MODELING_FILE.removesuffix('.py')}.DFlashDraftModel"},
    }


def _check(check: ConfigCheck) -> Optional[dict[str, TensorSpec]]:
    g = config_geometry(check)
    check.equals("model_type", QWEN3_MODEL_TYPE)
    num_layers = check.integer("num_hidden_layers", 1)
    num_target = check.integer("num_target_layers", 1)
    # z-lab blocks draft B-1 tokens: a block of 1 drafts nothing.
    check.integer("block_size", 2)
    if num_layers is not None:
        check.equals("layer_types", ["full_attention"] * num_layers)
    dflash = check.mapping("dflash_config")
    layer_ids = None
    if dflash is not None:
        mask_in_vocab(check, "mask_token_id", None if g is None else g.vocab, dflash, "dflash_config.")
        layer_ids = check.id_list("target_layer_ids", 0, num_target, dflash, "dflash_config.")
    if None in (g, num_layers, layer_ids):
        return None
    return parallel_backbone(g, num_layers, len(layer_ids))


def _taps(config: Mapping[str, Any]) -> list[int]:
    return list(config["dflash_config"]["target_layer_ids"])


def _read(config: Mapping[str, Any]) -> ExportReading:
    mask_id = config["dflash_config"]["mask_token_id"]
    drafter = DrafterConfig(
        num_layers=config["num_hidden_layers"], block_size=config["block_size"], markov_rank=0, confidence_head=False,
        labels=ZLAB_LABELS, mask_token_id=mask_id, intermediate_size=config["intermediate_size"],
    )
    return ExportReading(
        drafter=drafter,
        target_layer_ids=_taps(config),
        num_target_layers=config["num_target_layers"],
        mask_token_id=mask_id,
        confidence_temperatures=None,
    )


def vllm_serve(reading: EngineReading, config: Mapping[str, Any], tensors: Mapping[str, Any], target: TargetFacts,
               paths: ServePaths) -> None:
    """vLLM's serve line of a 1 + N block layout (this one and DFlash2's): ``dflash``, ``block_size - 1`` drafts."""
    block = int(config.get("block_size", 0))
    spec = {"method": "dflash", "model": paths.export, "num_speculative_tokens": block - 1}
    reading.serve_commands.append(f"vllm serve {paths.target} --speculative-config {speculative_config(spec)}")


def sglang_serve(reading: EngineReading, config: Mapping[str, Any], tensors: Mapping[str, Any], target: TargetFacts,
                 paths: ServePaths) -> None:
    """SGLang's serve line of a 1 + N block layout (this one and DFlash2's): ``DFLASH`` with the whole block."""
    block = int(config.get("block_size", 0))
    reading.serve_commands.append(f"{sglang_launch(paths, 'DFLASH')} --speculative-num-draft-tokens {block}")


def _companion_files() -> dict[str, str]:
    return {MODELING_FILE: _MODELING_SOURCE.read_text()}


def _readme_section(config: Mapping[str, Any]) -> list[str]:
    block = config["block_size"]
    return [
        "## Load with transformers",
        "",
        f"`{MODELING_FILE}` in this directory is the drafter's modeling code (written by deepspec_train, "
        "needs torch and transformers only); `config.json` maps `AutoModel` to it:",
        "",
        "```python",
        "from transformers import AutoModel, AutoModelForCausalLM, AutoTokenizer",
        "",
        'draft = AutoModel.from_pretrained("THIS_DIR", trust_remote_code=True, dtype="auto").eval()',
        'target = AutoModelForCausalLM.from_pretrained("TARGET_DIR", dtype="auto").eval()',
        'tokenizer = AutoTokenizer.from_pretrained("TARGET_DIR")',
        'ids = tokenizer.apply_chat_template([{"role": "user", "content": "Hi"}], add_generation_prompt=True,',
        '                                    return_tensors="pt")',
        "out = draft.spec_generate(input_ids=ids, max_new_tokens=256, target=target,",
        "                          stop_token_ids=[tokenizer.eos_token_id])",
        "```",
        "",
        "`spec_generate` decodes greedily (temperature 0) and returns the target's own greedy continuation; "
        "`draft(target_hidden, noise_embedding, position_ids)` returns the block states "
        f"(slot j >= 1 drafts position p + j, so a block of {block} drafts {block - 1} tokens) and "
        "`draft.compute_logits(states, target.get_output_embeddings())` their logits. Without "
        "`trust_remote_code=True` transformers builds a plain `Qwen3Model` from this directory, which is not "
        "this drafter.",
        "",
    ]


def _unwritten(module: "nn.Module") -> frozenset[str]:
    return frozenset(_FROM_TARGET)


ZLAB_DFLASH_LAYOUT = ServingLayout(
    name=NAME,
    architecture="DFlashDraftModel",
    holds=holds_full_vocabulary,
    capture=BLOCK_CAPTURE,
    from_target=_FROM_TARGET,
    copies_target_heads=False,
    carries_temperatures=False,
    unwritten=_unwritten,
    depth=stacked_depth,
    fields=_fields,
    check=_check,
    taps=_taps,
    read=_read,
    engines=block_layout_engines(NAME, BlockServing(always_served, vllm_serve),
                                 BlockServing(always_served, sglang_serve)),
    complete_published=published_as_is,
    target_vocab_tensors=(),
    companion_files=_companion_files,
    readme_section=_readme_section,
)
