"""Acceptance by position bucket: the buckets, the per-bucket tau / rounds / paired bootstrap against a brute-force
recount of raw per-round traces, the positions the decoder records, and a conversation stopping at the
target's context limit."""

from __future__ import annotations

import numpy as np
import pytest

from deepspec_train.evaluation.position_buckets import (
    POSITION_AXES, POSITION_BUCKETS, bucket_index, position_stats,
)
from deepspec_train.evaluation.report import build_results
from deepspec_train.evaluation.speculative_decoder import SpeculativeDecoder
from deepspec_train.evaluation.table1 import TableSettings, build_table1
from deepspec_train.formats.eval_traces import TraceRound
from tests.helpers.chat_model_drafters import BLOCK, load_tiny_target, random_drafter

pytestmark = pytest.mark.usefixtures("one_torch_thread")
REPLICATES = 300


def test_buckets_cover_every_position_once_at_the_documented_edges():
    assert [b.name for b in POSITION_BUCKETS] == ["0-1K", "1K-4K", "4K-16K", "16K+"]
    edges = {0: 0, 1023: 0, 1024: 1, 4095: 1, 4096: 2, 16383: 2, 16384: 3, 10**7: 3}
    assert {p: bucket_index(p) for p in edges} == edges
    for p in range(0, 20000, 37):
        assert sum(b.holds(p) for b in POSITION_BUCKETS) == 1


def _random_rows(rng: np.random.Generator) -> dict[str, list[TraceRound]]:
    """Two drafters on the same 7 prompts and two seeds, answers of different lengths per drafter (as at T = 1),
    round starts spread over every bucket."""
    rows: dict[str, list[TraceRound]] = {"a": [], "b": []}
    for name in rows:
        for p in range(7):
            for seed in (0, 1):
                position = int(rng.integers(0, 3000))
                for index in range(int(rng.integers(1, 12))):
                    emitted = int(rng.integers(1, 5))
                    rows[name].append(TraceRound(
                        suite="s", category="s", prompt_id=f"p{p}", turn=0, round=index, drafted=4,
                        accepted=emitted - 1, emitted=emitted, confidence_logits=None, confidences=None,
                        target_accept_probs=(1.0,) * 4, draft_seconds=0.002, draft_cpu_seconds=0.001, seed=seed,
                        answer_start=position,
                        context_start=position + 50))
                    position += int(rng.choice([emitted, 900, 4000]))
    return rows


def _brute_tau(rounds: list[TraceRound], field: str, lo: int, hi: float) -> tuple[int, float]:
    mine = [r for r in rounds if lo <= getattr(r, field) < hi]
    return len(mine), (sum(r.emitted for r in mine) / len(mine) if mine else float("nan"))


def test_bucket_tau_rounds_and_paired_intervals_match_a_brute_force_recount():
    rows = _random_rows(np.random.default_rng(5))
    for axis in POSITION_AXES.values():
        stats = position_stats(rows, axis, baseline="b", replicates=REPLICATES, seed=3)
        # The documented draws: prompts in sorted suite/prompt_id order, one draw shared by both drafters.
        keys = sorted({f"{r.suite}/{r.prompt_id}" for v in rows.values() for r in v})
        draws = np.random.default_rng(3).integers(0, len(keys), size=(REPLICATES, len(keys)))
        for b, bucket in enumerate(POSITION_BUCKETS):
            hi = float("inf") if bucket.end is None else bucket.end
            brute = {d: _brute_tau(rows[d], axis.field, bucket.start, hi) for d in rows}
            replicas = {}
            for d in rows:
                count, tau = brute[d]
                stat = stats[d][b]
                assert stat.bucket == bucket.name and stat.rounds == count
                assert stat.prompts == len({r.prompt_id for r in rows[d]
                                            if bucket.start <= getattr(r, axis.field) < hi})
                if count == 0:
                    assert stat.tau is None and stat.interval is None
                    continue
                assert stat.tau == pytest.approx(tau)
                replicas[d] = np.array([_brute_tau([r for k in draw for r in rows[d]
                                                    if f"{r.suite}/{r.prompt_id}" == keys[k]],
                                                   axis.field, bucket.start, hi)[1] for draw in draws])
                finite = replicas[d][np.isfinite(replicas[d])]
                low, high = np.quantile(finite, [0.025, 0.975])
                assert (stat.interval.low, stat.interval.high) == pytest.approx((low, high))
            if "a" in replicas and "b" in replicas:
                ratio = replicas["a"] / replicas["b"]
                low, high = np.quantile(ratio[np.isfinite(ratio)], [0.025, 0.975])
                estimate = stats["a"][b].ratio
                assert estimate.value == pytest.approx(brute["a"][1] / brute["b"][1])
                assert (estimate.low, estimate.high) == pytest.approx((low, high))
            assert stats["b"][b].ratio is None
    # Rounds in every bucket on the answer axis: the recount checked each branch.
    assert all(s.rounds for s in position_stats(rows, POSITION_AXES["answer"])["a"])


def test_table_report_and_results_carry_the_buckets():
    rows = _random_rows(np.random.default_rng(8))
    table = build_table1(rows, {"a": 4, "b": 4}, {"a": 1, "b": 4}, TableSettings("b", 1.0, (0, 1), ("s",), 200))
    answer = table.to_dict()["tau_by_position"]["answer"]
    assert [b["bucket"] for b in answer["a"]["s"]] == [b.name for b in POSITION_BUCKETS]
    assert answer["a"]["s"][0]["ratio"] is not None and answer["b"]["s"][0]["ratio"] is None
    results = build_results(rows["a"], [], 4, {})
    buckets = results["suites"]["s"]["tau_by_position"]["context"]
    assert sum(b["rounds"] for b in buckets) == len(rows["a"])


def _prompt_ids(tokenizer, text: str) -> list[int]:
    rendered = tokenizer.apply_chat_template([{"role": "user", "content": text}], tokenize=False,
                                             add_generation_prompt=True, enable_thinking=False)
    return tokenizer(rendered, add_special_tokens=False)["input_ids"]


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    return load_tiny_target(tmp_path_factory.mktemp("tiny_target"))


def test_decoder_records_where_each_round_starts(target):
    model, tokenizer = target
    loaded = random_drafter(model, tokenizer, "dspark")
    decoder = SpeculativeDecoder(model, tokenizer, loaded.block_drafter(), [0], BLOCK, 1.0)
    turns, session = decoder.decode_conversation(["Hello!", "And then?"], 15)
    for turn in turns:
        starts = [r.answer_start for r in turn.rounds]
        assert starts == [sum(r.emitted for r in turn.rounds[:i]) for i in range(len(turn.rounds))]
        contexts = [r.context_start - turn.rounds[0].context_start for r in turn.rounds]
        assert contexts == starts
    # The first round's anchor is the prompt's last token; the last turn ends where the session's tokens end.
    assert turns[0].rounds[0].context_start == len(_prompt_ids(tokenizer, "Hello!")) - 1
    last = turns[-1]
    assert len(session.tokens) - 1 - last.rounds[-1].context_start == len(last.tokens) - last.rounds[-1].answer_start


def test_a_conversation_stops_at_the_context_limit(target):
    model, tokenizer = target
    loaded = random_drafter(model, tokenizer, "dspark")
    decoder = SpeculativeDecoder(model, tokenizer, loaded.block_drafter(), [0], BLOCK, 1.0)
    prompt_len = len(_prompt_ids(tokenizer, "Hi"))
    saved = model.config.max_position_embeddings
    model.config.max_position_embeddings = prompt_len + 30
    try:
        turns, session = decoder.decode_conversation(["Hi", "More", "Again"], 1000)
    finally:
        model.config.max_position_embeddings = saved
    assert len(session.tokens) <= prompt_len + 30
    # Either a turn hit the limit or a later turn was not started for want of room.
    assert len(turns) < 3 or turns[-1].stop_reason == "context"
    assert all(r.context_start + BLOCK < prompt_len + 30 for t in turns for r in t.rounds)
