"""Training and fine-tuning, in four rooms (see docs/training.md):

- :mod:`.conf`: WHAT the run is: the option table, the configuration and config files, the recipes, the
  architecture rule, every validation, the auto recipe (no torch);
- :mod:`.objectives`: WHAT is learned: classification, masked patch prediction, distillation;
- :mod:`.engine`: HOW one process runs it: the trainer, the loop, the step schedule, the time budget, DDP/FSDP;
- :mod:`.persist`: WHAT survives the process: the run's position, ``last.pt``, sharded checkpoints, outputs.

    from vitlab.train import TrainConfig, fit, get_recipe
    summary = fit(TrainConfig(recipe=get_recipe("digits", epochs=10), out="runs/digits"))

The names below are imported when first used (PEP 562): ``import vitlab.train.conf`` does not import torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._lazy import lazy_names

if TYPE_CHECKING:
    from .conf.recipes import RECIPES, Recipe, get_recipe, list_recipes
    from .conf.train_config import TrainConfig
    from .engine.model import build_model
    from .engine.run import fit

__all__ = ["RECIPES", "Recipe", "TrainConfig", "build_model", "fit", "get_recipe", "list_recipes"]

_WHERE = {
    "RECIPES": "conf.recipes",
    "Recipe": "conf.recipes",
    "get_recipe": "conf.recipes",
    "list_recipes": "conf.recipes",
    "TrainConfig": "conf.train_config",
    "fit": "engine.run",
    "build_model": "engine.model",
}


__getattr__, __dir__ = lazy_names(__name__, _WHERE, __all__)
