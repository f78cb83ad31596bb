"""Step time and host syncs per step of the drafter trainer on pre-made micro-batches (one process, CPU or CUDA).

    python bench/step_time.py [--steps N] [--device cpu|cuda] [--json PATH]
    python bench/step_time.py --compare DIR      # DIR: another checkout of the package, e.g. `git archive` of HEAD

A random DSpark drafter (2 layers, d 128, vocabulary 2,048, block 7) trains ``N`` optimizer steps of 8 random
sequences of 256 tokens (16 anchors each, 1,024-row micro-batches) through ``DrafterTrainer.fit``; the source hands
the trainer micro-batches built before timing, so what is timed and counted is the trainer's step alone (forward,
loss, backward, reduction, optimizer, metrics). One step is the time between two requests of the trainer for its
next step's batches. It prints the median step time, and the host syncs per step (``bench/host_syncs.py``) outside
logging steps and on them.

``--compare DIR`` runs this script three times alternately under DIR's package and under this checkout's, in one
invocation, and prints both medians and their ratio (this checkout / DIR): a before / after figure taken on the
same machine in the same minutes.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from host_syncs import HostSyncCounter  # noqa: E402  (a sibling script, run as a file)

VOCAB, HIDDEN, BLOCK, SEQUENCES, LENGTH, ANCHORS, BUDGET = 2048, 128, 7, 8, 256, 16, 1024
LOG_EVERY = 4


def _recipe(out_dir: str, steps: int):
    from deepspec_train.config.schema import DrafterConfig, RecipeConfig

    cfg = RecipeConfig()
    drafter = DrafterConfig(kind="dspark", num_layers=2, block_size=BLOCK, markov_rank=32, mask_token_id=VOCAB - 1)
    return dataclasses.replace(
        cfg,
        run=dataclasses.replace(cfg.run, output_dir=out_dir),
        target=dataclasses.replace(cfg.target, layer_ids=[0, 2], dtype="float32"),
        drafter=drafter,
        train=dataclasses.replace(cfg.train, mixed_precision="no", checkpoint_every=10**9, eval_every=10**9,
                                  global_batch_sequences=SEQUENCES, micro_batch_sequences=SEQUENCES),
        logging=dataclasses.replace(cfg.logging, wandb=False, progress=False, log_every=LOG_EVERY),
    )


def _step_batches(device: torch.device):
    from deepspec_train.packing.anchors import sample_anchors
    from deepspec_train.packing.packer import SequenceItem, pack_sequences
    from deepspec_train.training.feature_source import StepBatches

    generator = torch.Generator().manual_seed(0)
    items = []
    for index in range(SEQUENCES):
        mask = torch.zeros(LENGTH, dtype=torch.bool)
        mask[LENGTH // 4:] = True
        items.append(SequenceItem(
            input_ids=torch.randint(0, VOCAB - 1, (LENGTH,), generator=generator), loss_mask=mask,
            ctx_features=torch.randn(LENGTH, 2 * HIDDEN, generator=generator),
            final_hidden=torch.randn(LENGTH, HIDDEN, generator=generator), sample_id=index,
        ))
    anchors = [sample_anchors(item.loss_mask, ANCHORS, generator) for item in items]
    batches = [batch.to(device) for batch in pack_sequences(items, anchors, BLOCK, BUDGET, VOCAB - 1)]
    return lambda: StepBatches.of(batches)


class _TimedSource:
    """Yields the same pre-made step forever; records the time and host syncs between the trainer's requests."""

    def __init__(self, make_step, counter: HostSyncCounter, device: torch.device) -> None:
        self.make_step, self.counter, self.device = make_step, counter, device
        self.intervals: list[tuple[float, int]] = []
        self._last = None

    def __iter__(self):
        while True:
            if self.device.type == "cuda":
                torch.cuda.synchronize()
            now = time.perf_counter()
            if self._last is not None:
                self.intervals.append((now - self._last, self.counter.count))
            step = self.make_step()
            self.counter.reset()
            self._last = time.perf_counter()
            yield step

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass

    def pop_metrics(self) -> dict:
        return {}


def measure(steps: int, device: torch.device) -> dict:
    """Train ``steps`` steps; the median step time and the syncs of steps outside and on logging steps."""
    from deepspec_train.metrics.sinks import NoOpSink
    from deepspec_train.models.geometry import DrafterGeometry
    from deepspec_train.models.parallel_drafter import ParallelDrafter
    from deepspec_train.training.batch_loss import DrafterLoss
    from deepspec_train.training.distributed import DistContext
    from deepspec_train.training.trainer import DrafterTrainer

    torch.manual_seed(0)
    geometry = DrafterGeometry(HIDDEN, 256, 4, 2, 32, 1e-6, 10000.0, VOCAB, 4, 4096)
    with tempfile.TemporaryDirectory() as out_dir:
        cfg = _recipe(out_dir, steps)
        model = ParallelDrafter(geometry, cfg.drafter, [0, 2]).to(device).train()
        head = torch.randn(VOCAB, HIDDEN, generator=torch.Generator().manual_seed(1)).to(device)
        loss = DrafterLoss.for_recipe(cfg, head, "sdpa")
        ctx = DistContext(0, 1, 0, device, None)
        with HostSyncCounter() as counter:
            source = _TimedSource(_step_batches(device), counter, device)
            trainer = DrafterTrainer(cfg, model, loss, source, None, NoOpSink(), ctx, steps)
            trainer.fit()
    # Interval i (0-based) is step i + 1 (1-based); the first one also holds the set-up and is left out.
    timed = [(step, seconds, syncs) for step, (seconds, syncs) in enumerate(source.intervals, start=1) if step > 1]
    plain = [syncs for step, _, syncs in timed if step % LOG_EVERY]
    logged = [syncs for step, _, syncs in timed if step % LOG_EVERY == 0]
    return {
        "step_s": statistics.median(seconds for _, seconds, _ in timed),
        "syncs_per_step": max(plain),
        "syncs_per_log_step": max(logged) if logged else None,
    }


def _compare(base: Path, steps: int, rounds: int = 3) -> dict:
    """This script under ``base``'s package and under this checkout's, alternately; medians and their ratio."""
    here = Path(__file__).resolve().parent.parent
    runs: dict[str, list[dict]] = {"before": [], "after": []}
    for _ in range(rounds):
        for label, tree in (("before", base), ("after", here)):
            env = os.environ | {"PYTHONPATH": str(tree), "OMP_NUM_THREADS": "1"}
            out = subprocess.run([sys.executable, __file__, "--steps", str(steps), "--json", "-"], env=env,
                                 check=True, capture_output=True, text=True, cwd=tree).stdout
            runs[label].append(json.loads(out.strip().splitlines()[-1]))
    summary = {label: {"step_s": statistics.median(r["step_s"] for r in results),
                       "syncs_per_step": results[0]["syncs_per_step"],
                       "syncs_per_log_step": results[0]["syncs_per_log_step"]}
               for label, results in runs.items()}
    summary["ratio_after_over_before"] = summary["after"]["step_s"] / summary["before"]["step_s"]
    return summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=14)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--json", help="write the result as JSON to this path ('-': stdout)")
    parser.add_argument("--compare", type=Path, help="another checkout of the package to compare with")
    args = parser.parse_args()
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    result = _compare(args.compare, args.steps) if args.compare else measure(args.steps, torch.device(args.device))
    text = json.dumps(result, indent=None if args.json == "-" else 2)
    if args.json and args.json != "-":
        Path(args.json).write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
