"""Read a YAML recipe plus ``dotted.key=value`` overrides into a typed ``RecipeConfig``.

A missing recipe, an unknown key or a value of the wrong type raises ``ConfigError`` with a one-line message
naming the file or key and the closest valid name. The rules beyond types (``config.rules`` and the drafter
kind's own) are run once, above this package, by ``kinds.recipe_validation.load_recipe``, which every entry point uses.
A recipe may name another as ``base:``; its keys are merged under the recipe's own. Sections that belong to another verb
(``regenerate``) are left to that verb (``load_recipe_section``).
"""

from __future__ import annotations

import dataclasses
import difflib
import os
import re
import types
import typing
from pathlib import Path
from typing import Any, Literal, Union

import yaml

from deepspec_train.config.schema import RecipeConfig
from deepspec_train.config.shipped_files import SHIPPED_RECIPES
from deepspec_train.common.errors import UserError

RECIPE_SUFFIXES = (".yaml", ".yml")
# Top-level recipe sections read by other verbs than training, which validate them themselves.
OTHER_VERB_SECTIONS = ("regenerate",)


class ConfigError(UserError, ValueError):
    """A recipe or override that does not validate; the message is one line meant for the user (a ``UserError``:
    the entry points print it and exit with status 2)."""


def recipe_dirs() -> list[Path]:
    """Where recipe names are looked up: $DEEPSPEC_RECIPES, ./recipes, then the recipes shipped with the package
    (the repository's recipes/ in a checkout: ``config.shipped_files``)."""
    dirs = []
    if os.environ.get("DEEPSPEC_RECIPES"):
        dirs.append(Path(os.environ["DEEPSPEC_RECIPES"]))
    dirs.append(Path.cwd() / "recipes")
    dirs.append(SHIPPED_RECIPES)
    unique: list[Path] = []
    for d in dirs:
        # In a checkout ./recipes and the shipped recipes are one folder (a link): list it once.
        if d.resolve() not in [u.resolve() for u in unique]:
            unique.append(d)
    return unique


def available_recipes() -> list[str]:
    names: set[str] = set()
    for d in recipe_dirs():
        if d.is_dir():
            names.update(p.stem for p in d.iterdir() if p.suffix in RECIPE_SUFFIXES)
    return sorted(names)


def find_recipe(name_or_path: str) -> Path:
    """Resolve a recipe name (``qwen3-8b``) or a path to a YAML file."""
    candidate = Path(name_or_path)
    if candidate.suffix in RECIPE_SUFFIXES or os.sep in name_or_path:
        if candidate.is_file():
            return candidate
        raise ConfigError(f"recipe file not found: {name_or_path}")
    for d in recipe_dirs():
        for suffix in RECIPE_SUFFIXES:
            path = d / f"{name_or_path}{suffix}"
            if path.is_file():
                return path
    close = difflib.get_close_matches(name_or_path, available_recipes(), n=1)
    hint = f" (did you mean '{close[0]}'?)" if close else ""
    raise ConfigError(f"unknown recipe '{name_or_path}'{hint}; available: {', '.join(available_recipes())}")


def _read_yaml(path: Path, seen: tuple[Path, ...] = ()) -> dict:
    if path in seen:
        raise ConfigError(f"recipe {path}: 'base' chain loops back to itself")
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as exc:
        raise ConfigError(f"recipe {path}: invalid YAML ({str(exc).splitlines()[0]})") from None
    if not isinstance(data, dict):
        raise ConfigError(f"recipe {path}: top level must be a mapping")
    base = data.pop("base", None)
    if base is None:
        return data
    return _deep_merge(_read_yaml(find_recipe(str(base)), seen + (path,)), data)


def _deep_merge(base: dict, top: dict) -> dict:
    merged = dict(base)
    for key, value in top.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = _deep_merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def parse_overrides(overrides: list[str]) -> dict:
    """``["a.b=1", "c=x"]`` -> nested dict; values are parsed as YAML scalars/lists."""
    nested: dict = {}
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"override '{item}' is not of the form dotted.key=value")
        key, raw = item.split("=", 1)
        try:
            value = yaml.safe_load(raw) if raw != "" else ""
        except yaml.YAMLError:
            value = raw
        node = nested
        parts = key.strip().split(".")
        for part in parts[:-1]:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ConfigError(f"override '{item}' conflicts with another override")
        node[parts[-1]] = value
    return nested


_FLOAT_LITERAL = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?")


def _type_name(tp: Any) -> str:
    return getattr(tp, "__name__", None) or str(tp).replace("typing.", "")


def _coerce(value: Any, tp: Any, key: str, source: str) -> Any:
    """Check ``value`` against the annotation ``tp``; return it (ints widen to floats)."""
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin in (Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        errors = []
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _coerce(value, arg, key, source)
            except ConfigError as exc:
                errors.append(str(exc))
        raise ConfigError(errors[0] if errors else f"{source}: '{key}' must not be null")
    if origin is Literal:
        if value not in args:
            choices = ", ".join(repr(a) for a in args)
            raise ConfigError(f"{source}: '{key}' = {value!r} is not one of {choices}")
        return value
    if origin is list:
        if not isinstance(value, list):
            raise ConfigError(f"{source}: '{key}' must be a list, got {type(value).__name__} {value!r}")
        return [_coerce(v, args[0], f"{key}[{i}]", source) for i, v in enumerate(value)] if args else value
    if tp is float:
        if isinstance(value, str) and _FLOAT_LITERAL.fullmatch(value.strip()):
            # PyYAML follows YAML 1.1, which reads '3e-4' (no dot) as a string; Python and YAML 1.2 read a number.
            return float(value)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{source}: '{key}' must be a number, got {type(value).__name__} {value!r}")
        return float(value)
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{source}: '{key}' must be an integer, got {type(value).__name__} {value!r}")
        return value
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{source}: '{key}' must be true or false, got {value!r}")
        return value
    if tp is str:
        if not isinstance(value, (str, int, float)) or isinstance(value, bool):
            raise ConfigError(f"{source}: '{key}' must be a string, got {type(value).__name__} {value!r}")
        return str(value)
    if dataclasses.is_dataclass(tp):
        return _build(tp, value, key, source)
    raise ConfigError(f"{source}: '{key}' has an unsupported type {_type_name(tp)}")


def _build(cls: type, data: Any, prefix: str, source: str) -> Any:
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: '{prefix or 'recipe'}' must be a mapping, got {data!r}")
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    kwargs = {}
    for key, value in data.items():
        dotted = f"{prefix}.{key}" if prefix else str(key)
        if key not in names:
            close = difflib.get_close_matches(str(key), names, n=1)
            if close:
                hint = f" (did you mean '{prefix + '.' if prefix else ''}{close[0]}'?)"
            else:
                hint = f" (valid keys here: {', '.join(names)})"
            raise ConfigError(f"{source}: unknown key '{dotted}'{hint}")
        kwargs[key] = _coerce(value, hints[key], dotted, source)
    return cls(**kwargs)


def _training_sections(data: dict) -> dict:
    return {key: value for key, value in data.items() if key not in OTHER_VERB_SECTIONS}


def read_recipe(name_or_path: str, overrides: list[str] | None = None) -> tuple[Path, RecipeConfig]:
    """Find, merge and override a recipe, checking keys and types only; returns the recipe's file and config."""
    path = find_recipe(name_or_path)
    data = _training_sections(_read_yaml(path))
    cfg = _build(RecipeConfig, data, "", f"recipe {path}")
    if overrides:
        merged = _deep_merge(dataclasses.asdict(cfg), parse_overrides(overrides))
        # Overrides are validated against the schema separately so the message names the override.
        _build(RecipeConfig, parse_overrides(overrides), "", "override")
        cfg = _build(RecipeConfig, merged, "", "override")
    return path, cfg


def load_recipe_section(name_or_path: str, section: str, cls: type) -> Any:
    """One section of a recipe that another verb reads (e.g. ``regenerate``), validated against ``cls``; the
    defaults of ``cls`` when the recipe has none."""
    path = find_recipe(name_or_path)
    data = _read_yaml(path).get(section, {})
    return _build(cls, data, section, f"recipe {path}")


def config_to_dict(cfg: RecipeConfig) -> dict:
    return dataclasses.asdict(cfg)


def resolved_yaml(cfg: RecipeConfig) -> str:
    """The fully resolved config (every default filled in) as YAML, in the schema's order."""
    return yaml.safe_dump(config_to_dict(cfg), sort_keys=False)


def save_resolved(cfg: RecipeConfig, path: str | Path) -> None:
    """Write the fully resolved config next to the run's outputs."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(resolved_yaml(cfg))
