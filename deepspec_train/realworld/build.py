"""Turn a causal-LM GGUF file into a plain transformers target folder, the real world's target.

transformers reads a GGUF file by dequantizing every tensor into a model whose config keeps a GGUF
``quantization_config``; ``save_pretrained`` refuses such a model. The build copies its state dict into a fresh
model built from the same config without the quantization (every key must match), casts it to the asked dtype
and saves safetensors, the tokenizer with its chat template, the generation config and ``realworld.json`` (the
source's SHA-256, versions, timings and the check below). The check reloads the saved folder and compares its
greedy answers to a few prompts with the GGUF-loaded model's, its weights rounded to the same dtype: a copy that
lost or misnamed a tensor answers differently.
"""

from __future__ import annotations

import json
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from deepspec_train.common.errors import UserError
from deepspec_train.realworld.gguf_source import GgufSource

MANIFEST = "realworld.json"
CHECK_PROMPTS = ("What is 17 times 23?", "Write a Python function that reverses a string.",
                 "Name three colours of the rainbow.")
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass
class BuildReport:
    """What a build did: where it wrote, how long each stage took, and the greedy check's answers."""

    out: Path
    source: GgufSource
    dtype: str
    num_parameters: int
    timings: dict[str, float] = field(default_factory=dict)
    check: list[dict[str, Any]] = field(default_factory=list)

    @property
    def check_passed(self) -> bool:
        return all(item["equal"] for item in self.check)


def _greedy(model, tokenizer, prompt: str, new_tokens: int) -> list[int]:
    ids = tokenizer.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True,
                                        return_tensors="pt", return_dict=True)["input_ids"]
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=new_tokens, do_sample=False, pad_token_id=tokenizer.pad_token_id)
    return out[0, ids.shape[1]:].tolist()


def plain_copy(gguf_model, dtype: torch.dtype):
    """A model of the same class and config without the GGUF quantization, holding the same tensors in ``dtype``."""
    config = gguf_model.config.__class__.from_dict(gguf_model.config.to_dict())
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.dtype = dtype
    plain = type(gguf_model)(config)
    missing, unexpected = plain.load_state_dict(gguf_model.state_dict(), strict=False)
    # A tied head is the embedding itself: its key may be absent from one side without a tensor being lost.
    tied = {"lm_head.weight"} if config.tie_word_embeddings else set()
    if set(missing) - tied or set(unexpected) - tied:
        raise UserError(f"the GGUF model's tensors do not match a fresh {type(gguf_model).__name__}: "
                        f"missing {sorted(missing)[:3]}, unexpected {sorted(unexpected)[:3]}")
    return plain.to(dtype).eval()


def parameters_in(model, dtype: torch.dtype):
    """``model`` with its parameters (not its buffers) in ``dtype``: what ``from_pretrained(dtype=...)`` builds,
    whose RoPE frequencies stay float32 (``model.to(dtype)`` would round them too and decode differently)."""
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.data = parameter.data.to(dtype)
    return model


def _prepare_out(out: Path, force: bool) -> None:
    if out.exists() and any(out.iterdir()):
        if not force:
            raise UserError(f"--out {out} is not empty; pass --force to replace it")
        shutil.rmtree(out)
    out.mkdir(parents=True, exist_ok=True)


def build_target(source: GgufSource, out: str | Path, dtype: str = "float32", check_tokens: int = 16,
                 check_prompts: tuple[str, ...] = CHECK_PROMPTS, force: bool = False) -> BuildReport:
    """Write the plain HF folder for ``source`` into ``out`` and check it (see the module docstring)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer, __version__ as transformers_version
    import gguf

    out = Path(out)
    _prepare_out(out, force)
    started = time.perf_counter()
    tokenizer = AutoTokenizer.from_pretrained(source.folder, gguf_file=source.file_name)
    gguf_model = AutoModelForCausalLM.from_pretrained(source.folder, gguf_file=source.file_name).eval()
    loaded = time.perf_counter()
    plain = plain_copy(gguf_model, DTYPES[dtype])
    plain.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    saved = time.perf_counter()
    report = BuildReport(out, source, dtype, sum(p.numel() for p in plain.parameters()),
                         {"load_gguf_s": loaded - started, "save_s": saved - loaded})
    model_class = type(plain).__name__
    del plain
    reference = parameters_in(gguf_model, DTYPES[dtype])
    copy = AutoModelForCausalLM.from_pretrained(out, dtype=DTYPES[dtype]).eval()
    reloaded_tokenizer = AutoTokenizer.from_pretrained(out)
    for prompt in check_prompts:
        expected = _greedy(reference, tokenizer, prompt, check_tokens)
        got = _greedy(copy, reloaded_tokenizer, prompt, check_tokens)
        report.check.append({"prompt": prompt, "equal": expected == got, "tokens": len(expected),
                             "answer": reloaded_tokenizer.decode(got)})
    report.timings["check_s"] = time.perf_counter() - saved
    manifest = {
        "source": {"path": str(source.path), "sha256": source.sha256, "architecture": source.architecture,
                   "name": source.name, "bytes": source.path.stat().st_size},
        "dtype": dtype, "num_parameters": report.num_parameters, "model_class": model_class,
        "versions": {"transformers": transformers_version, "gguf": getattr(gguf, "__version__", "unknown"),
                     "torch": torch.__version__},
        "timings_s": {k: round(v, 2) for k, v in report.timings.items()},
        "greedy_check": {"new_tokens": check_tokens, "passed": report.check_passed, "prompts": report.check},
    }
    (out / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
    if not report.check_passed:
        bad = next(item["prompt"] for item in report.check if not item["equal"])
        raise UserError(f"the saved copy in {out} answers {bad!r} differently from the GGUF model: "
                        "not a faithful copy")
    return report
