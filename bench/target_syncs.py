"""Host syncs of the target forward in a training step: device values read into Python (``bench/host_syncs.py``)
while a colocated step's chunks run through the target, with the tap building the layers' attention mask itself
(``target.layer_masks``) and with transformers' own mask building (what the tap did before), then the whole step's
count with the trainer's (``bench/step_time.py``).

    python bench/target_syncs.py [--json PATH]

A random tiny Qwen3 target (``sdpa``) runs one step of 8 sequences in 2 chunks of 4 (``train.micro_batch_sequences``):
one chunk of equal lengths (no padding) and one of different lengths (right padding), through the colocated
source's own ``ChunkBuilder``. Only the target forwards are counted: the packer's reads are of the step plan's host
tensors (token ids, anchors), which stay on the host on a GPU machine too.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from host_syncs import HostSyncCounter  # noqa: E402  (a sibling script, run as a file)
from step_time import measure  # noqa: E402

SEQUENCES, CHUNK, LENGTH, ANCHORS, BLOCK, VOCAB = 8, 4, 48, 6, 4, 97


def step_rows() -> list[dict]:
    """A step's rows: the first chunk all ``LENGTH`` tokens long, the second of four different lengths."""
    generator = torch.Generator().manual_seed(0)
    lengths = [LENGTH] * CHUNK + [LENGTH - 7 * i for i in range(CHUNK)]
    return [{"input_ids": torch.randint(0, VOCAB - 1, (n,), generator=generator).tolist(),
             "loss_mask": [0] * 8 + [1] * (n - 8), "sample_id": i} for i, n in enumerate(lengths)]


class _CountedTap:
    """A tap whose forwards are counted by ``counter`` (and only they)."""

    def __init__(self, tap, counter: HostSyncCounter) -> None:
        self.tap, self.counter, self.forwards = tap, counter, 0

    def __call__(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None):
        self.forwards += 1
        with self.counter:
            return self.tap(input_ids, attention_mask)


def target_reads(builds_masks: bool) -> dict:
    """Reads of one step's target forwards with the tap's own masks (``builds_masks``) or transformers'."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from deepspec_train.steps.chunk_builder import ChunkBuilder
    from deepspec_train.steps.chunk_plan import PackingSpec
    from deepspec_train.steps.plan import StepPlan
    from deepspec_train.target.hidden_states import TargetTap

    torch.manual_seed(0)
    config = Qwen3Config(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=4,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=8, attn_implementation="sdpa")
    tap = TargetTap(Qwen3ForCausalLM(config).eval(), [0, 2])
    tap.builds_masks = builds_masks
    spec = PackingSpec(BLOCK, ANCHORS, 256, VOCAB - 1, CHUNK)
    counter = HostSyncCounter(where=True)
    counted = _CountedTap(tap, counter)
    plan = StepPlan(step_rows(), SEQUENCES, 0, spec, 0, 1, shuffle=False)
    ChunkBuilder(counted, spec, "cpu").build_all(plan.chunks(0))
    return {"forwards": counted.forwards, "reads": counter.count, "callers": dict(counter.callers)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", help="write the result as JSON to this path")
    args = parser.parse_args()
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    tap, transformers_masks = target_reads(True), target_reads(False)
    trainer = measure(steps=6, device=torch.device("cpu"))["syncs_per_step"]
    result = {"target_reads_per_step": tap["reads"], "trainer_reads_per_step": trainer,
              "step_reads": tap["reads"] + trainer, "forwards_per_step": tap["forwards"],
              "before_target_reads_per_step": transformers_masks["reads"],
              "before_step_reads": transformers_masks["reads"] + trainer,
              "before_callers": transformers_masks["callers"]}
    text = json.dumps(result, indent=2)
    if args.json:
        Path(args.json).write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
