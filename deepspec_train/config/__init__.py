"""Recipe schema (dataclasses) and the YAML reader that checks recipes and overrides against it (the rules beyond
types run in ``deepspec_train.kinds.recipe_validation``)."""

from deepspec_train.config.loader import ConfigError, read_recipe, save_resolved
from deepspec_train.config.schema import RecipeConfig

__all__ = ["ConfigError", "RecipeConfig", "read_recipe", "save_resolved"]
