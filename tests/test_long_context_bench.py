"""The long-context benchmark's data: short conversations chained within their bound, and long ones that join
them without losing, reordering or overfilling anything (recounted with the tiny world's tokenizer)."""

from __future__ import annotations

from pathlib import Path

from transformers import AutoTokenizer

from bench.long_context_acceptance import chain, concatenate, rendered_tokens, turn_cost, user_turns


def test_chained_and_joined_conversations_keep_every_turn_within_their_bounds(tiny_world: Path) -> None:
    tokenizer = AutoTokenizer.from_pretrained(tiny_world / "target")
    prompts = user_turns(tiny_world / "corpus" / "train.jsonl", 60)
    costed = [(p, turn_cost(tokenizer, p, 32)) for p in prompts]
    costed = [(p, c) for p, c in costed if c <= 512]
    short = chain(costed, 512, "short")
    assert [m["content"] for r in short for m in r["messages"] if m["role"] == "user"] == [p for p, _ in costed]
    cost_of = dict(costed)
    for row in short:
        assert sum(cost_of[m["content"]] for m in row["messages"] if m["role"] == "user") <= 512
    # Answers the target would write: 32 tokens at most, here a fixed short text.
    answered = [{**r, "messages": [m if m["role"] == "user" else {**m, "content": "a b c"} for m in r["messages"]]}
                for r in short]
    long = concatenate(answered, tokenizer, 2048, "long")
    assert [m for r in long for m in r["messages"]] == [m for r in answered for m in r["messages"]]
    assert len(long) < len(answered)
    assert all(rendered_tokens(tokenizer, r["messages"]) <= 2048 for r in long)
