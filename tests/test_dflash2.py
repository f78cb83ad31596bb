"""DFlash2 against brute force: the grouped dynamic convolution and the decoder layer, the identity start (a fresh
DFlash2 computes what its DFlash backbone computes), the selector's lattice, walk and proposal q, the selector loss
and its place in the run's loss, the recipe rules, and the warm start from a trained DFlash."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from deepspec_train.config.schema import RecipeConfig, TargetConfig
from deepspec_train.jobs.drafter_init import InitFromError, initialise_from
from deepspec_train.kinds.registry import kind_spec
from deepspec_train.models.dflash2_selector_loss import SelectorRows, selector_loss
from deepspec_train.models.block_drafting import DraftContext
from deepspec_train.models.dflash2_drafter import DFlash2Drafter
from deepspec_train.models.dflash2_drafting import selector_lattice, walk_lattice
from deepspec_train.models.parallel_drafter import ParallelDrafter, _Rotary
from deepspec_train.packing.anchors import sample_anchors
from deepspec_train.packing.packer import pack_sequences
from deepspec_train.training.batch_loss import DrafterLoss
from tests.helpers.dflash2_drafters import LAYER_IDS, brute_force_conv, dflash2_config, tiny_dflash2
from tests.helpers.tiny_drafter import anchor_batch, drafter_config, random_item
from tests.helpers.tiny_geometry import BLOCK, HIDDEN, MASK_ID, TINY_GEOMETRY, VOCAB

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _packed_batch(seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    items = [random_item(40, i, generator) for i in range(2)]
    anchors = [sample_anchors(item.loss_mask, 6, generator) for item in items]
    (batch,) = pack_sequences(items, anchors, BLOCK, 10_000, MASK_ID, "zlab")
    return batch


def test_the_convolution_is_its_formula():
    conv = tiny_dflash2(1).layers[0].attention_conv
    generator = torch.Generator().manual_seed(2)
    x, y = torch.randn(3 * BLOCK, HIDDEN, generator=generator), torch.randn(3 * BLOCK, HIDDEN, generator=generator)
    prepared, delta = conv.prepare(x)
    torch.testing.assert_close(prepared, brute_force_conv(conv, x, x, 0), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(conv.finish(y, delta), brute_force_conv(conv, y, x, 1), rtol=1e-5, atol=1e-5)


def test_the_decoder_layer_is_norm_conv_sublayer_conv_residual():
    """The layer against its composition written out with the brute-force convolutions (one block per row)."""
    layer = tiny_dflash2(3).layers[1]
    generator = torch.Generator().manual_seed(4)
    x = torch.randn(2, BLOCK, HIDDEN, generator=generator)
    cos, sin = tiny_dflash2(3).rotary.cos_sin(torch.arange(5, 5 + BLOCK).reshape(1, -1))
    ctx_kv = tuple(torch.randn(1, 2, 5, 16, generator=generator) for _ in range(2))
    rotary = _Rotary(cos, sin, cos, sin)
    got = layer(x, None, rotary, None, "sdpa", False, ctx_kv)

    flat = x.reshape(-1, HIDDEN)
    h = layer.input_layernorm(flat)
    attn_in = brute_force_conv(layer.attention_conv, h, h, 0).view_as(x)
    attn_out = layer.self_attn(attn_in, None, rotary, None, "sdpa", False, ctx_kv).reshape(-1, HIDDEN)
    mid = flat + brute_force_conv(layer.attention_conv, attn_out, h, 1)
    h = layer.post_attention_layernorm(mid)
    mlp_out = layer.mlp(brute_force_conv(layer.mlp_conv, h, h, 0))
    want = mid + brute_force_conv(layer.mlp_conv, mlp_out, h, 1)
    torch.testing.assert_close(got.reshape(-1, HIDDEN), want, rtol=1e-5, atol=1e-5)


def test_a_fresh_dflash2_computes_its_dflash_backbone():
    """The convolutions start as the identity: with the DFlash weights copied in, the block states are equal."""
    torch.manual_seed(0)
    dflash = ParallelDrafter(TINY_GEOMETRY, drafter_config("dflash", labels="zlab"), LAYER_IDS).eval()
    dflash2 = DFlash2Drafter(TINY_GEOMETRY, dflash2_config(), LAYER_IDS).eval()
    missing, unexpected = dflash2.load_state_dict(dflash.state_dict(), strict=False)
    assert not unexpected and all("conv" in n or "candidate_selector" in n for n in missing)
    batch = _packed_batch()
    with torch.no_grad():
        torch.testing.assert_close(dflash2.backbone(batch), dflash.backbone(batch), rtol=0, atol=0)
        assert not dflash2.candidate_selector.successor_codebook.any()


def test_training_and_decode_paths_give_the_same_block_states():
    """The packed training forward (convolutions over the flattened blocks) equals the decode-time pass."""
    module = tiny_dflash2(5)
    generator = torch.Generator().manual_seed(6)
    context = DraftContext(torch.randn(9, 2 * HIDDEN, generator=generator), torch.randint(0, MASK_ID, (9,)))
    anchors = torch.tensor([3, 17, 40])
    batch = anchor_batch(context, anchors, BLOCK, MASK_ID)
    kv = module.context_kv(context.features, torch.arange(9))
    with torch.no_grad():
        trained = module.backbone(batch)
        decoded = module.decode_states(batch.block_input, 9, kv)
    torch.testing.assert_close(trained, decoded, rtol=1e-5, atol=1e-5)


def _brute_lattice(module, hidden, anchors):
    """score[r, e, p, c] by loops, with the candidates as the sorted top-K of the head's logits."""
    logits = module.lm_head(hidden).double()
    selector = module.candidate_selector
    ids = logits.topk(module.selector_top_k, dim=-1).indices
    rows, slots, top_k = ids.shape
    scores = torch.zeros(rows, slots, top_k, top_k, dtype=torch.float64)
    for r in range(rows):
        for e in range(slots):
            gate = selector.hidden_projection.weight.double() @ hidden[r, e].double()
            for p in range(top_k):
                pred = int(anchors[r]) if e == 0 else int(ids[r, e - 1, p])
                for c in range(top_k):
                    cand = int(ids[r, e, c])
                    pair = (selector.predecessor_codebook[pred].double() * gate
                            * selector.successor_codebook[cand].double()).sum()
                    scores[r, e, p, c] = logits[r, e, cand] + pair
    return ids, scores


def test_the_lattice_is_unary_plus_the_low_rank_pairwise_term():
    module = tiny_dflash2(7)
    generator = torch.Generator().manual_seed(8)
    hidden, anchors = torch.randn(2, 3, HIDDEN, generator=generator), torch.tensor([5, 60])
    with torch.no_grad():
        ids, scores = selector_lattice(module, hidden, anchors)
        want_ids, want = _brute_lattice(module, hidden, anchors)
    assert torch.equal(ids, want_ids)
    torch.testing.assert_close(scores.double(), want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_the_walk_follows_the_chosen_rows_by_inverse_cdf(temperature):
    """Tokens and q against a walk written out with the same uniforms: slot 0 reads row 0, slot e the row of the
    index chosen at e - 1; q = softmax(row / T) on the K candidates (the point mass at T = 0), zero elsewhere."""
    generator = torch.Generator().manual_seed(9)
    rows, slots, top_k = 64, 3, 5
    ids = torch.stack([torch.randperm(VOCAB, generator=generator)[:top_k] for _ in range(rows * slots)])
    ids = ids.view(rows, slots, top_k)
    scores = torch.randn(rows, slots, top_k, top_k, generator=generator) * 2
    tokens, probs = walk_lattice(ids, scores, VOCAB, temperature, torch.Generator().manual_seed(10))
    uniforms = torch.Generator().manual_seed(10)
    index = [0] * rows
    for e in range(slots):
        u = torch.rand(rows, 1, generator=uniforms, dtype=torch.float64) if temperature > 0 else None
        for r in range(rows):
            row = scores[r, e, index[r]].double()
            if temperature > 0:
                q = torch.softmax(row / temperature, dim=0)
                cdf = torch.cumsum(q, 0)
                index[r] = min(int((cdf <= u[r, 0] * cdf[-1]).sum()), top_k - 1)
            else:
                q = torch.zeros(top_k, dtype=torch.float64)
                index[r] = int(row.argmax())
                q[index[r]] = 1.0
            assert int(tokens[r, e]) == int(ids[r, e, index[r]])
            full = torch.zeros(VOCAB, dtype=torch.float64)
            full[ids[r, e]] = q
            torch.testing.assert_close(probs[r, e].double(), full, rtol=1e-6, atol=1e-7)


def test_the_walk_draws_each_path_with_the_product_of_its_q():
    """The law of the drafted pair: the empirical frequency of every two-slot path against prod q (chi-square)."""
    from scipy.stats import chisquare

    generator = torch.Generator().manual_seed(11)
    top_k, samples = 3, 30_000
    ids = torch.randperm(VOCAB, generator=generator)[: 2 * top_k].view(1, 2, top_k)
    scores = torch.randn(1, 2, top_k, top_k, generator=generator)
    tokens, _ = walk_lattice(ids.expand(samples, -1, -1), scores.expand(samples, -1, -1, -1), VOCAB, 1.0,
                             torch.Generator().manual_seed(12))
    first = torch.softmax(scores[0, 0, 0].double(), 0)
    expected = torch.stack([first[i] * torch.softmax(scores[0, 1, i].double(), 0) for i in range(top_k)]).flatten()
    position = {int(t): i for i, t in enumerate(ids[0, 0])}, {int(t): i for i, t in enumerate(ids[0, 1])}
    cells = torch.tensor([position[0][int(a)] * top_k + position[1][int(b)] for a, b in tokens.tolist()])
    observed = torch.bincount(cells, minlength=top_k * top_k).double()
    assert chisquare(observed.numpy(), (expected * samples).numpy()).pvalue > 0.01


def _brute_selector_loss(module, rows: SelectorRows, top_k, weight, temperature, normalizer):
    total = torch.zeros((), dtype=torch.float64)
    logits = rows.hidden.double() @ rows.head_weight.double().T
    gates = rows.hidden.double() @ module.candidate_selector.hidden_projection.weight.double().T
    for i in range(rows.hidden.shape[0]):
        ids = logits[i].topk(top_k).indices.tolist()
        label = int(rows.labels[i])
        if label not in ids:
            continue
        pred = module.candidate_selector.predecessor_codebook[int(rows.predecessors[i])].double()
        scores = torch.stack([
            logits[i, c] + (pred * gates[i] * module.candidate_selector.successor_codebook[c].double()).sum()
            for c in ids
        ]) / temperature
        ce = -torch.log_softmax(scores, 0)[ids.index(label)]
        denominator = float(normalizer[i]) if isinstance(normalizer, torch.Tensor) else normalizer
        total = total + rows.weights[i].double() * ce / denominator
    return weight * total


@pytest.mark.parametrize("per_row", [False, True])
def test_the_selector_loss_and_its_gradients_equal_brute_force(per_row):
    module = tiny_dflash2(13).train()
    generator = torch.Generator().manual_seed(14)
    n = 12
    hidden = torch.randn(n, HIDDEN, generator=generator, requires_grad=True)
    head = module.lm_head.weight
    # Half the labels among each row's candidates (a covered row), the rest anywhere.
    top = (hidden.detach() @ head.T).topk(module.selector_top_k).indices
    labels = torch.where(torch.arange(n) % 2 == 0, top[:, 2], torch.randint(0, VOCAB, (n,), generator=generator))
    rows = SelectorRows(hidden, head, torch.randint(0, VOCAB, (n,), generator=generator), labels,
                        torch.rand(n, generator=generator) + 0.5)
    normalizer = torch.rand(n, generator=generator) + 1.0 if per_row else 7.0
    got = selector_loss(rows, module.candidate_selector, module.selector_top_k, 0.7, 0.9, normalizer, chunk_size=5)
    params = [hidden, *module.candidate_selector.parameters()]
    got_grads = torch.autograd.grad(got.loss, params)
    want = _brute_selector_loss(module, rows, module.selector_top_k, 0.7, 0.9, normalizer)
    want_grads = torch.autograd.grad(want, params)
    assert int(got.covered) >= n // 2
    torch.testing.assert_close(got.loss.double(), want, rtol=1e-5, atol=1e-6)
    for g, w in zip(got_grads, want_grads):
        torch.testing.assert_close(g.double(), w.double(), rtol=1e-4, atol=1e-6)


def test_the_run_loss_adds_the_selector_term_with_the_true_predecessor():
    """``DrafterLoss`` of a DFlash2 = the selected-logit loss of a DFlash with the same states + the selector
    term whose predecessor of slot j is x_{a+j-1} (the anchor for slot 1)."""
    # A wide top-K, so that some rows of a random drafter have their true token among the candidates.
    module = tiny_dflash2(15, selector_top_k=16).train()
    cfg = RecipeConfig(drafter=dflash2_config(selector_top_k=16), target=TargetConfig(layer_ids=LAYER_IDS))
    head = torch.randn(VOCAB, HIDDEN, generator=torch.Generator().manual_seed(16))
    batch = _packed_batch(1)
    total = DrafterLoss.for_recipe(cfg, head, "sdpa")(module, batch, 10.0).loss.loss
    base_cfg = dataclasses.replace(cfg, drafter=dataclasses.replace(cfg.drafter, selector_loss_weight=0.0))
    base = DrafterLoss.for_recipe(base_cfg, head, "sdpa")(module, batch, 10.0).loss.loss
    out = module(batch)
    supervised = batch.supervised_mask
    slots = torch.arange(BLOCK).expand_as(supervised)[supervised]
    rows = SelectorRows(out.hidden, module.lm_head.weight, _previous(batch)[supervised], batch.labels[supervised],
                        torch.exp(-slots.float() / cfg.loss.gamma_decay))
    want = _brute_selector_loss(module, rows, module.selector_top_k, 0.7, 1.0, 10.0)
    assert float(want) > 0
    torch.testing.assert_close((total - base).double(), want, rtol=1e-5, atol=1e-6)


def _previous(batch) -> torch.Tensor:
    """x_{a+j-1} for every slot j >= 1: the anchor for slot 1, else the label of slot j - 1 (z-lab labels: slot
    j - 1 predicts x_{a+j-1}, and supervised slots are a prefix, so it is supervised whenever slot j is)."""
    previous = torch.full_like(batch.labels, MASK_ID)
    previous[:, 1] = batch.block_input[:, 0]
    previous[:, 2:] = batch.labels[:, 1:-1]
    return previous


def test_recipe_rules_of_the_kind():
    rules = kind_spec("dflash2").recipe_problems
    good = RecipeConfig(drafter=dflash2_config(), target=TargetConfig(layer_ids=LAYER_IDS))
    assert rules(good) == []
    bad = dataclasses.replace(good, drafter=dataclasses.replace(good.drafter, labels="dspark", selector_rank=0,
                                                                 markov_rank=8))
    problems = rules(bad)
    assert any("drafter.labels must be zlab" in p for p in problems)
    assert any("selector_rank >= 1" in p for p in problems) and any("markov_rank=0" in p for p in problems)
    dflash = RecipeConfig(drafter=drafter_config("dflash", conv_kernel_size=2))
    assert any("conv_kernel_size = 2 is not used" in p for p in kind_spec("dflash").recipe_problems(dflash))


def test_warm_start_from_a_trained_dflash(tmp_path):
    """``drafter.init_from`` a DFlash run (z-lab labels): the backbone copied, convolutions at the identity, so the
    DFlash2 drafts on the DFlash's states; a DSpark-label DFlash or another kind is refused in one line."""
    from tests.helpers.trained_drafters import save_tiny_target, tiny_recipe, trained_drafter, write_training_output

    target = save_tiny_target(tmp_path / "target")
    dflash_cfg = tiny_recipe("dflash", target, "zlab")
    dflash = trained_drafter(dflash_cfg)
    run = write_training_output(dflash, dflash_cfg, tmp_path / "run")
    cfg = RecipeConfig(drafter=dflash2_config(intermediate_size=48, init_from=str(run)),
                       target=TargetConfig(path=target, layer_ids=dflash_cfg.target.layer_ids))
    geometry = dflash.geometry
    torch.manual_seed(1)
    dflash2 = kind_spec("dflash2").build(cfg.drafter, geometry, LAYER_IDS, None)
    assert initialise_from(dflash2, cfg)
    with torch.no_grad():
        dflash2.embed_tokens.weight.copy_(dflash.embed_tokens.weight)
        batch = _packed_batch(2)
        torch.testing.assert_close(dflash2.eval().backbone(batch), dflash.backbone(batch), rtol=0, atol=0)
    dspark_labels = tiny_recipe("dflash", target, "dspark")
    write_training_output(trained_drafter(dspark_labels), dspark_labels, tmp_path / "dspark-labels")
    refused = dataclasses.replace(cfg, drafter=dataclasses.replace(cfg.drafter,
                                                                   init_from=str(tmp_path / "dspark-labels")))
    with pytest.raises(InitFromError, match="dspark labels"):
        initialise_from(kind_spec("dflash2").build(cfg.drafter, geometry, LAYER_IDS, None), refused)
