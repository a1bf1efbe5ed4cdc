"""Direct logit attribution: each write to the residual stream's share of a logit.

The final residual stream is a sum of writes: the embedding, every head's
`z W_O` (`attn.hook_result`) and every MLP's output. The logit of token t is
`ln_final(resid) @ W_U[:, t]`; an RMSNorm divides the whole sum by one scale per position
(`ln_final.hook_scale`, read from the cache) and `W_U` carries the final gain, so each write's share is
`write / scale @ W_U[:, t]` and the shares of a position sum exactly to its logit (tested). A logit
difference uses `W_U[:, target] - W_U[:, baseline]`.
"""
from __future__ import annotations

from typing import Optional, Union

import pandas as pd
import torch

from sprout.names import act_name

from .._core.inputs import TextOrTokens, masked, token_batch
from .._core.model import HookedModel, model_name, n_heads, n_layers, require_hooks, str_tokens
from .._core.specs import Component

FINAL_SCALE = act_name("scale", layer_type="ln_final")  # the final RMSNorm's one scale per position


def _components(model: HookedModel) -> list[tuple[str, int, int, str]]:
    """(label, layer, head, hook) of every write to the stream, in order: embedding, then each layer's heads and MLP."""
    out = [("embed", -1, -1, act_name("embed"))]
    for l in range(n_layers(model)):
        out += [(Component("head", l, h).label, l, h, act_name("result", l)) for h in range(n_heads(model))]
        out.append((Component("mlp", l).label, l, -1, act_name("mlp_out", l)))
    return out


def _direction(model: HookedModel, ids: torch.Tensor, target, baseline) -> tuple[torch.Tensor, Optional[torch.Tensor], torch.Tensor]:
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


def _check_rms_final(model: HookedModel) -> None:
    if not hasattr(model, "W_U") or getattr(model.cfg, "normalization_type", "RMS") not in ("RMS", "RMSPre", None):
        raise ValueError(f"logit_attribution needs an RMS final norm and W_U (Sprout); {model_name(model)} has a "
                         "LayerNorm, whose centring and bias are not a per-write share")


@torch.inference_mode()
def logit_attribution(model: HookedModel, data: TextOrTokens, target: Optional[Union[int, str, TextOrTokens]] = None,
                      baseline: Optional[Union[int, str, TextOrTokens]] = None) -> pd.DataFrame:
    """Each write to the residual stream's share of a position's logit (or logit difference).

    Args:
        model: a Sprout (RMS final norm, `W_U`).
        data: text, a list of texts (padded: rows come for real tokens only) or ids [pos] /
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
        >>> import sprout, interp
        >>> model = sprout.load("gpt-4")
        >>> text = "Zorbin Plax met Mira. Then Zorbin Pl"
        >>> dla = interp.logit_attribution(model, text, target="ax")
        >>> last = dla[dla["pos"] == dla["pos"].max()]  # the shares of the last position's logit of "ax"
        >>> logit = model(text)[0, -1, model.to_single_token("ax")].item()
        >>> bool(abs(last["attribution"].sum() - logit) < 1e-3)
        True
    """
    _check_rms_final(model)
    ids, mask = token_batch(model, data)
    comps = _components(model)
    names = sorted({c[3] for c in comps}) + [FINAL_SCALE]
    require_hooks(model, names)
    _, cache = model.run_with_cache(ids, names_filter=names, **masked(mask))
    tgt, base, direction = _direction(model, ids, target, baseline)
    T = tgt.shape[1]
    scale = cache[FINAL_SCALE][:, :T]  # [batch, pos, 1]
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


def _dla_frame(model: HookedModel, ids, tgt, base, comps, values) -> pd.DataFrame:
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
