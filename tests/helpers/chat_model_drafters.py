"""Test helpers for the decoding tests (evaluator, losslessness, drafting cache, quality bench): the tiny random
target loaded like a real one, and random drafters for it.

``random_drafter(target, kind)`` builds a DSpark, DFlash, EAGLE-3 or DFlash2 drafter for the tiny target with
random weights (Markov ``W2``, the confidence bias, DFlash2's convolutions and selector too, so those heads are not
trivially zero or the identity) and the target's embedding / LM head copied in. Speculative decoding must be lossless for any drafter, so random weights are
enough for the exactness tests.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

from deepspec_train.config.schema import DrafterConfig, RecipeConfig, TargetConfig
from deepspec_train.formats.drafter_loader import LoadedDrafter
from deepspec_train.models.dflash2_drafter import DFlash2Drafter
from deepspec_train.models.eagle3_drafter import Eagle3Drafter
from deepspec_train.kinds.builder import build_drafter_for_geometry
from deepspec_train.models.geometry import geometry_from_target_config
from tests.helpers.dflash2_drafters import randomize
from tests.helpers.tiny_chat_model import save_tiny_chat_model

BLOCK = 4
LAYER_IDS = {"dspark": [0], "dflash": [0], "eagle3": [0, 0, 0], "dflash2": [0]}


def load_tiny_target(directory: Path) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Save the tiny random chat model to ``directory`` and load it back in fp32 eval mode."""
    path = save_tiny_chat_model(directory)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    return model, AutoTokenizer.from_pretrained(path)


def drafted_block(kind: str, drafts: int) -> int:
    """The block size of a ``kind`` drafter that drafts ``drafts`` tokens per block: DFlash2's 1 + N layout spends
    its first slot on the anchor, so it needs one more slot than the others for the same budget."""
    return drafts + 1 if kind == "dflash2" else drafts


def drafter_recipe(
    kind: str, mask_token_id: int, block_size: int = BLOCK, draft_vocab_size: Optional[int] = None
) -> RecipeConfig:
    settings = {
        "dspark": dict(num_layers=1, markov_rank=8, confidence_head=True, draft_vocab_size=draft_vocab_size),
        "dflash": dict(num_layers=1, markov_rank=0, confidence_head=False),
        "eagle3": dict(
            num_layers=1, markov_rank=0, confidence_head=False, ttt_steps=block_size, draft_vocab_size=draft_vocab_size
        ),
        "dflash2": dict(num_layers=1, markov_rank=0, confidence_head=False, labels="zlab", conv_kernel_size=2,
                        conv_group_size=8, selector_rank=8, selector_top_k=8),
    }[kind]
    drafter = DrafterConfig(kind=kind, block_size=drafted_block(kind, block_size), mask_token_id=mask_token_id,
                            **settings)
    return RecipeConfig(drafter=drafter, target=TargetConfig(layer_ids=LAYER_IDS[kind]))


def random_drafter(
    target: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    kind: str,
    seed: int = 0,
    block_size: int = BLOCK,
    draft_vocab_size: Optional[int] = None,
) -> LoadedDrafter:
    """A random-weight drafter of ``kind`` for the tiny target, heads filled from the target. An EAGLE-3 or DSpark
    drafter with ``draft_vocab_size`` keeps a random subset of that many target tokens as its draft vocabulary."""
    mask_id = tokenizer.convert_tokens_to_ids("<|mask|>")
    cfg = drafter_recipe(kind, mask_id, block_size, draft_vocab_size)
    torch.manual_seed(seed)
    geometry = geometry_from_target_config(target.config, intermediate_size=48)
    token_counts = torch.randperm(geometry.vocab_size) if draft_vocab_size or kind == "eagle3" else None
    module = build_drafter_for_geometry(cfg, geometry, token_counts)
    embed = target.get_input_embeddings().weight.detach().float()
    if isinstance(module, Eagle3Drafter):
        module.load_target_embedding(embed)
        with torch.no_grad():
            head = target.get_output_embeddings().weight.detach()
            module.lm_head.weight.copy_(head[module.draft_vocab.target_ids()])
    else:
        module.load_target_heads(embed, target.get_output_embeddings().weight.detach().float())
        with torch.no_grad():
            if module.markov_head is not None:
                module.markov_head.markov_w2.weight.normal_(std=0.5)
            if module.confidence_head is not None:
                module.confidence_head.proj.bias.fill_(0.5)
    if isinstance(module, DFlash2Drafter):
        randomize(module, seed)
    return LoadedDrafter(
        module=module.eval(),
        kind=kind,
        block_size=cfg.drafter.block_size,
        target_layer_ids=LAYER_IDS[kind],
        mask_token_id=mask_id,
        confidence_temperatures=None,
        labels=cfg.drafter.labels,
        source="training",
    )
