"""Tokenise a recipe's training and validation data into the cached Arrow shards that training memory-maps.

    PYTHONPATH=. python data/tokenize_shards.py recipe=qwen3-8b [dotted.key=value ...]

Takes the same arguments as ``train.py`` and calls ``build_token_dataset`` exactly as training does (same
sources, tokenizer, chat-template arguments, ``max_length``, ``data.supervise_reasoning``: one
``jobs.assembly.conversation_renderer``), so the cache entry it fills under
``data.cache_dir`` is the one the training job then finds: training starts without tokenising. Rerunning is
cheap (the cache is reused) and an interrupted run leaves no partial entry. (Named ``tokenize_shards`` rather
than ``tokenize`` so that running it does not shadow the standard library's ``tokenize`` module.)
"""

from __future__ import annotations

import sys
from typing import Optional

from deepspec_train.kinds.recipe_validation import load_recipe
from deepspec_train.config.schema import RecipeConfig
from deepspec_train.data.token_shards import DataSummary, build_token_dataset
from deepspec_train.common.errors import exit_on_user_error
from deepspec_train.common.model_folders import check_target_folder
from deepspec_train.commands.train_entry import parse_command_line
from deepspec_train.common.output_paths import ensure_output_dir


def tokenize_recipe_data(cfg: RecipeConfig, progress: bool = True) -> dict[str, DataSummary]:
    """Build (or reuse) the shard cache of every data split the recipe names; split -> summary."""
    from deepspec_train.jobs.assembly import conversation_renderer

    renderer = conversation_renderer(cfg)
    summaries = {}
    for split, sources in (("train", cfg.data.train), ("validation", cfg.data.validation)):
        if not sources:
            continue
        _, summaries[split] = build_token_dataset(
            sources, renderer, cfg.data.cache_dir, strict=cfg.data.strict, split=cfg.data.split, progress=progress,
            num_workers=cfg.data.num_workers,
        )
    return summaries


def main(argv: Optional[list[str]] = None) -> int:
    """Exit status 0, or 2 with one ``error:`` line for a bad recipe or data file (``deepspec_train.common.errors``)."""
    return exit_on_user_error(lambda: _tokenize(sys.argv[1:] if argv is None else argv))


def _tokenize(argv: list[str]) -> int:
    recipe, overrides = parse_command_line(argv)
    # Tokenising reads the target's tokenizer only: the rules that tie taps to its layers do not apply yet.
    cfg = load_recipe(recipe, overrides, check_target=False)
    check_target_folder(cfg.target.path, "target.path", weights=False, tokenizer=True)
    if cfg.data.cache_dir:
        ensure_output_dir(cfg.data.cache_dir, "data.cache_dir")
    for split, summary in tokenize_recipe_data(cfg).items():
        print(f"{split}: {summary.format()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
