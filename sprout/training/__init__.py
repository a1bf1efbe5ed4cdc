"""sprout.training: recipes, corpus, curriculum, run directory, loop and the `sprout train` command.

`import sprout` does not import this package: loading and analysing a model never pays for the trainer.
"""
from .loop import NonFiniteLoss, train
from .recipes import RECIPES, Recipe, get_recipe

__all__ = ["RECIPES", "NonFiniteLoss", "Recipe", "get_recipe", "train"]
