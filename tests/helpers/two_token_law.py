"""Test helper: the joint law of the first two tokens of speculative decoding against the target's exact law
(``tests/test_losslessness.py``, ``tests/test_dflash2_losslessness.py``).

``first_two_tokens`` runs ``NUM_SAMPLES`` independent speculative decodings of one prompt at once (round 1 batched
over every row, a second round for the rows whose first round emitted one token), ``exact_joint`` computes
``p(y_1) p(y_2 | y_1)`` from the target's own probabilities, and ``chi_square_p`` compares the two, pooling cells
whose expected count is below ``MIN_EXPECTED``.
"""

from __future__ import annotations

import torch
from scipy.stats import chisquare

from deepspec_train.evaluation.speculative_decoder import verify_drafts
from deepspec_train.models.block_drafting import BlockDrafter, DraftBlock, DraftContext
from deepspec_train.target.hidden_states import TargetTap

NUM_SAMPLES = 20_000
# Drafted tokens per round. Only the first two generated tokens are tested, and later drafts cannot change them,
# so two drafts per round cover every path (the drafters are built with block size 4: drafting fewer is allowed).
DRAFTS = 2
CHUNK = 2_500
MIN_EXPECTED = 5.0
# A short raw prompt (no chat template): the test is about one fixed prefix, and short rows keep it fast.
PROMPT = "Two plus three is"


def prompt_ids(tokenizer) -> torch.Tensor:
    return torch.tensor(tokenizer(PROMPT, add_special_tokens=False)["input_ids"])


@torch.no_grad()
def last_logits(model, sequences: torch.Tensor, keep: int) -> torch.Tensor:
    """Target logits at the last ``keep`` positions of every row, computed in chunks of rows."""
    return torch.cat([model(input_ids=c, logits_to_keep=keep).logits.float() for c in sequences.split(CHUNK)])


def speculative_round(
    model, drafter: BlockDrafter, prefix: torch.Tensor, context: DraftContext, anchors: torch.Tensor,
    temperature: float, generator: torch.Generator,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One round for every row: the row's sequence is ``prefix`` then its anchor. Returns (accepted, tokens)."""
    accepted, tokens = [], []
    for rows in anchors.split(CHUNK):
        draft = drafter.draft(context, rows, DRAFTS, temperature, generator)
        sequences = torch.cat([prefix.expand(len(rows), -1), rows[:, None], draft.tokens], dim=1)
        logits = last_logits(model, sequences, DRAFTS + 1)
        result, _, _ = verify_drafts(DraftBlock(draft.tokens, draft.probs, None), logits, temperature, generator)
        accepted.append(result.accepted)
        tokens.append(result.tokens)
    return torch.cat(accepted), torch.cat(tokens)


def first_two_tokens(
    model, drafter: BlockDrafter, layer_ids: list[int], ids: torch.Tensor, temperature: float, seed: int = 1234
):
    """``(y_1, y_2)`` of ``NUM_SAMPLES`` speculative decodings, and how many drafts each first round accepted."""
    generator = torch.Generator().manual_seed(seed)
    features = TargetTap(model, layer_ids)(ids[None]).ctx_features[0].float()
    num = len(ids)
    anchors = ids[-1].repeat(NUM_SAMPLES)
    first_context = DraftContext(features[: num - 1], ids[: num - 1])
    accepted, tokens = speculative_round(model, drafter, ids[:-1], first_context, anchors, temperature, generator)
    y1, y2 = tokens[:, 0], tokens[:, 1].clone()
    short = accepted == 0
    # A single-token first round: the second token comes from a round anchored at y_1 (position P).
    _, second = speculative_round(
        model, drafter, ids, DraftContext(features, ids), y1[short], temperature, generator
    )
    y2[short] = second[:, 0]
    return y1, y2, accepted


def exact_joint(model, ids: torch.Tensor, temperature: float) -> torch.Tensor:
    """``p(y_1) p(y_2 | y_1)`` over every pair, from the target's own logits (fp64)."""
    vocab = model.config.vocab_size
    p1 = torch.softmax(last_logits(model, ids[None], 1)[0, -1].double() / temperature, -1)
    extended = torch.cat([ids.expand(vocab, -1), torch.arange(vocab)[:, None]], dim=1)
    p2 = torch.softmax(last_logits(model, extended, 1)[:, -1].double() / temperature, -1)
    return p1[:, None] * p2


def chi_square_p(y1: torch.Tensor, y2: torch.Tensor, joint: torch.Tensor) -> float:
    vocab = joint.shape[0]
    observed = torch.bincount(y1 * vocab + y2, minlength=vocab * vocab).double()
    expected = joint.flatten() * len(y1)
    big = expected >= MIN_EXPECTED
    obs = torch.cat([observed[big], observed[~big].sum()[None]])
    exp = torch.cat([expected[big], expected[~big].sum()[None]])
    assert int(big.sum()) > 50, "too few well-populated cells for a meaningful test"
    return float(chisquare(obs.numpy(), exp.numpy() * obs.sum().item() / exp.sum().item()).pvalue)
