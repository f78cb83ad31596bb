"""The T > 0 distribution test of speculative sampling, sized for a real target on a CPU: the law of the first
generated token.

``tests/test_losslessness.py`` checks the joint law of the first two tokens on the tiny target, whose vocabulary
(a few thousand rows) allows the exact joint. A real vocabulary (SmolLM2: 49,152) does not, so on a real target
this checks the first token: ``samples`` independent first rounds (the drafter drafts ``DRAFTS`` tokens after the
prompt's last token, the target verifies them with the exact evaluator's ``verify_drafts``) give counts of the
first emitted token, compared by a chi-square test with the target's own ``softmax(logits / T)`` at that position
(cells with expected count below 5 pooled). The prompt's key/value cache is computed once and repeated over the
rows, so a round costs the target only ``DRAFTS + 1`` positions per row.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch
from scipy.stats import chisquare
from transformers import DynamicCache

from deepspec_train.evaluation.speculative_decoder import verify_drafts
from deepspec_train.models.block_drafting import BlockDrafter, DraftBlock, DraftContext
from deepspec_train.target.hidden_states import TargetTap

MIN_EXPECTED = 5.0
# Drafts per round: the first token depends only on the first, and two also exercise a second acceptance.
DRAFTS = 2
# Rows verified per target call.
CHUNK = 250


@dataclass(frozen=True)
class FirstTokenLaw:
    """The chi-square p-value of the first token's counts, the share of first rounds that accepted a draft, and
    the number of well-populated cells the test compared."""

    p_value: float
    acceptance: float
    cells: int


@torch.no_grad()
def first_token_law(target, drafter: BlockDrafter, layer_ids: list[int], prompt_ids: torch.Tensor, samples: int,
                    temperature: float = 1.0, seed: int = 1234) -> FirstTokenLaw:
    """Run the test (see the module docstring) for a prompt of token ids ``prompt_ids [P]``."""
    generator = torch.Generator().manual_seed(seed)
    ids = prompt_ids.long()
    features = TargetTap(target, layer_ids)(ids[None]).ctx_features[0].float()
    context = DraftContext(features[:-1], ids[:-1])
    prefix = DynamicCache(config=target.config)
    target(input_ids=ids[None, :-1], cache=prefix, use_cache=True)
    exact = torch.softmax(target(input_ids=ids[None], logits_to_keep=1).logits[0, -1].double() / temperature, -1)
    counts = torch.zeros_like(exact)
    accepted = 0
    for start in range(0, samples, CHUNK):
        rows = min(CHUNK, samples - start)
        anchors = ids[-1].repeat(rows)
        draft = drafter.draft(context, anchors, DRAFTS, temperature, generator)
        cache = copy.deepcopy(prefix)
        cache.batch_repeat_interleave(rows)
        block = torch.cat([anchors[:, None], draft.tokens], dim=1)
        logits = target(input_ids=block, cache=cache, use_cache=True, logits_to_keep=DRAFTS + 1).logits.float()
        result, _, _ = verify_drafts(DraftBlock(draft.tokens, draft.probs, None), logits, temperature, generator)
        counts += torch.bincount(result.tokens[:, 0], minlength=counts.numel()).double()
        accepted += int((result.accepted > 0).sum())
    expected = exact * samples
    big = expected >= MIN_EXPECTED
    observed = torch.cat([counts[big], counts[~big].sum()[None]])
    wanted = torch.cat([expected[big], expected[~big].sum()[None]])
    p_value = float(chisquare(observed.numpy(), wanted.numpy() * observed.sum().item() / wanted.sum().item()).pvalue)
    return FirstTokenLaw(p_value, accepted / samples, int(big.sum()))
