"""Training and fine-tuning: recipes, the loop, optimiser groups, schedules, checkpoints
that resume exactly, and DistributedDataParallel.

    from vitlab.train import TrainConfig, fit, get_recipe
    summary = fit(TrainConfig(recipe=get_recipe("digits", epochs=10), out="runs/digits"))
"""

from .recipes import RECIPES, Recipe, get_recipe, list_recipes
from .trainer import TrainConfig, build_model, fit

__all__ = ["RECIPES", "Recipe", "TrainConfig", "build_model", "fit", "get_recipe", "list_recipes"]
