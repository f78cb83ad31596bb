"""Size presets of the tiny world.

A preset fixes every knob of ``deepspec tinyworld build``: how much corpus to generate, the tokenizer's
vocabulary, the target's architecture, how long to train it, and how many conversations to regenerate.
``test`` builds in well under a minute (integration tests build it once per session); ``small`` (the default)
builds in under four minutes on two idle CPU cores (18 on two cores shared with other jobs: a build runs every
step of its preset, whatever the load) and gives a target whose held-out loss is far below the unigram entropy of
each domain.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class TinyWorldPreset:
    name: str
    # Corpus: conversations generated per domain (code and prose are capped by what the stdlib holds).
    num_math: int
    num_code: int
    num_prose: int
    # Conversations per domain kept out of target training: half become validation, half the eval suites.
    heldout_per_domain: int
    # Tokenizer.
    vocab_size: int
    # Target (Qwen3ForCausalLM).
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    # Target training: windows of `seq_len` tokens, `batch_size` windows per step.
    seq_len: int
    batch_size: int
    # Every build runs all of them, however busy the machine: the world is a function of the preset and the seed
    # (``--max-train-seconds`` caps the time only when the user asks for it).
    max_steps: int
    lr: float
    warmup_steps: int
    # Regeneration of the drafters' train / validation conversations by the trained target.
    regen_train: int
    regen_validation: int
    regen_max_new_tokens: int
    regen_temperature: float
    regen_top_p: float
    regen_top_k: int
    regen_batch_size: int
    # Conversations of the long-context suite (``suites/long.jsonl``, ``tinyworld.long_suite``).
    long_suite_prompts: int


TEST = TinyWorldPreset(
    name="test",
    num_math=300,
    num_code=120,
    num_prose=120,
    heldout_per_domain=16,
    vocab_size=512,
    hidden_size=64,
    num_layers=2,
    num_heads=2,
    num_kv_heads=1,
    head_dim=32,
    intermediate_size=128,
    seq_len=128,
    batch_size=8,
    max_steps=120,
    lr=3e-3,
    warmup_steps=10,
    regen_train=24,
    regen_validation=12,
    regen_max_new_tokens=24,
    regen_temperature=0.8,
    regen_top_p=0.95,
    regen_top_k=50,
    regen_batch_size=12,
    long_suite_prompts=6,
)

# ``small`` is sized for the compute a 2-core CPU gives in a few minutes (~2.5e13 FLOPs): at that budget a
# small target that sees each corpus token about twice learns far more than a larger one that sees less than
# half of the corpus. Measured on 2 cores with 1 thread per run and the step count fixed: d 128 x 4 layers
# (1.3 M parameters, 680 steps) reached held-out code / prose / math losses of 3.92 / 4.55 / 0.59 nats against
# unigram entropies 6.05 / 6.40 / 3.48, where d 192 (2.4 M, 486 steps of the same wall time) reached
# 4.08 / 4.76 / 0.70 (both with 3,000 math problems). The preset before them, d 256 x 5 layers (4.7 M, 5,000
# math problems), fit 116 steps in its 330 s and reached only 5.41 / 6.34 / 0.90. Math is easy to learn, so
# fewer math problems leave more of the steps to code and prose. The preset keeps 5 layers (a 4-layer d 128
# target reached 4.13 / 4.84 / 0.70 in its own 381 s build) because the EAGLE-3 baseline taps three layers
# in 1..L-2 (low / mid / high, never the last layer). Its own build on 2 threads: 400 steps in 338 s,
# 4.34 / 5.11 / 0.72, 421 s in all; on 2 cores shared with other jobs (1 thread, load 6-8): 400 steps in 973 s,
# 4.341 / 5.106 / 0.718, 1,100 s in all.
#
# The drafters' conversations are sampled from the target as the quality benchmark decodes it, at T = 1 without
# top-p / top-k truncation: a drafter learns the distribution it will be asked to match. On validation prompts
# (never the suites), regenerating at T = 0.8, top-p 0.95, top-k 50 instead left DSpark / EAGLE-3 at a tau ratio of
# 1.017 [0.969, 1.067] at T = 1; at T = 1 untruncated the same recipes reach 1.144 [1.097, 1.193]
# (docs/contributors/lab_notebook.md, rows 2 and 5). The target and the prompts are unchanged, and so is the cost.
SMALL = TinyWorldPreset(
    name="small",
    num_math=3000,
    num_code=2600,
    num_prose=1200,
    heldout_per_domain=100,
    vocab_size=4096,
    hidden_size=128,
    num_layers=5,
    num_heads=2,
    num_kv_heads=1,
    head_dim=64,
    intermediate_size=384,
    seq_len=256,
    batch_size=16,
    max_steps=400,
    lr=3e-3,
    warmup_steps=20,
    regen_train=480,
    regen_validation=100,
    regen_max_new_tokens=160,
    regen_temperature=1.0,
    regen_top_p=1.0,
    regen_top_k=0,
    regen_batch_size=64,
    long_suite_prompts=24,
)

PRESETS: dict[str, TinyWorldPreset] = {p.name: p for p in (TEST, SMALL)}


def get_preset(name: str) -> TinyWorldPreset:
    """Return the preset called ``name``; an unknown name is an error listing the known ones."""
    if name not in PRESETS:
        raise ValueError(f"unknown tiny-world preset {name!r}; known: {sorted(PRESETS)}")
    return PRESETS[name]
