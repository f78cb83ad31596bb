"""The long-context memory terms of ``deepspec_train.costs.long_context_memory`` (through
``costs.worker_memory.long_context_memory``, the function the production rows use) against peaks measured on the real
code paths at Qwen3-8B scale-copy widths on CPU (``tests/helpers/peak_memory.py``: a fresh process, glibc ``mmap`` for
every large allocation, ``VmHWM`` reset before each call). Each case is sized so that its term dominates what is
measured, and runs in a fresh process of its own (5-12 s each on one core of a 2-core machine; the longest are the
drafter's dense-mask attention at 512 anchors x 7 slots and the 7-layer target at 6,144 tokens)."""

from __future__ import annotations

import pytest

from deepspec_train.costs import long_context_memory as lcm
from deepspec_train.models.reference_configs import qwen3_reference_configs
from deepspec_train.costs.reference_targets import reference_target_config
from deepspec_train.costs.worker_memory import long_context_memory, long_context_recipe
from tests.helpers.peak_memory import CASES, measure_cases

TOLERANCE = 0.20


def _close(case: dict) -> bool:
    return abs(case["predicted"] - case["measured"]) <= TOLERANCE * case["measured"]


@pytest.mark.slow
@pytest.mark.parametrize("name", list(CASES))
def test_each_term_is_within_20_percent_of_the_measured_peak(name: str) -> None:
    measured = measure_cases([name])[name]
    assert _close(measured), measured


def test_eager_attention_is_what_rules_out_32k() -> None:
    """At 32K the eager L x L term alone is beyond any GPU, while the sdpa layer transient is a few GB."""
    cfg = long_context_recipe("qwen3-8b", 32768)
    target, drafter = long_context_memory(cfg, reference_target_config(cfg, "Qwen3-8B"), 32768)
    assert target.eager_attention > 141e9 > 20 * target.layer_transient
    assert drafter.peak_bytes(checkpointing=True) < drafter.peak_bytes(checkpointing=False)
    assert lcm.eager_attention_bytes(qwen3_reference_configs()["Qwen3-8B"], 1, 2) == 32 * 10 + 2
