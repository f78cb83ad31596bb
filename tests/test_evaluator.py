"""The speculative-decoding evaluator on the tiny random target: exactness of greedy decoding, cache and feature
bookkeeping, multi-turn conversations, suites, the results/trace files and their aggregation."""

from __future__ import annotations

import json
import random
import statistics
from typing import Optional

import pytest
import torch

from deepspec_train.commands.dispatch import main as deepspec_main
from deepspec_train.models.block_drafting import DraftBlock, DraftContext
from deepspec_train.evaluation.report import ConversationStats, build_results, conditional_acceptance
from deepspec_train.evaluation.speculative_decoder import SpeculativeDecoder, verify_drafts
from deepspec_train.evaluation.suites import load_suite
from deepspec_train.formats.eval_traces import parse_round
from deepspec_train.formats.trained_drafter import write_trained_drafter
from deepspec_train.target.hidden_states import TargetTap
from tests.helpers.chat_model_drafters import BLOCK, drafter_recipe, load_tiny_target, random_drafter

MAX_NEW = 20
TRACE_FIELDS = {
    "suite", "category", "prompt_id", "turn", "round", "drafted", "accepted", "emitted",
    "confidence_logits", "confidences", "target_accept_probs", "draft_seconds", "draft_cpu_seconds",
    "analytic_accept", "seed", "answer_start", "context_start",
}


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    directory = tmp_path_factory.mktemp("tiny_target")
    model, tokenizer = load_tiny_target(directory)
    return model, tokenizer, directory


def _prompt_ids(tokenizer, text: str) -> list[int]:
    rendered = tokenizer.apply_chat_template(
        [{"role": "user", "content": text}], tokenize=False, add_generation_prompt=True, enable_thinking=False
    )
    return tokenizer(rendered, add_special_tokens=False)["input_ids"]


def _plain_greedy(model, ids: list[int], max_new: int) -> list[int]:
    out = model.generate(torch.tensor([ids]), max_new_tokens=max_new, do_sample=False)
    return out[0, len(ids) :].tolist()


@pytest.mark.parametrize("kind", ["dspark", "dflash", "eagle3"])
def test_greedy_speculative_equals_plain_greedy(target, kind):
    model, tokenizer, _ = target
    loaded = random_drafter(model, tokenizer, kind)
    decoder = SpeculativeDecoder(model, tokenizer, loaded.block_drafter(), loaded.target_layer_ids, BLOCK, 0.0)
    (turn,), _ = decoder.decode_conversation(["What is two plus three?"], MAX_NEW)
    assert turn.tokens == _plain_greedy(model, _prompt_ids(tokenizer, "What is two plus three?"), MAX_NEW)
    assert sum(r.emitted for r in turn.rounds) / len(turn.rounds) >= 1.0
    assert all(r.emitted == r.accepted + 1 and 0 <= r.accepted <= r.drafted == BLOCK for r in turn.rounds)


class ScriptedDrafter:
    """Proposes the reference continuation with one wrong token at a random slot (or none), as one-hot drafts.

    It also checks what the decoder hands it: the context must be exactly the target's own features of the
    reference prefix before the anchor, computed without a cache.
    """

    max_block_size = BLOCK

    def __init__(self, model, reference: list[int], vocab: int, layer_ids: list[int]) -> None:
        self.reference = reference
        self.vocab = vocab
        self.rng = random.Random(0)
        self.features = TargetTap(model, layer_ids)(torch.tensor([reference])).ctx_features[0]
        self.calls = 0

    def draft(self, context: DraftContext, anchor_tokens, num_tokens, temperature, generator=None) -> DraftBlock:
        a = context.anchor_position
        assert context.tokens.tolist() == self.reference[:a] and int(anchor_tokens[0]) == self.reference[a]
        torch.testing.assert_close(context.features, self.features[:a], atol=1e-4, rtol=1e-4)
        proposal = (self.reference[a + 1 : a + 1 + num_tokens] + [0] * num_tokens)[:num_tokens]
        wrong = self.rng.randrange(num_tokens + 2)
        if wrong < num_tokens:
            proposal[wrong] = (proposal[wrong] + 1) % self.vocab
        tokens = torch.tensor([proposal])
        self.calls += 1
        return DraftBlock(tokens, torch.nn.functional.one_hot(tokens, self.vocab).float(), None)


def test_partial_acceptance_keeps_cache_and_features_exact(target):
    model, tokenizer, _ = target
    ids = _prompt_ids(tokenizer, "Write a Python function")
    max_new = 40
    reference = ids + _plain_greedy(model, ids, max_new)
    scripted = ScriptedDrafter(model, reference, model.config.vocab_size, [0])
    decoder = SpeculativeDecoder(model, tokenizer, scripted, [0], BLOCK, 0.0)
    (turn,), session = decoder.decode_conversation(["Write a Python function"], max_new)
    assert turn.tokens == reference[len(ids) :]
    accepted = [r.accepted for r in turn.rounds]
    # Every branch was taken: full blocks (bonus), partial blocks and immediate rejections.
    assert BLOCK in accepted and 0 in accepted and any(0 < n < BLOCK for n in accepted)
    assert session.processed == len(session.tokens) - 1 == session.cache.get_seq_length()


def test_second_turn_continues_on_the_same_cache(target):
    model, tokenizer, _ = target
    loaded = random_drafter(model, tokenizer, "dspark")
    decoder = SpeculativeDecoder(model, tokenizer, loaded.block_drafter(), [0], BLOCK, 0.0)
    turns, session = decoder.decode_conversation(["Hello!", "And then?"], 12)
    assert [r.turn for r in turns[1].rounds] == [1] * len(turns[1].rounds)
    before_answer = session.tokens[: len(session.tokens) - len(turns[1].tokens)]
    assert turns[1].tokens == _plain_greedy(model, before_answer, 12)
    # Between the answers: the template's text closing turn 0 (its end-of-turn token is kept if generated).
    first_prompt = _prompt_ids(tokenizer, "Hello!")
    assert session.tokens[: len(first_prompt) + len(turns[0].tokens)] == first_prompt + turns[0].tokens
    bridge = tokenizer.decode(before_answer[len(first_prompt) + len(turns[0].tokens) :])
    closing = "" if turns[0].stop_reason == "eos" else "<|im_end|>"
    assert bridge == closing + "\n<|im_start|>user\nAnd then?<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"


def test_sampled_decoding_is_reproducible_and_reports_confidences(target):
    model, tokenizer, _ = target
    loaded = random_drafter(model, tokenizer, "dspark")
    loaded.confidence_temperatures = [2.0, 1.0, 0.5, 1.0]
    runs = []
    for _ in range(2):
        decoder = SpeculativeDecoder(
            model, tokenizer, loaded.block_drafter(), [0], BLOCK, 1.0,
            generator=torch.Generator().manual_seed(7), confidence_temperatures=loaded.confidence_temperatures,
        )
        (turn,), _ = decoder.decode_conversation(["Hello!"], 10)
        runs.append(turn)
    assert runs[0].tokens == runs[1].tokens
    record = runs[0].rounds[0]
    expected = torch.sigmoid(torch.tensor(record.confidence_logits) / torch.tensor([2.0, 1.0, 0.5, 1.0]))
    torch.testing.assert_close(torch.tensor(record.confidences), expected)


def _brute_conditional(rounds: list[dict], k: int) -> Optional[float]:
    hits = trials = 0
    for r in rounds:
        # Position k is reached iff drafts 1..k-1 were all accepted and draft k exists.
        if r["drafted"] >= k and all(r["accepted"] >= j for j in range(1, k)):
            trials += 1
            hits += r["accepted"] >= k
    return hits / trials if trials else None


def test_analytic_acceptance_is_the_first_draft_acceptance_rate():
    """``c*_1 = sum min(p_1, q_1)``: written out, and equal to the rate at which exact verification accepts the
    first draft when ``d_1 ~ q_1`` (many sampled rounds of one fixed pair of distributions)."""
    g = torch.Generator().manual_seed(0)
    vocab, k, rows = 6, 3, 40_000
    q = torch.softmax(torch.randn(k, vocab, generator=g) * 1.5, -1)
    logits = torch.randn(k + 1, vocab, generator=g) * 1.5
    p = torch.softmax(logits, -1)
    tokens = torch.stack([torch.multinomial(q[j], rows, replacement=True, generator=g) for j in range(k)], 1)
    draft = DraftBlock(tokens, q.expand(rows, -1, -1), None)
    result, _, c_star = verify_drafts(draft, logits.expand(rows, -1, -1), 1.0, g)
    expected = [sum(min(float(p[j, v]), float(q[j, v])) for v in range(vocab)) for j in range(k)]
    torch.testing.assert_close(c_star[0], torch.tensor(expected, dtype=torch.float64))
    assert float((result.accepted >= 1).double().mean()) == pytest.approx(expected[0], abs=0.01)


def test_report_aggregates_by_suite_and_category():
    rng = random.Random(0)
    rounds = []
    for n in range(300):
        drafted = rng.choice([2, 3, 4])
        accepted = rng.randint(0, drafted)
        rounds.append({
            "suite": rng.choice(["a", "b"]), "category": rng.choice(["x", "y"]), "drafted": drafted,
            "accepted": accepted, "emitted": accepted + 1, "confidences": [rng.random() for _ in range(drafted)],
            "prompt_id": str(n), "turn": 0, "round": 0,
        })
    stats = [
        ConversationStats("a", "x", 30, 2.0), ConversationStats("a", "y", 10, 1.0), ConversationStats("b", "x", 5, 1.0)
    ]
    results = build_results([parse_round(r) for r in rounds], stats, 4, {"target": "t"})
    assert results["target"] == "t" and set(results["suites"]) == {"a", "b"}
    suite_a = results["suites"]["a"]
    a_rounds = [r for r in rounds if r["suite"] == "a"]
    assert suite_a["rounds"] == len(a_rounds)
    assert suite_a["tau"] == pytest.approx(sum(r["accepted"] + 1 for r in a_rounds) / len(a_rounds))
    assert suite_a["tokens_per_s"] == pytest.approx(40 / 3.0)
    for k in range(1, 5):
        assert suite_a["conditional_acceptance"][k - 1] == pytest.approx(_brute_conditional(a_rounds, k))
    xa = [r for r in a_rounds if r["category"] == "x"]
    assert suite_a["categories"]["x"]["conditional_acceptance"][0] == pytest.approx(_brute_conditional(xa, 1))
    reached = [r["confidences"][1] for r in a_rounds if r["accepted"] >= 1]
    assert suite_a["mean_confidence"][1] == pytest.approx(sum(reached) / len(reached))
    assert conditional_acceptance([], 2) == [None, None]
    # The rounds behind each rate, and tau's bootstrap over prompts (each round is a prompt of its own here, so its
    # standard error is the rounds' standard error of the mean).
    for k in range(1, 5):
        behind = [r for r in a_rounds if r["drafted"] >= k and all(r["accepted"] >= j for j in range(1, k))]
        assert suite_a["acceptance_rounds"][k - 1] == len(behind)
    assert suite_a["prompts"] == len(a_rounds)
    interval, emitted = suite_a["tau_interval"], [r["accepted"] + 1.0 for r in a_rounds]
    assert interval["low"] < suite_a["tau"] < interval["high"] and interval["value"] == pytest.approx(suite_a["tau"])
    assert interval["se"] == pytest.approx(statistics.stdev(emitted) / len(emitted) ** 0.5, rel=0.1)


def test_suites_read_mt_bench_files_and_tinyworld_names(tmp_path):
    (tmp_path / "suites").mkdir()
    rows = [
        {"question_id": 81, "category": "writing", "turns": ["a", "b"]},
        {"id": "x", "category": "math", "turns": ["c"]},
    ]
    (tmp_path / "suites" / "math.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n\n")
    suite = load_suite("tinyworld:math", str(tmp_path))
    assert suite.name == "math" and [p.id for p in suite.prompts] == ["81", "x"]
    assert suite.prompts[0].turns == ("a", "b")
    assert len(load_suite(str(tmp_path / "suites" / "math.jsonl"), max_prompts=1).prompts) == 1
    with pytest.raises(ValueError, match="--tinyworld"):
        load_suite("tinyworld:math")
    with pytest.raises(ValueError, match="unknown tiny-world suite"):
        load_suite("tinyworld:poetry", str(tmp_path))
    (tmp_path / "bad.jsonl").write_text(json.dumps({"id": 1, "turns": []}) + "\n")
    with pytest.raises(ValueError, match="turns"):
        load_suite(str(tmp_path / "bad.jsonl"))


def test_eval_cli_writes_results_and_traces(target, tmp_path):
    model, tokenizer, target_dir = target
    loaded = random_drafter(model, tokenizer, "dspark")
    cfg = drafter_recipe("dspark", loaded.mask_token_id)
    cfg.target.path = str(target_dir)
    write_trained_drafter(loaded.module, cfg, tmp_path / "run" / "drafter")
    suite = tmp_path / "mini.jsonl"
    prompts = [
        {"id": "p1", "category": "chat", "turns": ["Hello!", "More?"]},
        {"id": "p2", "category": "code", "turns": ["def add"]},
    ]
    suite.write_text("\n".join(json.dumps(p) for p in prompts) + "\n")
    out, traces_path = tmp_path / "results.json", tmp_path / "traces.jsonl"
    code = deepspec_main([
        "eval", "--target", str(target_dir), "--drafter", str(tmp_path / "run" / "drafter"), "--suite", str(suite),
        "--temperature", "1.0", "--max-new-tokens", "8", "--out", str(out), "--save-traces", str(traces_path),
        "--no-progress",
    ])
    assert code == 0
    results = json.loads(out.read_text())
    traces = [json.loads(line) for line in traces_path.read_text().splitlines()]
    assert results["drafter_kind"] == "dspark" and results["block_size"] == BLOCK and results["temperature"] == 1.0
    assert all(set(t) == TRACE_FIELDS for t in traces)
    assert all(t["draft_seconds"] > 0 and t["draft_cpu_seconds"] >= 0 for t in traces)
    assert {(t["prompt_id"], t["turn"]) for t in traces} == {("p1", 0), ("p1", 1), ("p2", 0)}
    entry = results["suites"]["mini"]
    assert set(entry["categories"]) == {"chat", "code"}
    assert entry["rounds"] == len(traces) and entry["tau"] >= 1.0
    assert entry["tau"] == pytest.approx(sum(t["emitted"] for t in traces) / len(traces))
    assert entry["draft_ms_per_round"] == pytest.approx(1e3 * sum(t["draft_seconds"] for t in traces) / len(traces))
    for k in range(1, BLOCK + 1):
        assert entry["conditional_acceptance"][k - 1] == pytest.approx(_brute_conditional(traces, k))
    assert all(len(t["confidences"]) == t["drafted"] == BLOCK for t in traces)
