"""What a saved lens or dictionary records of the model it belongs to: its config and a fingerprint of its
weights (the loaders refuse a file made for other weights); and the path type files are named by.

Checks at the door, once. Hashing every weight (`fingerprint`) and running a forward to read hook widths
cost real time on a real model, so neither is repeated while the weights stay as they were:
`weights_key(model)` names the weights' state by each state-dict tensor's identity, storage and version
counter (`tensor._version`, which every in-place edit bumps: an optimizer step, `p.mul_()` under
`torch.no_grad()`, `load_state_dict`, which copies into the tensors in place). `fingerprint` keeps its last
hash per model and `check_once` its passed checks per model, each beside the key it held for; a later key
means a fresh hash and a fresh check. Both caches are weak on the model (dropping the model drops them).
An edit through `p.data` is invisible to the version counter (torch gives `.data` its own), so after
one, call `forget(model)`; a model whose tensors have no version counter (made under
`torch.inference_mode()`) is checked on every call.
"""
from __future__ import annotations

import hashlib
import os
import weakref
from typing import Any, Callable, Hashable, Optional, Union

import torch

from .model import HookedModel

PathLike = Union[str, os.PathLike]

# model -> (weights_key, fingerprint) and model -> {what was checked: weights_key when it passed}
_FINGERPRINTS: "weakref.WeakKeyDictionary[Any, tuple[tuple, str]]" = weakref.WeakKeyDictionary()
_PASSED: "weakref.WeakKeyDictionary[Any, dict[Hashable, tuple]]" = weakref.WeakKeyDictionary()


def model_config(model: HookedModel) -> dict:
    """The model's config as a plain dict (what a lens records of the model it belongs to)."""
    config: Any = getattr(model, "config", None)
    if hasattr(config, "to_dict"):
        return {k: v for k, v in config.to_dict().items() if isinstance(v, (int, float, str, bool, type(None)))}
    cfg = model.cfg
    return {"n_layers": int(cfg.n_layers), "d_model": int(cfg.d_model), "d_vocab": int(cfg.d_vocab)}


def weights_key(model: HookedModel) -> Optional[tuple]:
    """The state of the model's weights as a cheap key: (name, id, data_ptr, _version) of every state-dict
    tensor; None when a tensor has no version counter (an inference tensor), so nothing is cached."""
    try:
        return tuple((name, id(t), t.data_ptr(), t._version) for name, t in model.state_dict(keep_vars=True).items())
    except RuntimeError:  # "Inference tensors do not track version counter"
        return None


def _hash_weights(model: HookedModel) -> str:
    h = hashlib.sha256()
    for name, t in sorted(model.state_dict().items()):
        t = t.detach().cpu().contiguous()
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
        h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()[:16]


def fingerprint(model: HookedModel) -> str:
    """sha256 of the model's weights (names, dtypes, shapes and bytes), as 16 hex digits; hashed again
    only after the weights change (see the module docstring)."""
    key = weights_key(model)
    held = _FINGERPRINTS.get(model)
    if key is not None and held is not None and held[0] == key:
        return held[1]
    fp = _hash_weights(model)
    if key is not None:
        _FINGERPRINTS[model] = (key, fp)
    return fp


def check_once(model: HookedModel, what: Hashable, check: Callable[[], None]) -> None:
    """Run `check()` (which raises if `model` does not fit) unless it passed for the same `what` and the
    same weights before. `what` must hold everything the check reads besides the model (a dictionary's
    recorded config, fingerprint, hooks and widths), so an equal `what` means an equal answer."""
    key = weights_key(model)
    passed = _PASSED.get(model)
    if key is not None and passed is not None and passed.get(what) == key:
        return
    check()
    if key is not None:
        _PASSED.setdefault(model, {})[what] = key


def forget(model: HookedModel) -> None:
    """Drop the model's cached fingerprint and passed checks (after an edit the version counters miss)."""
    _FINGERPRINTS.pop(model, None)
    _PASSED.pop(model, None)
