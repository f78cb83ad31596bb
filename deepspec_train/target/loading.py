"""Load the frozen target model and its tokenizer from a local directory (``from_pretrained``)."""

from __future__ import annotations

import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

from deepspec_train.config.schema import TargetConfig

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    """``auto`` means bf16 on GPU and fp32 on CPU (CPU bf16 matmuls are slow and only hurt tests)."""
    if name == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return DTYPES[name]


def load_target_config(cfg: TargetConfig):
    return AutoConfig.from_pretrained(cfg.path, trust_remote_code=cfg.trust_remote_code)


def load_tokenizer(cfg: TargetConfig) -> PreTrainedTokenizerBase:
    return AutoTokenizer.from_pretrained(cfg.path, trust_remote_code=cfg.trust_remote_code)


def load_target_model(cfg: TargetConfig, device: torch.device) -> PreTrainedModel:
    """The target in eval mode with gradients off: it only ever runs forward."""
    model = AutoModelForCausalLM.from_pretrained(
        cfg.path, dtype=resolve_dtype(cfg.dtype, device), trust_remote_code=cfg.trust_remote_code
    )
    model.to(device).eval()
    model.requires_grad_(False)
    return model
