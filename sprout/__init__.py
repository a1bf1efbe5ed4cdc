"""sprout: the Sprout transformer with TransformerLens hook points, its checkpoints and the walkthrough GPT.

`sprout.load` gives a `Sprout` (TransformerLens' contract: `model(tokens)` is the logits);
`sprout.model.GPT` is the course's (`logits, loss = model(idx, targets)`) over the same modules.
Training lives in `sprout.training` (not imported here). Importing sprout changes nothing process-wide;
`sprout.keep_freed_memory()` is the one opt-in process setting (see sprout/_malloc.py).
"""
from ._malloc import keep_freed_memory
from .config import PRESETS, SproutConfig
from .files import load, save
from .model import GPT, Sprout
from .walkthrough import WalkthroughConfig, WalkthroughGPT, build_step

__all__ = ["GPT", "PRESETS", "Sprout", "SproutConfig", "WalkthroughConfig", "WalkthroughGPT", "build_step",
           "keep_freed_memory", "load", "save"]
