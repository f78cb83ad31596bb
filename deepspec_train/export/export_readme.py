"""The README.md written into every export (how vLLM and SGLang serve it, what each captures) and the modeling
file of the z-lab layout.

``export_readme(config, readings)`` renders the engine readings of ``engine_rules.check_engines``;
``zlab_modeling_source()`` is the text of ``zlab_dflash_modeling.py``, which ``deepspec export`` writes into a
z-lab export as ``dflash.py`` (its config.json's ``auto_map`` points ``AutoModel`` there).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from deepspec_train.export.engine_rules import EngineReading, describe

README_FILE = "README.md"
ZLAB_MODELING_FILE = "dflash.py"
_ZLAB_SOURCE = Path(__file__).with_name("zlab_dflash_modeling.py")


def zlab_modeling_source() -> str:
    """Source text of the z-lab DFlash modeling file (standalone: torch and transformers only)."""
    return _ZLAB_SOURCE.read_text()


def _zlab_section(config: Mapping[str, Any]) -> list[str]:
    block = config["block_size"]
    return [
        "## Load with transformers",
        "",
        f"`{ZLAB_MODELING_FILE}` in this directory is the drafter's modeling code (written by deepspec_train, "
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


def export_readme(config: Mapping[str, Any], readings: Sequence[EngineReading]) -> str:
    """README.md text for an export with ``config``, from the engines' readings."""
    arch = config["architectures"][0]
    lines = [
        f"# {arch} drafter exported by deepspec_train",
        "",
        "Target layers are 0-indexed decoder layers: layer k's output is transformers' `hidden_states[k + 1]`.",
        "",
        "## Serving",
        "",
    ]
    for reading in readings:
        lines += ["```", *describe(reading), "```", ""]
    if arch == "DFlashDraftModel":
        lines += _zlab_section(config)
    return "\n".join(lines)
