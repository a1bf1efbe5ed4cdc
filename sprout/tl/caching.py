"""The bodies of `HookedLM.run_with_cache`: what a names filter selects (and the warnings when it selects
nothing, or a hook point whose flag is off), and the cache with gradients (`incl_bwd=True`)."""
from __future__ import annotations

import warnings
from typing import Any, Callable, Collection, Optional, Union, cast

import torch

# what `selects` reads: TransformerLens' NamesFilter (a name, names, or a predicate)
Filter = Union[str, Collection[str], Callable[[str], bool]]


def not_attn_result(name: str) -> bool:
    """The names filter of a cache of everything: `attn.hook_result` only with `use_attn_result`."""
    return not name.endswith("attn.hook_result")


def selects(names_filter: Filter, name: str) -> bool:
    """Whether TransformerLens' names_filter (a name, a list, tuple or set of names, or a predicate) selects `name`."""
    if isinstance(names_filter, str):
        return name == names_filter
    if isinstance(names_filter, (list, tuple, set, frozenset)):
        return name in names_filter
    return bool(cast(Callable[[str], bool], names_filter)(name))


def warn_of_filter(model: Any, names_filter: Optional[Filter]) -> None:
    """Warn (at run_with_cache's caller) when `names_filter` selects no hook point, or names one whose flag is off."""
    if names_filter is not None and not any(selects(names_filter, name) for name in model.hook_dict):
        shown = "" if callable(names_filter) else f" {names_filter!r}"
        warnings.warn(f"names_filter{shown} matched none of the model's {len(model.hook_dict)} hook points, "
                      "so the cache will be empty (names look like 'blocks.0.hook_resid_post'; "
                      "model.hook_dict lists them all)", stacklevel=3)
    if isinstance(names_filter, (str, list, tuple, set, frozenset)):
        named = [names_filter] if isinstance(names_filter, str) else list(names_filter)
        gated = model.hook_flags.gated_flag
        off = [(n, gated(n)) for n in named if isinstance(n, str) and gated(n)]
        if off:
            warnings.warn(f"names_filter names {off[0][0]!r}, which fires only with model.cfg.{off[0][1]} on, so "
                          f"the cache will not hold it: call model.set_{off[0][1]}(True) first", stacklevel=3)


def run_with_grads(model: Any, model_args: tuple, kwargs: dict) -> tuple[Any, dict]:
    """run_with_cache(incl_bwd=True): forward's output and a cache of the activations and their gradients."""
    # TransformerLens calls `.backward()` on the output, which fills every parameter's .grad;
    # torch.autograd.grad runs the same backward (firing the same backward hooks) and leaves .grad alone.
    options = {k: kwargs.pop(k) for k in ("names_filter", "device", "remove_batch_dim", "pos_slice") if k in kwargs}
    reset, clear = kwargs.pop("reset_hooks_end", True), kwargs.pop("clear_contexts", False)
    kwargs.pop("incl_bwd")
    cache, fwd, bwd = model.get_caching_hooks(incl_bwd=True, **options)
    with model.hooks(fwd_hooks=fwd, bwd_hooks=bwd, reset_hooks_end=reset, clear_contexts=clear):
        out = model(*model_args, **kwargs)
        loss = out[1] if isinstance(out, tuple) else out
        if not isinstance(loss, torch.Tensor) or loss.dim() != 0:
            raise ValueError("run_with_cache(incl_bwd=True) caches gradients of the loss: pass return_type='loss' "
                             "(or 'both'; with targets=... for model.py's loss)")
        params = [p for p in model.parameters() if p.requires_grad]
        if not loss.requires_grad or not params:
            raise ValueError("run_with_cache(incl_bwd=True) needs gradients: the parameters do not require grad "
                             "or autograd is off (torch.no_grad / inference_mode)")
        torch.autograd.grad(loss, params, allow_unused=True)
    return out, cache
