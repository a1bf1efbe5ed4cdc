"""sprout.training: recipes, corpus, curriculum, run directory, loop and the `sprout train` command; `core`,
the small trainer core (gradient reduction, clipping, resume check, settings flags) interp's trainers share.

`import sprout` does not import this package: loading and analysing a model never pays for the trainer.
The names below are imported when first used, so that `sprout.training.core` (which `interp`'s trainers
import) comes without the loop, the corpus and their dependencies.
"""
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .loop import NonFiniteLoss, train
    from .recipes import RECIPES, Recipe, get_recipe

__all__ = ["RECIPES", "NonFiniteLoss", "Recipe", "get_recipe", "train"]
_HOME = {"NonFiniteLoss": "loop", "train": "loop", "RECIPES": "recipes", "Recipe": "recipes", "get_recipe": "recipes"}


def __getattr__(name: str) -> Any:
    if name not in _HOME:
        raise AttributeError(f"module 'sprout.training' has no attribute {name!r}")
    return getattr(importlib.import_module(f".{_HOME[name]}", __name__), name)
