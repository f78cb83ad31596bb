"""The recipe settings a target decides: ``target.layer_ids`` and ``drafter.mask_token_id`` left null are taken
from the target when its ``config.json`` and tokenizer are read (no weights), and each decision is logged.

The target's family is matched by what identifies it (``families.catalog.family_of`` with the tokenizer's
vocabulary), never by class name alone. Taps follow the rule every family shares; the mask token is the family
record's, or, for a target no record identifies, an unused special token of its own tokenizer
(``families.own_tokens``). The turn end is logged too (the regeneration and the evaluator stop on it). When a rule
finds nothing, one line names the setting the user must give. ``kinds.recipe_validation.load_recipe`` calls ``resolve``;
the run saves the resolved values in ``resolved_config.yaml``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from deepspec_train.config.loader import ConfigError
from deepspec_train.config.schema import RecipeConfig
from deepspec_train.families.catalog import family_of
from deepspec_train.families.own_tokens import chat_turn_end, unused_special_token


def needs_target(cfg: RecipeConfig) -> bool:
    """Whether the recipe leaves a setting to the target."""
    return cfg.target.layer_ids is None or cfg.drafter.mask_token_id is None


def _load_tokenizer(cfg: RecipeConfig):
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(cfg.target.path, trust_remote_code=cfg.target.trust_remote_code)
    except (OSError, ValueError) as exc:
        raise ConfigError(f"target.path = {cfg.target.path!r}: its tokenizer does not load "
                          f"({str(exc).splitlines()[0]}), so drafter.mask_token_id and target.layer_ids must be "
                          "given") from None


def resolve(cfg: RecipeConfig, target_config: Mapping[str, Any], uses_mask_token: bool,
            default_taps: Callable[[int], list[int]]) -> list[str]:
    """Fill ``cfg``'s null target settings from the target (see the module docstring): ``default_taps`` is the
    drafter kind's tap rule for a target depth. Returns the log lines."""
    if not needs_target(cfg):
        return []
    tokenizer = _load_tokenizer(cfg)
    family = family_of(target_config, set(tokenizer.get_vocab()))
    who = f"family {family.name}" if family is not None else "no family record identifies the target"
    notes = []
    if cfg.target.layer_ids is None:
        layers = int(target_config.get("num_hidden_layers") or 0)
        if layers < 5:
            raise ConfigError(f"target.layer_ids is null and the target has {layers} decoder layers, too few for the "
                              "tap rule: set target.layer_ids")
        cfg.target.layer_ids = default_taps(layers)
        notes.append(f"target.layer_ids = {cfg.target.layer_ids}: the {cfg.drafter.kind} tap rule for "
                     f"{layers} layers")
    if cfg.drafter.mask_token_id is None:
        if family is not None:
            cfg.drafter.mask_token_id = family.mask_token_id
            notes.append(f"drafter.mask_token_id = {family.mask_token_id}: the {family.name} family's mask")
        else:
            found = unused_special_token(tokenizer, target_config)
            if found is None:
                if uses_mask_token:
                    raise ConfigError("drafter.mask_token_id is null and the target's tokenizer has no unused "
                                      "special token (all are bos / eos / pad / unk or written by its chat "
                                      "template): set drafter.mask_token_id to an id it never produces")
                found = (0, "unused by this drafter kind")
            cfg.drafter.mask_token_id = found[0]
            notes.append(f"drafter.mask_token_id = {found[0]} ({found[1]}): the last special token of the target's "
                         "tokenizer that is not bos / eos / pad / unk and that its chat template never writes")
    turn_end = family.turn_end if family is not None else chat_turn_end(tokenizer)
    notes.append(f"turn end {turn_end!r} ({'family record' if family is not None else 'from its chat template'})"
                 if turn_end else "turn end: the chat template writes none; answers end at the tokenizer's eos")
    # Imported here: recipe checks run before torch is imported (a bad value fails train.py within two seconds).
    from deepspec_train.common.console import get_logger

    log = get_logger(__name__)
    for note in notes:
        log.info("from the target (%s): %s", who, note)
    return notes
