"""The target's distribution exactly, for every target family (Llama 3, Gemma 3, GPT-OSS, DeepSeek-V3 and
Kimi-K2 scale copies, random weights, loaded through ``from_pretrained`` in float32):

- the target logits the loss sees (the streamed pre-LM-head state, i.e. the final norm's output tapped by
  ``TargetTap``, through the frozen LM head a drafter worker loads from the target's files) equal the HF model's
  own logits; checked directly and through ``selected_logit_loss`` itself (a draft distribution set to the HF
  logits gives a TV term of 0 and the HF cross-entropy);
- the drafter's token embeddings equal what the target's embedding module feeds its first layer (Gemma scales
  the looked-up rows by sqrt(hidden_size) inside the model), on the streamed and the colocated build paths;
- the exact evaluator's greedy output (DSpark drafter, temperature 0, KV cache with sliding-window, sink and MLA
  layers) equals ``model.generate(do_sample=False)`` over a chat-template prompt;
- a Gemma-style config that soft-caps its final logits is refused in one line (the frozen head would miss it).

And a target family not known by name (Mistral, Phi-3, OLMo-2) trains DSpark with explicit ``target.layer_ids``,
or fails in one line naming what is missing.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import AutoTokenizer

from deepspec_train.config.rules import head_problems
from deepspec_train.evaluation.speculative_decoder import SpeculativeDecoder, stop_token_ids
from deepspec_train.formats.drafter_loader import LoadedDrafter
from deepspec_train.kinds.builder import build_drafter, build_drafter_from_files
from deepspec_train.losses.selected_logit_loss import LossSettings, SupervisedRows, selected_logit_loss
from deepspec_train.models.family_configs import gemma3_reference_configs
from deepspec_train.target.hidden_states import TargetTap
from deepspec_train.target.loading import load_target_model
from deepspec_train.kinds.recipe_validation import load_recipe
from tests.helpers.family_world import FAMILY_TIER, build_family_world
from tests.helpers.scale_world import scale_overrides

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_torch_thread")]

# One DSpark recipe per family (Kimi-K2 apart from DeepSeek-V3: same architecture, other vocabulary and ids).
FAMILY_RECIPES = ("llama-3.1-8b", "gemma-3-12b", "gpt-oss-20b", "deepseek-v3", "kimi-k2")
MAX_NEW = 12
PROMPT = "Explain why speculative decoding gives the same output."


@pytest.fixture(scope="module")
def family_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("families")


def _float32_recipe(recipe: str, world: dict, root: Path):
    """The family's recipe on its scale world, with the target in float32 and a one-layer, rank-8 drafter: what
    is checked here is the target side and the frozen heads, which the drafter's size does not touch."""
    return load_recipe(recipe, scale_overrides(world, root / "run", **{
        "target.dtype": "float32", "topology.target_workers": 0, "topology.target_tp": 1,
        "drafter.num_layers": 1, "drafter.markov_rank": 8}))


@pytest.mark.parametrize("recipe", FAMILY_RECIPES)
def test_loss_logits_embeddings_and_greedy_decoding_are_the_targets(recipe: str, family_root: Path) -> None:
    root = family_root / recipe
    world = build_family_world(root, FAMILY_TIER[recipe])
    cfg = _float32_recipe(recipe, world, root)
    cpu = torch.device("cpu")
    model = load_target_model(cfg.target, cpu)
    tokenizer = AutoTokenizer.from_pretrained(world["target"])
    text = tokenizer.apply_chat_template([{"role": "user", "content": PROMPT}], tokenize=False,
                                         add_generation_prompt=True)
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    input_ids = torch.tensor([ids])

    # Logits: the streamed pre-LM-head state through the drafter worker's frozen head vs the HF model's own.
    drafter, lm_head = build_drafter_from_files(cfg, None, cpu)
    states = TargetTap(model, cfg.target.layer_ids)(input_ids)
    hf_logits = model(input_ids=input_ids).logits[0].float()
    hidden = states.final_hidden[0]
    torch.testing.assert_close(hidden @ lm_head.T, hf_logits, rtol=1e-5, atol=1e-5)
    # Through the loss itself: a draft distribution equal to the HF logits (identity hidden, logits as the head).
    n = hidden.shape[0]
    labels = torch.tensor(ids[1:] + [ids[0]])
    rows = SupervisedRows(torch.eye(n), hf_logits.T.contiguous(), hidden, lm_head, labels, torch.ones(n))
    out = selected_logit_loss(rows, LossSettings(alpha_ce=1.0, alpha_tv=1.0, alpha_conf=0.0), float(n))
    reference_ce = torch.nn.functional.cross_entropy(hf_logits, labels)
    # float32 softmax rounding over the vocabulary only (another distribution gives a TV of order 0.1 - 1).
    assert float(out.tv_sum) / n < 1e-6
    assert float(out.ce_sum) / n == pytest.approx(float(reference_ce), rel=1e-5)

    # Embeddings: what the target's embedding module feeds layer 0, on both build paths.
    fed = model.get_input_embeddings()(input_ids)[0]
    assert torch.equal(drafter.embed_tokens.weight[input_ids[0]], fed)
    colocated = build_drafter(cfg, model, [])
    assert torch.equal(colocated.embed_tokens.weight[input_ids[0]], fed)

    # Greedy: the exact evaluator with this (untrained) DSpark drafter vs the target's own greedy decoding.
    loaded = LoadedDrafter(drafter.eval(), cfg.drafter.kind, cfg.drafter.block_size, list(cfg.target.layer_ids),
                           cfg.drafter.mask_token_id, None, cfg.drafter.labels, "training")
    decoder = SpeculativeDecoder(model, tokenizer, loaded.block_drafter(), loaded.target_layer_ids,
                                 cfg.drafter.block_size, 0.0)
    (turn,), _ = decoder.decode_conversation([PROMPT], MAX_NEW)
    stops = sorted(stop_token_ids(model, tokenizer))
    plain = model.generate(input_ids, max_new_tokens=MAX_NEW, do_sample=False, eos_token_id=stops,
                           pad_token_id=stops[0])[0, len(ids):].tolist()
    assert turn.tokens == plain
    assert len(turn.rounds) >= 2


def test_final_logit_soft_capping_is_refused_in_one_line() -> None:
    config = gemma3_reference_configs()["gemma-3-12b-it"].to_dict()
    assert head_problems(config) == []
    problems = head_problems({**config, "final_logit_softcapping": 30.0})
    assert len(problems) == 1 and "final_logit_softcapping = 30.0" in problems[0]
