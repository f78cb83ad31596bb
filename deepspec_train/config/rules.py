"""The rules a recipe must satisfy beyond its types, checked before anything loads.

Three groups, each a function returning one-line messages (empty when the recipe is fine):

- ``recipe_problems``: what the recipe alone decides: ranges, enum-like strings, paths that must exist (the
  drafter kind's own rules, e.g. DFlash has no Markov head, are its record's: ``kinds``);
- ``target_problems``: what needs the target's ``config.json`` (no weights): tapped layers inside the target,
  the mask token inside its vocabulary, a draft vocabulary no larger than it, what the target family's TP plan
  splits dividing by ``topology.target_tp``, no final-logit soft-capping the frozen head would miss (a kind's own
  rules against the target, e.g. DFlash2's convolution groups dividing the hidden width, are its record's);
- ``launch_problems``: what needs the launch (world size): enough processes for the topology, at least one
  sequence per step for every drafter rank (the drafter count need not divide the global batch).

``kinds.recipe_validation.load_recipe`` runs the first two with the kind's rules, ``commands.train_entry`` the third;
each message names the key, the value and what is allowed.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Mapping

from deepspec_train.config.chat_template_setting import chat_template_problem
from deepspec_train.config.schema import RecipeConfig
from deepspec_train.config.shipped_files import resolve_shipped_path
from deepspec_train.families.catalog import family_of
from deepspec_train.families.records import heads_and_widths_split


def _at_least(problems: list[str], key: str, value: Any, low: float, what: str = "") -> None:
    if value is None or value < low:
        problems.append(f"{key} = {value!r} must be >= {low:g}{what}")


def _positive(problems: list[str], key: str, value: float) -> None:
    if not (math.isfinite(value) and value > 0):
        problems.append(f"{key} = {value!r} must be a positive number")


def _non_negative(problems: list[str], key: str, value: float) -> None:
    if not (math.isfinite(value) and value >= 0):
        problems.append(f"{key} = {value!r} must be a number >= 0")


def _resume_problems(resume: str) -> list[str]:
    if resume in ("none", "auto"):
        return []
    if not (Path(resume) / "trainer_state.json").is_file():
        return [f"train.resume = {resume!r} must be 'none', 'auto' or a checkpoint directory (no trainer_state.json there)"]
    return []


def recipe_problems(cfg: RecipeConfig) -> list[str]:
    """Every rule that needs only the recipe (see the module docstring)."""
    p: list[str] = []
    if not cfg.run.output_dir:
        p.append("run.output_dir is empty: name the directory the run writes to")
    if not cfg.target.path:
        p.append("target.path is empty: name the target model directory (config.json + safetensors)")
    # Null taps are taken from the target when it is read (config.target_tokens).
    ids = cfg.target.layer_ids
    if ids == []:
        p.append("target.layer_ids is empty: name at least one target decoder layer to tap")
    elif ids and (min(ids) < 0 or any(b < a for a, b in zip(ids, ids[1:]))):
        # Sorted, as the engines order the fused features (fc's input columns) whatever order a config lists.
        p.append(f"target.layer_ids = {ids} must be decoder-layer ids >= 0 in increasing order")
    if not cfg.data.train:
        p.append("data.train is empty: name at least one training data file")
    _at_least(p, "data.max_length", cfg.data.max_length, 2, " (a block needs an anchor and the token after it)")
    _at_least(p, "data.num_workers", cfg.data.num_workers, 0)
    template_problem = chat_template_problem(cfg.data.chat_template)
    if template_problem is not None:
        p.append(template_problem)
    if not 0 <= cfg.data.max_skipped_fraction <= 1:
        p.append(f"data.max_skipped_fraction = {cfg.data.max_skipped_fraction!r} must be between 0 and 1")
    d = cfg.drafter
    _at_least(p, "drafter.num_layers", d.num_layers, 1)
    _at_least(p, "drafter.block_size", d.block_size, 1)
    _at_least(p, "drafter.markov_rank", d.markov_rank, 0)
    if d.mask_token_id is not None:
        _at_least(p, "drafter.mask_token_id", d.mask_token_id, 0)
    _at_least(p, "drafter.ttt_steps", d.ttt_steps, 1)
    if d.intermediate_size is not None:
        _at_least(p, "drafter.intermediate_size", d.intermediate_size, 1, " (or unset: the target's MLP width)")
    _at_least(p, "anchors.num_per_sequence", cfg.anchors.num_per_sequence, 1)
    needed = cfg.data.max_length + d.block_size - 2
    if cfg.anchors.token_budget < needed:
        p.append(
            f"anchors.token_budget = {cfg.anchors.token_budget} must be >= data.max_length + drafter.block_size - 2 "
            f"= {needed} (the last anchor's context plus its block)"
        )
    loss = cfg.loss
    for name in ("alpha_ce", "alpha_tv", "alpha_conf"):
        _non_negative(p, f"loss.{name}", getattr(loss, name))
    if loss.alpha_ce + loss.alpha_tv == 0:
        p.append("loss.alpha_ce and loss.alpha_tv are both 0: the drafter would get no training signal")
    _positive(p, "loss.gamma_decay", loss.gamma_decay)
    _positive(p, "loss.temperature", loss.temperature)
    _at_least(p, "loss.chunk_size", loss.chunk_size, 1)
    t = cfg.train
    _positive(p, "train.lr", t.lr)
    if not 0 <= t.warmup_frac < 1:
        p.append(f"train.warmup_frac = {t.warmup_frac!r} must be in [0, 1) (a fraction of the run's steps)")
    _non_negative(p, "train.weight_decay", t.weight_decay)
    _positive(p, "train.grad_clip", t.grad_clip)
    if not 0 <= t.adam_beta1 < 1:
        p.append(f"train.adam_beta1 = {t.adam_beta1!r} must be in [0, 1)")
    if not 0 <= t.adam_beta2 < 1:
        p.append(f"train.adam_beta2 = {t.adam_beta2!r} must be in [0, 1)")
    _positive(p, "train.adam_eps", t.adam_eps)
    _at_least(p, "train.max_bad_steps", t.max_bad_steps, 1)
    _positive(p, "train.epochs", t.epochs)
    if t.max_steps is not None:
        _at_least(p, "train.max_steps", t.max_steps, 1, " (or unset: train.epochs decides)")
    _at_least(p, "train.global_batch_sequences", t.global_batch_sequences, 1)
    _at_least(p, "train.feature_reuse", t.feature_reuse, 1, " (1: every step runs the target)")
    _at_least(p, "train.feature_reuse_bytes", t.feature_reuse_bytes, 1)
    _at_least(p, "train.micro_batch_sequences", t.micro_batch_sequences, 1)
    _at_least(p, "train.eval_every", t.eval_every, 1)
    _at_least(p, "train.eval_sequences", t.eval_sequences, 1)
    _at_least(p, "train.checkpoint_every", t.checkpoint_every, 1)
    _at_least(p, "train.keep_last", t.keep_last, 0, " (0 keeps every checkpoint)")
    if t.stop_at_step is not None:
        _at_least(p, "train.stop_at_step", t.stop_at_step, 1)
    p.extend(_resume_problems(t.resume))
    if d.init_from is not None and not Path(d.init_from).is_dir():
        p.append(f"drafter.init_from = {d.init_from!r}: no such directory (a drafter export, release or <run>/drafter)")
    if d.init_from_target_layers is not None:
        if not d.init_from_target_layers or min(d.init_from_target_layers) < 0:
            p.append(f"drafter.init_from_target_layers = {d.init_from_target_layers!r} must list target layers >= 0 "
                     "(or be null)")
        if d.init_from is not None:
            p.append("drafter.init_from and drafter.init_from_target_layers both start the drafter: set one")
    if cfg.run.overwrite and t.resume != "none":
        p.append(f"run.overwrite=true starts the run over: it cannot be combined with train.resume={t.resume}")
    if t.distributed == "deepspeed":
        if not resolve_shipped_path(t.deepspeed_config).is_file():
            p.append(f"train.deepspeed_config = {t.deepspeed_config!r}: no such file")
    _at_least(p, "topology.target_workers", cfg.topology.target_workers, 0, " (0 = colocated)")
    p.extend(_topology_problems(cfg.topology.target_workers, cfg.topology.target_tp))
    _at_least(p, "stream.depth", cfg.stream.depth, 1)
    _positive(p, "stream.timeout_s", cfg.stream.timeout_s)
    _at_least(p, "logging.log_every", cfg.logging.log_every, 1)
    return p


def _topology_problems(target_workers: int, target_tp: int) -> list[str]:
    if target_tp is None or target_tp < 1:
        return [f"topology.target_tp = {target_tp!r} must be >= 1 (target ranks per tensor-parallel group)"]
    if target_tp == 1:
        return []
    if target_workers == 0:
        return [
            f"topology.target_tp = {target_tp} needs streamed mode: tensor-parallel target groups exist only on target "
            f"workers; set topology.target_workers to a multiple of {target_tp}"
        ]
    if target_workers % target_tp:
        return [
            f"topology.target_workers = {target_workers} does not form groups of topology.target_tp = {target_tp}; "
            f"choose a multiple of {target_tp}"
        ]
    return []


def tensor_parallel_problems(target_config: Mapping[str, Any], target_tp: int, plan: str = "auto") -> list[str]:
    """What a group's TP plan splits ``target_tp`` ways must divide by it: the config fields the target family's
    plan splits (``families``: for Qwen3 / Llama / Gemma with ``auto`` the query and key/value heads and the
    dense MLP and expert widths; ``"experts"`` replicates attention and needs experts to split)."""
    if target_tp <= 1:
        return []
    family = family_of(target_config)
    split = family.tp_split if family is not None else heads_and_widths_split
    keys = split(target_config, plan)
    if plan == "experts" and not keys:
        return ["topology.target_tp_plan = 'experts' needs a mixture-of-experts target; this one has no experts"]
    sizes = {key: target_config.get(key) for key in keys if isinstance(target_config.get(key), int)}
    bad = {key: value for key, value in sizes.items() if value % target_tp}
    if not bad:
        return []
    common = math.gcd(*sizes.values())
    choices = [k for k in range(1, common + 1) if common % k == 0 and k <= 64]
    listed = ", ".join(f"{key} = {value}" for key, value in bad.items())
    what = "heads" if plan == "auto" else "experts"
    return [
        f"topology.target_tp = {target_tp} cannot split the target's {what} over a group of {target_tp} ranks: "
        f"{listed} not a multiple of {target_tp} (target_tp values that split it: {choices})"
    ]


def head_problems(target_config: Mapping[str, Any]) -> list[str]:
    """The drafter's frozen head computes ``lm_head(h_final)`` and nothing after it: a target that soft-caps its
    final logits (Gemma 2's ``final_logit_softcapping``; Gemma 3's published configs have none) would give the
    loss another distribution than the target's."""
    cap = target_config.get("final_logit_softcapping")
    if cap is None:
        return []
    return [f"the target soft-caps its final logits (final_logit_softcapping = {cap}), which the drafter's "
            "frozen LM head does not reproduce"]


def read_target_config(path: str) -> Mapping[str, Any]:
    """The target's ``config.json`` as a dict (no weights are read)."""
    config = Path(path) / "config.json"
    if not config.is_file():
        where = "no such directory" if not Path(path).exists() else "no config.json there"
        raise FileNotFoundError(f"target.path = {path!r}: {where} (a local model directory, nothing is downloaded)")
    try:
        return json.loads(config.read_text())
    except json.JSONDecodeError as exc:
        raise ValueError(f"target.path = {path!r}: config.json is not valid JSON ({exc.msg} at line {exc.lineno})") from None


def target_problems(cfg: RecipeConfig, target_config: Mapping[str, Any], uses_mask_token: bool) -> list[str]:
    """Rules that tie the recipe to its target's config (see the module docstring); ``uses_mask_token``: whether
    the recipe's drafter kind feeds ``drafter.mask_token_id`` to its blocks."""
    p: list[str] = []
    layers = target_config.get("num_hidden_layers")
    vocab = target_config.get("vocab_size")
    if isinstance(layers, int) and cfg.target.layer_ids and max(cfg.target.layer_ids) > layers - 2:
        p.append(
            f"target.layer_ids = {cfg.target.layer_ids}: the target has {layers} decoder layers, so a tap must be in "
            f"0..{layers - 2} (never the last layer, whose output is only the final norm's input)"
        )
    starts = cfg.drafter.init_from_target_layers
    if isinstance(layers, int) and starts and max(starts) >= layers:
        p.append(f"drafter.init_from_target_layers = {starts}: the target has {layers} decoder layers (0..{layers - 1})")
    if isinstance(vocab, int):
        if uses_mask_token and cfg.drafter.mask_token_id >= vocab:
            p.append(f"drafter.mask_token_id = {cfg.drafter.mask_token_id} is outside the target's vocabulary (0..{vocab - 1})")
        size = cfg.drafter.draft_vocab_size
        if size is not None and size > vocab:
            p.append(f"drafter.draft_vocab_size = {size} exceeds the target's vocabulary ({vocab})")
    p.extend(tensor_parallel_problems(target_config, cfg.topology.target_tp, cfg.topology.target_tp_plan))
    p.extend(head_problems(target_config))
    return p


def launch_problems(cfg: RecipeConfig, world_size: int) -> list[str]:
    """Rules that need the number of processes the launcher started."""
    targets = cfg.topology.target_workers
    if targets == 0:
        drafters = world_size
    elif world_size <= targets:
        return [
            f"topology.target_workers = {targets} needs at least {targets + 1} processes (targets plus at least one "
            f"drafter worker); the launcher started {world_size}"
        ]
    else:
        drafters = world_size - targets
    if cfg.train.global_batch_sequences < drafters:
        return [
            f"train.global_batch_sequences = {cfg.train.global_batch_sequences} is fewer than the {drafters} drafter "
            f"rank(s) of this launch: every drafter rank needs at least one sequence per step"
        ]
    return []
