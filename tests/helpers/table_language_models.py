"""Tiny prefix-conditioned "language models" given as explicit tables, for exact tests of speculative sampling.

Every prefix (a tuple of token ids) up to a maximum length gets a next-token distribution. The target's
distributions are random Dirichlet draws with some entries zeroed (so the supports of draft and target differ);
the draft's are noisy mixtures of the target's, exactly equal to it at some prefixes (so the residual
``(p - q)_+`` is zero there) and with zeros where the target has mass at others. Prefixes are numbered so that
batched code can follow many sequences at once with integer indexing: ``child[code, token]`` is the code of
``prefix + (token,)``.
"""

from __future__ import annotations

import itertools

import numpy as np
import torch


class TablePair:
    """Target and draft next-token tables over all prefixes of length ``<= max_len`` of a ``vocab``-token alphabet."""

    def __init__(self, vocab: int, max_len: int, seed: int) -> None:
        rng = np.random.default_rng(seed)
        self.vocab = vocab
        self.prefixes: list[tuple[int, ...]] = [()]
        for length in range(1, max_len + 1):
            self.prefixes.extend(itertools.product(range(vocab), repeat=length))
        self.code = {prefix: i for i, prefix in enumerate(self.prefixes)}
        n = len(self.prefixes)
        target = rng.dirichlet(np.full(vocab, 0.8), size=n)
        # Zero some target entries (never the whole row) so that p(x) = 0 < q(x) happens.
        holes = rng.random((n, vocab)) < 0.2
        holes[np.arange(n), target.argmax(axis=1)] = False
        target = np.where(holes, 0.0, target)
        target /= target.sum(axis=1, keepdims=True)
        noise = rng.dirichlet(np.full(vocab, 0.8), size=n)
        mix = rng.uniform(0.0, 1.0, size=(n, 1))
        draft = mix * target + (1.0 - mix) * noise
        draft_holes = rng.random((n, vocab)) < 0.15
        draft_holes[np.arange(n), draft.argmax(axis=1)] = False
        draft = np.where(draft_holes, 0.0, draft)
        draft /= draft.sum(axis=1, keepdims=True)
        same = rng.random(n) < 0.2
        draft[same] = target[same]
        self.target = torch.tensor(target, dtype=torch.float64)
        self.draft = torch.tensor(draft, dtype=torch.float64)
        child = np.full((n, vocab), -1, dtype=np.int64)
        for prefix, i in self.code.items():
            if len(prefix) < max_len:
                child[i] = [self.code[prefix + (token,)] for token in range(vocab)]
        self.child = torch.from_numpy(child)

    def target_sequence_probs(self, length: int) -> dict[tuple[int, ...], float]:
        """Exact probability that the target itself generates each sequence of ``length`` tokens."""
        probs = {}
        for seq in itertools.product(range(self.vocab), repeat=length):
            prob = 1.0
            for t in range(length):
                prob *= float(self.target[self.code[seq[:t]], seq[t]])
            probs[seq] = prob
        return probs

    def block_tables(self, prefix: tuple[int, ...], drafts: tuple[int, ...]) -> tuple[torch.Tensor, torch.Tensor]:
        """``draft_probs [1, K, V]`` and ``target_probs [1, K+1, V]`` for a drafted block after ``prefix``."""
        rows = [self.code[prefix + drafts[:k]] for k in range(len(drafts) + 1)]
        return self.draft[rows[:-1]][None], self.target[rows][None]
