"""What a saved lens or dictionary records of the model it belongs to: its config and a fingerprint of its
weights (the loaders refuse a file made for other weights); and the path type files are named by."""
from __future__ import annotations

import hashlib
import os
from typing import Any, Union

import torch

from .model import HookedModel

PathLike = Union[str, os.PathLike]


def model_config(model: HookedModel) -> dict:
    """The model's config as a plain dict (what a lens records of the model it belongs to)."""
    config: Any = getattr(model, "config", None)
    if hasattr(config, "to_dict"):
        return {k: v for k, v in config.to_dict().items() if isinstance(v, (int, float, str, bool, type(None)))}
    cfg = model.cfg
    return {"n_layers": int(cfg.n_layers), "d_model": int(cfg.d_model), "d_vocab": int(cfg.d_vocab)}


def fingerprint(model: HookedModel) -> str:
    """sha256 of the model's weights (names, dtypes, shapes and bytes), as 16 hex digits."""
    h = hashlib.sha256()
    for name, t in sorted(model.state_dict().items()):
        t = t.detach().cpu().contiguous()
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
        h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()[:16]
