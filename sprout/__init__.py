"""sprout: the Sprout transformer with TransformerLens hook points, its checkpoints, data and training."""
from ._malloc import keep_freed_memory
from .config import PRESETS, SproutConfig
from .model import Sprout
from .walkthrough import WalkthroughConfig, WalkthroughGPT, build_step

keep_freed_memory()  # activation caches reuse memory instead of page-faulting it in anew (see _malloc.py)

__all__ = ["PRESETS", "Sprout", "SproutConfig", "WalkthroughConfig", "WalkthroughGPT", "build_step", "load", "save"]


def __getattr__(name):
    # Checkpoint I/O pulls in safetensors and the tokenizer; import it only when asked for.
    if name in ("save", "load"):
        from . import checkpoint

        return getattr(checkpoint, name)
    raise AttributeError(f"module 'sprout' has no attribute {name!r}")
