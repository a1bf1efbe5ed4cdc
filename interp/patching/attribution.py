"""Attribution patching (Nanda 2023; Syed et al. 2023): the gradient approximation to activation patching.

One clean forward, one corrupted forward and one backward of the metric on the corrupted run give, for
every patch at once, the first-order estimate `metric(patched) - metric(corrupted) ~ sum over the
patched piece of (clean - corrupted) * d metric / d activation`. Sites, `by` and the frame are those of
`interp.patch`; with `exact=True` the frame also carries the exact patched value beside the estimate.
"""
from __future__ import annotations

import pandas as pd
import torch

from sprout.names import act_name

from .._core.inputs import TextOrTokens
from .._core.metrics import Metric, check_metric, differentiable_value, hide, refuse_nan
from .._core.model import HookedModel, n_layers
from .._core.patch_engine import (
    SITES,
    Patch,
    baselines,
    check_site,
    clean_and_corrupted,
    hook_name,
    masked,
    patch_frame,
    patch_values,
    patches,
)


def _grad_run(model: HookedModel, tokens: torch.Tensor, metric: Metric, names: list[str], mask=None) -> tuple[dict, dict]:
    """Activations and d metric / d activation at `names` on one forward and one backward."""
    acts: dict[str, torch.Tensor] = {}
    grads: dict[str, torch.Tensor] = {}

    leaves = []

    def start_graph(x, hook):  # the embedding need not depend on a trainable weight for gradients to flow
        leaves.append(x.detach().requires_grad_(True))
        return leaves[-1]

    def keep(act, hook):
        acts[hook.name] = act.detach()
        act.register_hook(lambda g: grads.__setitem__(hook.name, g.detach()))
        return act

    with torch.enable_grad():
        logits = model.run_with_hooks(tokens, fwd_hooks=[(act_name("embed"), start_graph)] + [(n, keep) for n in names],
                                      **masked(mask))
        out = differentiable_value(metric, hide(logits, mask))
        refuse_nan([float(out.detach())], mask=mask)  # before a backward through NaN
        # gradients down to the embedding only: the hooks above read them on the way, and no parameter's
        # .grad is touched (the analysis leaves the model as it found it)
        torch.autograd.grad(out, leaves)
    return acts, grads


def _region(total: torch.Tensor, p: Patch, layout: str) -> float:
    """Sum of per-element attributions [batch, ...] over one patch's piece."""
    if layout == "pattern":  # [batch, head, query_pos, key_pos]
        t = total.sum((0, 3))  # [head, query_pos]
        t = t if p.head is None else t[p.head]
        return float(t.sum() if p.pos is None else t[..., p.pos].sum())
    t = total.sum(0)  # [pos, (head,) ...]
    t = t if p.pos is None else t[p.pos]
    if p.head is not None:
        t = t[p.head] if p.pos is not None else t[:, p.head]
    return float(t.sum())


def attribution_patch(model: HookedModel, clean: TextOrTokens, corrupted: TextOrTokens, metric: Metric, site: str = "resid_pre",
                      by: str = "position", exact: bool = False) -> pd.DataFrame:
    """Attribution patching: every patch of `interp.patch`'s sweep estimated from one backward pass.

    Args:
        model, clean, corrupted, metric, site, by: as in `interp.patch`.
        exact: also run the exact sweep (`interp.patch`) and put its values beside the estimates.

    Returns:
        The frame of `interp.patch` with `estimate` (corrupted metric + `attribution`) and `attribution`
        (the first-order change); with `exact=True` also `metric`, the exact patched value, and then
        `recovered` is the exact one.
    """
    check_site(model, site, by)
    check_metric(metric)
    clean, corrupted, mask = clean_and_corrupted(model, clean, corrupted)
    todo = patches(model, site, by, corrupted.shape[1])
    names = [hook_name(site, l) for l in range(n_layers(model))]
    with torch.inference_mode():
        _, clean_cache = model.run_with_cache(clean, names_filter=names, **masked(mask))
    acts, grads = _grad_run(model, corrupted, metric, names, mask)
    layout = SITES[site]
    per_element = {n: (clean_cache[n] - acts[n]) * grads[n] for n in names}
    attribution = [_region(per_element[hook_name(site, p.layer)], p, layout) for p in todo]
    clean_value, corrupted_value = baselines(model, clean, corrupted, metric, mask)
    values = {"estimate": [corrupted_value + a for a in attribution]}
    if exact:
        values = {"metric": patch_values(model, clean, corrupted, metric, site, todo, mask=mask), **values}
    frame = patch_frame(todo, site, values, clean_value, corrupted_value)
    frame["attribution"] = attribution
    return frame


def attribution_summary(frame: pd.DataFrame) -> dict:
    """Pearson correlation of estimate and exact value, over the rows of an `exact=True` frame."""
    if "metric" not in frame.columns:
        raise ValueError("the frame has no exact values: call attribution_patch(..., exact=True)")
    return {"correlation": float(frame["estimate"].corr(frame["metric"])), "n_patches": len(frame)}

