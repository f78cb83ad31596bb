"""Peak memory of the drafter loss, naive full logits vs chunked, at the Qwen3-8B LM-head shape.

Run: ``PYTHONPATH=. python bench/loss_memory.py [--positions 3584 --vocab 151936 --hidden 4096 --chunk 512]``
(on a 24 GiB CPU machine: ``--positions 512 1024``, and ``--positions 1024 --chunk 146`` to keep the issue's
positions-per-chunk ratio of 7).

For each position count it measures forward + backward of the loss twice, side by side: the naive version
(full ``[positions, V]`` logits of both models, autograd) and ``selected_logit_loss`` with ``--chunk`` rows per
chunk. The DSpark setting is used: the drafter's head is a frozen copy of the target's (one shared tensor), a
trainable rank-``--markov-rank`` Markov head and a confidence logit. The issue's shape is 512 anchors x 7 slots
= 3,584 positions; full-size naive fp32 needs well over 10 GB, so on a small CPU machine run fewer positions
and read how the ratio scales (it falls roughly like chunk / positions).

Each measurement runs in a fresh subprocess. On CUDA it reads ``torch.cuda.max_memory_allocated``; on CPU the
peak resident set size (``ru_maxrss``) minus the resident size once the inputs exist and a tiny warm-up call
has initialised the kernels, so the figure is what the loss itself adds on top of its inputs.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time

import torch
import torch.nn.functional as F

from deepspec_train.losses import LossSettings, SupervisedRows, decay_weights, selected_logit_loss

GIB = 1024**3


def naive_loss(inputs: dict) -> torch.Tensor:
    """The straightforward computation: full logits for every position, autograd for the backward."""
    with torch.no_grad():
        p_target = torch.softmax((inputs["target_hidden"] @ inputs["target_head_weight"].T).float(), dim=-1)
    logits = (inputs["draft_hidden"] @ inputs["draft_head_weight"].T).float()
    logits = logits + inputs["markov_rows"] @ inputs["markov_w2"].T
    log_p_draft = torch.log_softmax(logits, dim=-1)
    p_draft = log_p_draft.exp()
    ce = -log_p_draft.gather(1, inputs["labels"].unsqueeze(1)).squeeze(1)
    tv = 0.5 * (p_draft - p_target).abs().sum(dim=-1)
    c_star = torch.minimum(p_draft, p_target).sum(dim=-1).detach()
    bce = F.binary_cross_entropy_with_logits(inputs["conf_logits"].float(), c_star, reduction="none")
    per_row = 0.1 * ce + 0.9 * tv + 1.0 * bce
    return (inputs["weights"] * per_row).sum() / per_row.shape[0]


def chunked_loss(inputs: dict, chunk: int) -> torch.Tensor:
    return selected_logit_loss(SupervisedRows(**inputs), LossSettings(chunk_size=chunk)).loss


def make_inputs(positions: int, vocab: int, hidden: int, rank: int, dtype: torch.dtype, device: str) -> dict:
    """Random inputs at the requested shape; scaled so logits have a realistic spread of a few units."""
    g = torch.Generator(device=device).manual_seed(0)

    def rand(*shape: int, scale: float) -> torch.Tensor:
        # In place, so that creating the inputs leaves no peak above the inputs themselves.
        return torch.randn(*shape, generator=g, device=device, dtype=dtype).mul_(scale)

    head = rand(vocab, hidden, scale=hidden**-0.5)
    return {
        "draft_hidden": rand(positions, hidden, scale=1.0).requires_grad_(),
        "draft_head_weight": head,
        "target_hidden": rand(positions, hidden, scale=1.0),
        "target_head_weight": head,
        "labels": torch.randint(0, vocab, (positions,), generator=g, device=device),
        "weights": decay_weights(torch.arange(positions, device=device) % 7, 4.0),
        "markov_rows": rand(positions, rank, scale=0.1).requires_grad_(),
        "markov_w2": rand(vocab, rank, scale=0.1).requires_grad_(),
        "conf_logits": rand(positions, scale=1.0).requires_grad_(),
    }


def measure(variant: str, args: argparse.Namespace) -> dict:
    """Run one variant in this process and return its extra peak memory in bytes."""
    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[args.dtype]

    def run(inputs: dict) -> tuple[float, float]:
        loss = naive_loss(inputs) if variant == "naive" else chunked_loss(inputs, args.chunk)
        loss.backward()
        return float(loss.detach()), float(inputs["draft_hidden"].grad.norm())

    # Warm up the kernels on a toy shape, before the real inputs exist, so that nothing but the loss can
    # raise the high-water mark afterwards.
    run(make_inputs(4, 64, 32, 8, dtype, device))
    inputs = make_inputs(args.positions[0], args.vocab, args.hidden, args.markov_rank, dtype, device)
    if device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        baseline = torch.cuda.memory_allocated()
    else:
        baseline = _current_rss_bytes()
        if _max_rss_bytes() > baseline + 64 * 2**20:
            raise RuntimeError("setting up the inputs peaked above their resident size; the peak would be hidden")
    start = time.perf_counter()
    loss, grad_norm = run(inputs)
    if device == "cuda":
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated() - baseline
    else:
        peak = _max_rss_bytes() - baseline
    return {"variant": variant, "peak_bytes": peak, "seconds": time.perf_counter() - start, "loss": loss,
            "grad_norm": grad_norm, "device": device}


def _max_rss_bytes() -> int:
    # Linux reports ru_maxrss in KiB.
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _current_rss_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * resource.getpagesize()


def measure_in_subprocess(variant: str, positions: int, args: argparse.Namespace) -> dict:
    cmd = [sys.executable, __file__, "--measure", variant, "--positions", str(positions), "--vocab",
           str(args.vocab), "--hidden", str(args.hidden), "--chunk", str(args.chunk), "--markov-rank",
           str(args.markov_rank), "--dtype", args.dtype]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        return {"variant": variant, "error": (done.stderr.strip().splitlines() or [f"rc {done.returncode}"])[-1]}
    return json.loads(done.stdout.strip().splitlines()[-1])


def logits_bytes(positions: int, vocab: int) -> int:
    """fp32 logits of one model: what the naive version holds per model, several times over."""
    return positions * vocab * 4


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--positions", type=int, nargs="+", default=[512 * 7])
    parser.add_argument("--vocab", type=int, default=151936)
    parser.add_argument("--hidden", type=int, default=4096)
    parser.add_argument("--chunk", type=int, default=512)
    parser.add_argument("--markov-rank", type=int, default=256)
    parser.add_argument("--dtype", choices=["fp32", "bf16"], default="fp32")
    parser.add_argument("--measure", choices=["naive", "chunked"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.measure:
        print(json.dumps(measure(args.measure, args)))
        return

    print(f"loss forward+backward, V={args.vocab}, d={args.hidden}, Markov rank {args.markov_rank}, "
          f"chunk {args.chunk}, {args.dtype} inputs, fp32 logits")
    header = (f"{'positions':>9} | {'naive GiB':>9} | {'chunked GiB':>11} | {'ratio':>6} | {'naive s':>7} | "
              f"{'chunked s':>9} | {'|loss diff|':>11} | {'logits GiB (2 models)':>21}")
    print(header)
    print("-" * len(header))
    for positions in args.positions:
        naive = measure_in_subprocess("naive", positions, args)
        chunked = measure_in_subprocess("chunked", positions, args)
        analytic = 2 * logits_bytes(positions, args.vocab) / GIB
        if "error" in naive or "error" in chunked:
            print(f"{positions:>9} | failed: {naive.get('error') or chunked.get('error')}")
            continue
        print(f"{positions:>9} | {naive['peak_bytes'] / GIB:>9.3f} | {chunked['peak_bytes'] / GIB:>11.3f} | "
              f"{chunked['peak_bytes'] / naive['peak_bytes']:>6.3f} | {naive['seconds']:>7.1f} | "
              f"{chunked['seconds']:>9.1f} | {abs(naive['loss'] - chunked['loss']):>11.2e} | {analytic:>21.3f}")

    full = 512 * 7
    per_model, per_chunk = logits_bytes(full, args.vocab), logits_bytes(min(args.chunk, full), args.vocab)
    print(f"\nanalytic at 512 anchors x 7 slots = {full} positions: fp32 logits {per_model / GIB:.3f} GiB per model "
          f"({2 * per_model / GIB:.3f} GiB both); per chunk of {args.chunk}: {per_chunk / GIB:.3f} GiB per model; "
          f"logits ratio chunk/full = {per_chunk / per_model:.3f}")


if __name__ == "__main__":
    main()
