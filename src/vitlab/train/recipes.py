"""Moved to :mod:`vitlab.train.spec.recipes` (this name goes when every caller has moved)."""

from .spec.recipes import RECIPES, Recipe, get_recipe, list_recipes

__all__ = ["RECIPES", "Recipe", "get_recipe", "list_recipes"]
