"""What exact decode-time table shortcuts would save per drafted token, for DSpark's RNN Markov step and EAGLE-3's
step, at the tiny world's shapes (one torch thread, the products timed alone).

    python bench/decode_shortcuts.py [--ranks 128 192 256] [--calls 4000]

- DSpark, RNN head: each slot computes ``J [s ; W1[x_prev]] + (J_h h + b)``. The token part ``J_e W1[x_prev]`` only
  depends on the token, so a ``[V, 3r]`` table precomputed once could replace it, leaving ``J_s s``. Printed next
  to it: the slot's bias product ``W2 u`` (``[V, r]``), the cost a higher rank adds.
- EAGLE-3: each step projects ``[norm(embed(x)) ; norm(h)]`` to queries, keys and values. The embedding half only
  depends on the token, so a ``[V, q + k + v]`` table could replace it, leaving the hidden half.

Both shortcuts are exact (the same sums in another order); the benchmark shows whether adopting them would change
the drafters' draft-time comparison (docs/explanation/drafter_quality.md).
"""

from __future__ import annotations

import argparse
import time
from typing import Callable

import torch
import torch.nn.functional as F

from deepspec_train.tinyworld.presets import get_preset


def microseconds(call: Callable[[], object], calls: int) -> float:
    """Mean thread CPU time of ``call`` in microseconds, after a warm-up."""
    for _ in range(calls // 20):
        call()
    start = time.thread_time()
    for _ in range(calls):
        call()
    return (time.thread_time() - start) / calls * 1e6


def check_equal(what: str, expected: tuple[torch.Tensor, ...], got: tuple[torch.Tensor, ...]) -> None:
    """The shortcut must compute what the step computes (up to float rounding), or its timing means nothing."""
    for a, b in zip(expected, got, strict=True):
        if not torch.allclose(a, b, rtol=1e-4, atol=1e-3):
            raise AssertionError(f"{what}: the table shortcut differs from the step (max {float((a - b).abs().max())})")


def rnn_step_costs(vocab: int, hidden: int, rank: int, calls: int) -> tuple[float, float, float]:
    """(current slot step, slot step with the token table, ``W2 u``) in microseconds."""
    g = torch.Generator().manual_seed(0)
    w1 = torch.randn(vocab, rank, generator=g)
    joint = torch.randn(3 * rank, 2 * rank + hidden, generator=g)
    w2 = torch.randn(vocab, rank, generator=g)
    state_weight = joint[:, :rank].contiguous()
    table = w1 @ joint[:, rank : 2 * rank].T
    projection, state, prev = torch.randn(1, 3 * rank), torch.randn(1, rank), torch.tensor([7])
    bias = torch.randn(1, vocab)

    def finish(z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        gate = torch.sigmoid(z[..., :rank])
        candidate, output = torch.tanh(z[..., rank:]).split(rank, dim=-1)
        return output, torch.lerp(candidate, state, gate)

    def current() -> object:
        inputs = torch.cat([state, F.embedding(prev, w1)], dim=-1)
        return finish(torch.addmm(projection, inputs, joint[:, : 2 * rank].T))

    def with_table() -> object:
        return finish(torch.addmm(projection + F.embedding(prev, table), state, state_weight.T))

    check_equal("RNN step", current(), with_table())
    return (microseconds(current, calls), microseconds(with_table, calls),
            microseconds(lambda: torch.addmm(bias, state, w2.T), calls))


def eagle3_projection_costs(vocab: int, hidden: int, q_dim: int, kv_dim: int, calls: int) -> tuple[float, float]:
    """(current first projections, with the embedding table) of one EAGLE-3 step, in microseconds."""
    g = torch.Generator().manual_seed(0)
    embed = torch.randn(vocab, hidden, generator=g)
    embed_norm, hidden_norm = torch.randn(hidden, generator=g), torch.randn(hidden, generator=g)
    wq, wk, wv = (torch.randn(n, 2 * hidden, generator=g) for n in (q_dim, kv_dim, kv_dim))
    hidden_half = torch.cat([wq[:, hidden:], wk[:, hidden:], wv[:, hidden:]]).contiguous()
    table = F.linear(F.rms_norm(embed, (hidden,), embed_norm), torch.cat([wq[:, :hidden], wk[:, :hidden],
                                                                         wv[:, :hidden]]))
    state, token = torch.randn(1, hidden), torch.tensor([7])

    def current() -> object:
        x = torch.cat([F.rms_norm(F.embedding(token, embed), (hidden,), embed_norm),
                       F.rms_norm(state, (hidden,), hidden_norm)], dim=-1)
        return F.linear(x, wq), F.linear(x, wk), F.linear(x, wv)

    def with_table() -> object:
        z = torch.addmm(F.embedding(token, table), F.rms_norm(state, (hidden,), hidden_norm), hidden_half.T)
        return z.split([q_dim, kv_dim, kv_dim], dim=-1)

    check_equal("EAGLE-3 projections", current(), with_table())
    return microseconds(current, calls), microseconds(with_table, calls)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--preset", default="small", help="tiny-world preset whose shapes are timed")
    p.add_argument("--ranks", type=int, nargs="+", default=[128, 192, 256])
    p.add_argument("--calls", type=int, default=4000)
    args = p.parse_args()
    torch.set_num_threads(1)
    preset = get_preset(args.preset)
    vocab, hidden = preset.vocab_size, preset.hidden_size
    print(f"shapes of the {preset.name!r} tiny world: vocabulary {vocab}, hidden {hidden}; us per drafted token")
    print("DSpark RNN Markov step   rank  current  with table  saved   W2 u")
    for rank in args.ranks:
        current, table, bias = rnn_step_costs(vocab, hidden, rank, args.calls)
        print(f"                         {rank:4d}  {current:7.1f}  {table:10.1f}  {current - table:5.1f}  {bias:5.1f}")
    current, table = eagle3_projection_costs(vocab, hidden, preset.num_heads * preset.head_dim,
                                             preset.num_kv_heads * preset.head_dim, args.calls)
    print(f"EAGLE-3 first projections     current {current:.1f}, with table {table:.1f}, saved {current - table:.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
