"""Speculative sampling is lossless: exact enumeration of every accept/reject branch, an empirical chi-square
check of the sampler itself, greedy verification, and the logits-to-probabilities helper."""

from __future__ import annotations

import itertools
from functools import cache

import numpy as np
import pytest
import torch
from scipy import stats

from deepspec_train.evaluation.spec_sampling import (
    acceptance_probs,
    correction_distribution,
    verify_block,
    verify_block_greedy,
    verify_blocks,
    verify_blocks_greedy,
)
from deepspec_train.models.sampling import probs_from_logits
from tests.helpers.table_language_models import TablePair

# (vocab, block size K, tokens verified per round, seed)
CASES = [(3, 1, 1, 0), (3, 2, 2, 1), (4, 3, 3, 2), (5, 2, 2, 3), (4, 3, 1, 4), (3, 3, 2, 5)]


def _exact_output_law(tables: TablePair, block: int, verify_len: int, n_out: int) -> dict[tuple[int, ...], float]:
    """Law of the first ``n_out`` emitted tokens, by enumerating every drafted block and every accept/reject
    branch of repeated rounds, with branch probabilities from the implementation's ``acceptance_probs`` and
    ``correction_distribution``."""
    all_drafts = list(itertools.product(range(tables.vocab), repeat=block))
    outcomes = verify_len + 1
    # Row (d, n) of the expanded batch: drafted block d, n drafts accepted.
    accepted = torch.arange(outcomes).repeat(len(all_drafts))
    lengths = torch.full_like(accepted, verify_len)

    @cache
    def law_from(prefix: tuple[int, ...]) -> tuple[tuple[tuple[int, ...], float], ...]:
        if len(prefix) >= n_out:
            return ((prefix[:n_out], 1.0),)
        tables_per_draft = [tables.block_tables(prefix, drafts) for drafts in all_drafts]
        draft_probs = torch.cat([d for d, _ in tables_per_draft])
        target_probs = torch.cat([t for _, t in tables_per_draft])
        ratio = acceptance_probs(torch.tensor(all_drafts), draft_probs, target_probs).tolist()
        last = correction_distribution(
            draft_probs.repeat_interleave(outcomes, 0), target_probs.repeat_interleave(outcomes, 0), accepted, lengths
        ).tolist()
        out: dict[tuple[int, ...], float] = {}
        for d, drafts in enumerate(all_drafts):
            q_rows = tables_per_draft[d][0][0]
            p_draft = float(np.prod([float(q_rows[k, drafts[k]]) for k in range(block)]))
            reach = 1.0
            for n in range(outcomes):
                stop = 1.0 - ratio[d][n] if n < verify_len else 1.0
                p_branch = p_draft * reach * stop
                for token, p_token in enumerate(last[d * outcomes + n]):
                    if p_branch * p_token > 0.0:
                        for seq, p_rest in law_from(prefix + drafts[:n] + (token,)):
                            out[seq] = out.get(seq, 0.0) + p_branch * p_token * p_rest
                if n < verify_len:
                    reach *= ratio[d][n]
        return tuple(out.items())

    return dict(law_from(()))


@pytest.mark.parametrize("vocab,block,verify_len,seed", CASES)
def test_exact_enumeration_equals_target_law(vocab, block, verify_len, seed):
    n_out = block + 1
    tables = TablePair(vocab, max_len=n_out - 1 + block, seed=seed)
    law = _exact_output_law(tables, block, verify_len, n_out)
    target = tables.target_sequence_probs(n_out)
    assert abs(sum(law.values()) - 1.0) < 1e-12
    for seq, prob in target.items():
        assert abs(law.get(seq, 0.0) - prob) < 1e-12, seq


def _simulate(tables: TablePair, block: int, verify_len: int, n_out: int, rows: int, seed: int) -> torch.Tensor:
    """Run ``verify_blocks`` for ``rows`` independent sequences, round after round, until each has ``n_out``
    tokens; returns the first ``n_out`` tokens ``[rows, n_out]``."""
    gen = torch.Generator().manual_seed(seed)
    emitted = torch.full((rows, n_out), -1, dtype=torch.long)
    count = torch.zeros(rows, dtype=torch.long)
    code = torch.zeros(rows, dtype=torch.long)
    lengths = torch.full((rows,), verify_len, dtype=torch.long)
    while bool((count < n_out).any()):
        live = (count < n_out).nonzero().squeeze(1)
        cursor = code[live]
        drafts, draft_rows, target_rows = [], [], []
        for _ in range(block):
            q = tables.draft[cursor]
            token = torch.multinomial(q, 1, generator=gen).squeeze(1)
            draft_rows.append(q)
            target_rows.append(tables.target[cursor])
            drafts.append(token)
            cursor = tables.child[cursor, token]
        target_rows.append(tables.target[cursor])
        result = verify_blocks(
            torch.stack(drafts, 1), torch.stack(draft_rows, 1), torch.stack(target_rows, 1), gen, lengths[live]
        )
        for slot in range(block + 1):
            token = result.tokens[:, slot]
            write = (token >= 0) & (count[live] < n_out)
            rows_out = live[write]
            emitted[rows_out, count[rows_out]] = token[write]
            code[rows_out] = tables.child[code[rows_out], token[write]]
            count[rows_out] += 1
    assert bool((emitted >= 0).all())
    return emitted


@pytest.mark.parametrize("vocab,block,verify_len,seed", CASES[1:5])
def test_sampler_matches_target_law_chi_square(vocab, block, verify_len, seed):
    n_out = block + 1
    tables = TablePair(vocab, max_len=n_out - 1 + block, seed=seed)
    samples = _simulate(tables, block, verify_len, n_out, rows=20_000, seed=100 + seed)
    target = tables.target_sequence_probs(n_out)
    seqs = list(target)
    index = {seq: i for i, seq in enumerate(seqs)}
    observed = np.zeros(len(seqs))
    for row in samples.tolist():
        observed[index[tuple(row)]] += 1
    expected = np.array([target[s] for s in seqs]) * samples.shape[0]
    assert observed[expected == 0].sum() == 0, "emitted a sequence the target cannot produce"
    # Pool the sparse cells so every chi-square cell expects at least 5 samples.
    big = expected >= 5
    obs = np.append(observed[big], observed[~big].sum())
    exp = np.append(expected[big], expected[~big].sum())
    if exp[-1] < 5:
        obs, exp = obs[:-1], exp[:-1]
        obs[-1] += observed[~big].sum()
        exp[-1] += expected[~big].sum()
    assert stats.chisquare(obs, exp).pvalue > 0.01


def test_one_token_example_residual():
    # The worked example: q = (.6, .3, .1), p = (.4, .4, .2) leaves the residual (0, .5, .5).
    q = torch.tensor([[[0.6, 0.3, 0.1]]], dtype=torch.float64)
    p = torch.tensor([[[0.4, 0.4, 0.2], [1 / 3, 1 / 3, 1 / 3]]], dtype=torch.float64)
    residual = correction_distribution(q, p, torch.tensor([0]))
    torch.testing.assert_close(residual[0], torch.tensor([0.0, 0.5, 0.5], dtype=torch.float64))
    ratio = acceptance_probs(torch.tensor([[0]]), q, p)
    assert abs(float(ratio) - 0.4 / 0.6) < 1e-15
    bonus = correction_distribution(q, p, torch.tensor([1]))
    torch.testing.assert_close(bonus[0], p[0, 1])


def test_zero_residual_falls_back_to_target():
    p = torch.tensor([[[0.5, 0.25, 0.25], [0.2, 0.3, 0.5]]])
    q = p[:, :1].clone()
    torch.testing.assert_close(correction_distribution(q, p, torch.tensor([0]))[0], p[0, 0].double())
    # With q == p the acceptance ratio is 1 for every token: a rejection is impossible.
    assert bool((acceptance_probs(torch.tensor([[2]]), q, p) == 1.0).all())


def test_zero_length_row_emits_only_a_bonus_token():
    gen = torch.Generator().manual_seed(0)
    q = torch.tensor([[[1.0, 0.0, 0.0]]])
    p = torch.tensor([[[0.0, 1.0, 0.0], [0.0, 0.0, 1.0]]])
    result = verify_blocks(torch.tensor([[0]]), q, p, gen, lengths=torch.tensor([0]))
    assert result.accepted.tolist() == [0]
    assert result.tokens.tolist() == [[1, -1]]


def test_verify_block_single_form():
    gen = torch.Generator().manual_seed(0)
    q = torch.tensor([[0.0, 1.0, 0.0], [0.0, 0.0, 1.0]])
    p = torch.tensor([[0.0, 1.0, 0.0], [0.0, 0.0, 1.0], [1.0, 0.0, 0.0]])
    assert verify_block(torch.tensor([1, 2]), q, p, gen) == (2, [1, 2, 0])
    p_reject = torch.tensor([[0.0, 1.0, 0.0], [1.0, 0.0, 0.0], [1.0, 0.0, 0.0]])
    assert verify_block(torch.tensor([1, 2]), q, p_reject, gen) == (1, [1, 0])


def _greedy_continuation(tables: TablePair, n_out: int) -> list[int]:
    prefix: tuple[int, ...] = ()
    for _ in range(n_out):
        prefix += (int(tables.target[tables.code[prefix]].argmax()),)
    return list(prefix)


@pytest.mark.parametrize("seed", range(4))
def test_greedy_rounds_reproduce_target_greedy(seed):
    block, n_out = 3, 6
    tables = TablePair(3, max_len=n_out + block, seed=seed)
    expected = _greedy_continuation(tables, n_out)
    out: list[int] = []
    rounds = 0
    while len(out) < n_out:
        prefix = tuple(out)
        drafts = []
        for _ in range(block):
            drafts.append(int(tables.draft[tables.code[prefix + tuple(drafts)]].argmax()))
        draft_probs, target_probs = tables.block_tables(prefix, tuple(drafts))
        accepted, tokens = verify_block_greedy(torch.tensor(drafts), target_probs[0])
        assert accepted == len(tokens) - 1
        # One-hot (temperature 0) distributions through the exact sampler give the same round.
        one_hot_q = probs_from_logits(draft_probs.log(), 0.0)
        one_hot_p = probs_from_logits(target_probs.log(), 0.0)
        sampled = verify_blocks(torch.tensor([drafts]), one_hot_q, one_hot_p, torch.Generator().manual_seed(seed))
        assert int(sampled.accepted[0]) == accepted
        assert sampled.tokens[0, : accepted + 1].tolist() == tokens
        out += tokens
        rounds += 1
    assert out[:n_out] == expected
    assert rounds <= n_out


def test_greedy_batched_lengths_and_ties():
    drafts = torch.tensor([[1, 1, 2], [1, 1, 2]])
    scores = torch.zeros(2, 4, 3)
    scores[:, 0, 1] = scores[:, 1, 1] = scores[:, 2, 2] = 1.0
    scores[:, 3] = torch.tensor([0.5, 0.5, 0.1])  # tie between tokens 0 and 1: the lower id wins
    result = verify_blocks_greedy(drafts, scores, lengths=torch.tensor([3, 1]))
    assert result.accepted.tolist() == [3, 1]
    assert result.tokens.tolist() == [[1, 1, 2, 0], [1, 1, -1, -1]]


def _reference_filter(logits: list[float], temperature: float, top_k, top_p) -> list[float]:
    scaled = [x / temperature for x in logits]
    if top_k:
        kth = sorted(scaled, reverse=True)[top_k - 1]
        scaled = [x if x >= kth else float("-inf") for x in scaled]
    peak = max(scaled)
    weights = [np.exp(x - peak) for x in scaled]
    probs = [w / sum(weights) for w in weights]
    if top_p is not None:
        order = sorted(range(len(probs)), key=lambda i: -probs[i])
        kept, mass = set(), 0.0
        for i in order:
            if mass < top_p or not kept:
                kept.add(i)
            mass += probs[i]
        probs = [p if i in kept else 0.0 for i, p in enumerate(probs)]
        probs = [p / sum(probs) for p in probs]
    return probs


@pytest.mark.parametrize("temperature,top_k,top_p", [(1.0, None, None), (0.7, 3, None), (1.3, None, 0.8),
                                                     (0.7, 4, 0.8), (2.0, 2, 0.99)])
def test_probs_from_logits_matches_reference(temperature, top_k, top_p):
    gen = torch.Generator().manual_seed(1)
    logits = torch.randn(5, 7, generator=gen, dtype=torch.float64)
    got = probs_from_logits(logits, temperature, top_k, top_p)
    for row in range(5):
        want = _reference_filter(logits[row].tolist(), temperature, top_k, top_p)
        torch.testing.assert_close(got[row], torch.tensor(want, dtype=torch.float64))


def test_probs_from_logits_greedy_and_dtype():
    logits = torch.tensor([[0.1, 2.0, -1.0], [3.0, 3.0, 0.0]], dtype=torch.bfloat16)
    greedy = probs_from_logits(logits, 0.0, top_k=1, top_p=0.5)
    assert greedy.dtype == torch.float32
    assert greedy.tolist() == [[0.0, 1.0, 0.0], [1.0, 0.0, 0.0]]
