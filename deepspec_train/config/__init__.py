"""Recipe schema (dataclasses) and the YAML loader that validates recipes and overrides against it."""

from deepspec_train.config.loader import ConfigError, load_recipe, save_resolved
from deepspec_train.config.schema import RecipeConfig

__all__ = ["ConfigError", "RecipeConfig", "load_recipe", "save_resolved"]
