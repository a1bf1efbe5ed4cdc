"""sprout: the Sprout transformer with TransformerLens hook points, its checkpoints and the walkthrough GPT.

Training lives in `sprout.training` (not imported here). Importing sprout changes nothing process-wide;
`sprout.keep_freed_memory()` is the one opt-in process setting (see sprout/_malloc.py).
"""
from ._malloc import keep_freed_memory
from .config import PRESETS, SproutConfig
from .model import Sprout
from .walkthrough import WalkthroughConfig, WalkthroughGPT, build_step

__all__ = ["PRESETS", "Sprout", "SproutConfig", "WalkthroughConfig", "WalkthroughGPT", "build_step",
           "keep_freed_memory", "load", "save"]


def __getattr__(name):
    # Checkpoint I/O pulls in safetensors and the tokenizer; import it only when asked for.
    if name in ("save", "load"):
        from .files import checkpoint

        return getattr(checkpoint, name)
    raise AttributeError(f"module 'sprout' has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | {"load", "save"})
