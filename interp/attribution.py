"""Direct logit attribution, and attribution patching (the gradient approximation to activation patching).

Direct logit attribution. The final residual stream is a sum of writes: the embedding, every head's
`z W_O` (`attn.hook_result`) and every MLP's output. The logit of token t is
`ln_final(resid) @ W_U[:, t]`; an RMSNorm divides the whole sum by one scale per position
(`ln_final.hook_scale`, read from the cache) and `W_U` carries the final gain, so each write's share is
`write / scale @ W_U[:, t]` and the shares of a position sum exactly to its logit (tested). A logit
difference uses `W_U[:, target] - W_U[:, baseline]`.

Attribution patching (Nanda 2023; Syed et al. 2023): one clean forward, one corrupted forward and one
backward of the metric on the corrupted run give, for every patch at once, the first-order estimate
`metric(patched) - metric(corrupted) ~ sum over the patched piece of (clean - corrupted) * d metric /
d activation`. Sites, `by` and the frame are those of `interp.patch`; with `exact=True` the frame also
carries the exact patched value beside the estimate.
"""
from __future__ import annotations

from typing import Optional, Union

import pandas as pd
import torch
from jaxtyping import Int

from ._inputs import TextOrTokens, token_batch
from ._metrics import Metric, check_metric, differentiable_value, hide, refuse_nan
from ._model import model_name, n_heads, n_layers, require_hooks, str_tokens
from ._specs import Component
from .patching import (
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


def _components(model) -> list[tuple[str, int, int, str]]:
    """(label, layer, head, hook) of every write to the stream, in order: embedding, then each layer's heads and MLP."""
    out = [("embed", -1, -1, "hook_embed")]
    for l in range(n_layers(model)):
        out += [(Component("head", l, h).label, l, h, f"blocks.{l}.attn.hook_result") for h in range(n_heads(model))]
        out.append((Component("mlp", l).label, l, -1, f"blocks.{l}.hook_mlp_out"))
    return out


def _direction(model, ids: torch.Tensor, target, baseline) -> tuple[torch.Tensor, Optional[torch.Tensor], torch.Tensor]:
    """(target ids, baseline ids or None, directions [batch, pos, d_model]) for every scored position."""
    def as_ids(value, name):
        if isinstance(value, str):
            value = model.to_single_token(value)
        t = torch.as_tensor(value, device=ids.device)
        if t.is_floating_point() or t.is_complex() or t.dtype == torch.bool:
            raise ValueError(f"{name} must be token ids (integers) or a token string, got {t.dtype}")
        t = t.long()
        vocab = int(model.cfg.d_vocab)
        if t.numel() and (int(t.min()) < 0 or int(t.max()) >= vocab):
            raise ValueError(f"{name} ids must be in 0..{vocab - 1} (the model's vocabulary); got ids "
                             f"{int(t.min())}..{int(t.max())}")
        if t.dim() == 0:
            return t.expand(ids.shape).clone()
        if t.shape == ids.shape[-1:]:
            return t.expand(ids.shape).clone()
        if t.shape != ids.shape:
            raise ValueError(f"{name} must be one token, [pos] or [batch, pos] = {tuple(ids.shape)} ids; got shape {tuple(t.shape)}")
        return t

    if target is None:
        if ids.shape[1] < 2:
            raise ValueError("logit_attribution with target=None scores each position's next token: it needs at "
                             f"least 2 tokens, got {ids.shape[1]}; pass a target to score one token")
        tgt = ids[:, 1:]
        ids = ids[:, :-1]
    else:
        tgt = as_ids(target, "target")
    W_U = model.W_U
    direction = W_U.T[tgt]
    base = None
    if baseline is not None:
        base = as_ids(baseline, "baseline")[:, :tgt.shape[1]]
        direction = direction - W_U.T[base]
    return tgt, base, direction


def _check_rms_final(model) -> None:
    if not hasattr(model, "W_U") or getattr(model.cfg, "normalization_type", "RMS") not in ("RMS", "RMSPre", None):
        raise ValueError(f"logit_attribution needs an RMS final norm and W_U (Sprout); {model_name(model)} has a "
                         "LayerNorm, whose centring and bias are not a per-write share")


@torch.inference_mode()
def logit_attribution(model, text_or_tokens: TextOrTokens, target: Union[int, str, Int[torch.Tensor, "*batch pos"], None] = None,
                      baseline: Union[int, str, Int[torch.Tensor, "*batch pos"], None] = None) -> pd.DataFrame:
    """Each write to the residual stream's share of a position's logit (or logit difference).

    Args:
        model: a Sprout (RMS final norm, `W_U`).
        text_or_tokens: text, a list of texts (padded: rows come for real tokens only) or ids [pos] /
            [batch, pos].
        target: None (each position's actual next token; the last position is then not scored), one
            token (id or single-token text) for every position, or ids [pos] / [batch, pos].
        baseline: None, or tokens in the same forms: then the share of logit(target) - logit(baseline).

    Returns:
        One row per (seq, pos, component) of a real token (with target=None, one whose next token is
        real too): `seq`, `pos` (counting real tokens only), `token`, `target`, `baseline` (-1: none),
        `component` ("embed", "L{l}H{h}", "MLP{l}"), `kind` (embed / head / mlp), `layer` (-1 for the
        embedding), `head` (-1 unless a head), `attribution`. A position's rows sum to its logit (difference).

    Example:
        >>> dla = interp.logit_attribution(model, "When Mary and John went out, John gave a drink to", target=" Mary", baseline=" John")
    """
    _check_rms_final(model)
    ids, mask = token_batch(model, text_or_tokens)
    comps = _components(model)
    names = sorted({c[3] for c in comps}) + ["ln_final.hook_scale"]
    require_hooks(model, names)
    _, cache = model.run_with_cache(ids, names_filter=names, **masked(mask))
    tgt, base, direction = _direction(model, ids, target, baseline)
    T = tgt.shape[1]
    scale = cache["ln_final.hook_scale"][:, :T]  # [batch, pos, 1]
    shares = [_share(cache, hook, head, T) / scale for _, _, head, hook in comps]
    values = (torch.stack(shares) * direction).sum(-1)  # [component, batch, pos]
    frame = _dla_frame(model, ids, tgt, base, comps, values)
    if mask is None:
        return frame
    # real tokens only (a scored next token must be real too), at the positions they have alone
    real = mask.bool()[:, :T] & (mask.bool()[:, 1:T + 1] if target is None else True)
    where = (mask.cumsum(1) - 1)[:, :T].cpu()
    frame["pos"] = where.reshape(-1).repeat(len(comps)).numpy()
    return frame[real.reshape(-1).repeat(len(comps)).cpu().numpy()].reset_index(drop=True)


def _share(cache, hook: str, head: int, T: int) -> torch.Tensor:
    act = cache[hook][:, :T]
    return act[:, :, head] if head >= 0 else act


def _dla_frame(model, ids, tgt, base, comps, values) -> pd.DataFrame:
    C, B, T = values.shape
    kinds = ["embed" if l < 0 else ("head" if h >= 0 else "mlp") for _, l, h, _ in comps]
    rows = {
        "seq": torch.arange(B).repeat_interleave(T).repeat(C), "pos": torch.arange(T).repeat(B * C),
        "token": ids[:, :T].reshape(-1).repeat(C).cpu(), "target": tgt.reshape(-1).repeat(C).cpu(),
        "baseline": (base.reshape(-1).repeat(C).cpu() if base is not None else torch.full((B * T * C,), -1)),
    }
    frame = pd.DataFrame({k: v.numpy() for k, v in rows.items()})
    frame.insert(4, "component", [c[0] for c in comps for _ in range(B * T)])
    frame["kind"] = [k for k in kinds for _ in range(B * T)]
    frame["layer"] = [c[1] for c in comps for _ in range(B * T)]
    frame["head"] = [c[2] for c in comps for _ in range(B * T)]
    frame["attribution"] = values.reshape(-1).float().cpu().numpy()
    frame["token_str"] = str_tokens(model, ids[:, :T].reshape(-1).repeat(C).cpu())
    return frame


# ----------------------------------------------------------------------------- attribution patching


def _grad_run(model, tokens: torch.Tensor, metric: Metric, names: list[str], mask=None) -> tuple[dict, dict]:
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
        logits = model.run_with_hooks(tokens, fwd_hooks=[("hook_embed", start_graph)] + [(n, keep) for n in names],
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


def attribution_patch(model, clean: TextOrTokens, corrupted: TextOrTokens, metric: Metric, site: str = "resid_pre",
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
    layout = SITES[site][1]
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

