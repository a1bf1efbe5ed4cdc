"""Causal check of a head: knock it out through `hook_z` and see how much the loss moves.

A head's output is z_h W_O^h, so setting its z (`blocks.{l}.attn.hook_z`, [batch, pos, head, d_head])
to zero is the same as zeroing its d_head columns of W_O (tested). Mean ablation puts the head's mean
z over the data in its place instead, which keeps the average contribution and removes only what
depends on the input. A head that scores high as a detector but whose ablation moves the loss by
less than `min_delta` is flagged `no_effect`: its pattern looks right and nothing downstream uses it.
"""
from __future__ import annotations

from typing import Optional, Sequence, Union

import pandas as pd
import torch

from sprout.names import act_name

from .._core.batching import TextOrTokens, batches, token_rows
from .._core.loss import hooked_loss
from .._core.model import HookedModel, require_hooks
from .._core.specs import Head, as_heads
from ..data import repeated_tokens

METHODS = ("zero", "mean")


def _as_heads(model: HookedModel, heads, top_k: Optional[int]) -> tuple[list[tuple[int, int]], dict]:
    scores = {}
    if isinstance(heads, pd.DataFrame):
        missing = {"layer", "head"} - set(heads.columns)
        if missing:
            raise ValueError(f"the heads DataFrame needs columns 'layer' and 'head'; missing {sorted(missing)}")
        if "score" in heads.columns:
            heads = heads.sort_values("score", ascending=False, kind="stable")
            scores = {(int(r.layer), int(r.head)): float(r.score) for r in heads.itertuples()}
        heads = list(zip(heads["layer"], heads["head"]))
    if top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1):
        raise ValueError(f"top_k must be None or an integer >= 1, got {top_k!r}")
    heads = as_heads(model, heads, "heads to ablate")[:top_k]
    scores = {Head(*key): v for key, v in scores.items()}
    return heads, scores


def _ablate_hook(heads_in_layer: list[int], value: Optional[torch.Tensor]):
    def hook(z, hook):  # z [batch, pos, head, d_head]
        z = z.clone()
        for h in heads_in_layer:
            z[:, :, h] = 0.0 if value is None else value[h]
        return z
    return hook


def ablation_hooks(group: Sequence[tuple[int, int]], means: Optional[dict[int, torch.Tensor]] = None) -> list:
    """The (hook name, hook) pairs that ablate every (layer, head) of `group` at once: z set to 0, or to
    `means[layer]` [head, d_head] where given."""
    by_layer: dict[int, list[int]] = {}
    for l, h in group:
        by_layer.setdefault(l, []).append(h)
    return [(act_name("z", l), _ablate_hook(hs, (means or {}).get(l))) for l, hs in by_layer.items()]


@torch.inference_mode()
def _mean_z(model: HookedModel, rows, layers, batch_size) -> dict[int, torch.Tensor]:
    names = [act_name("z", l) for l in layers]
    total: dict[int, torch.Tensor] = {}
    n = 0
    for _, ids in batches(rows, batch_size, device=model.cfg.device):
        _, cache = model.run_with_cache(ids, names_filter=names)
        for l, name in zip(layers, names):
            total[l] = total.get(l, 0) + cache[name].double().sum((0, 1))  # [head, d_head]
        n += ids.numel()
    return {l: (t / n).to(model.cfg.dtype) for l, t in total.items()}


def ablate_heads(model: HookedModel, heads: Union[list, pd.DataFrame], data: Optional[TextOrTokens] = None, *,
                 method: str = "zero", top_k: Optional[int] = None, together: bool = True,
                 half_len: int = 32, n_seqs: int = 16, token_range: Optional[tuple] = None, seed: int = 0,
                 batch_size: int = 8, min_delta: float = 0.01) -> pd.DataFrame:
    """Loss with each head (and the chosen heads together) ablated, against the clean loss.

    Args:
        model: a hooked model with `blocks.{l}.attn.hook_z`.
        heads: heads as (layer, head) pairs of integers, "L1H2" or `interp.Head`s (one, or a list), or a
            `head_scores` frame (taken best first).
        data: what to score on; by default the seeded repeated random tokens of `head_scores`
            (same `half_len`, `n_seqs`, `token_range`, `seed`), where the loss is measured on the
            repeated half only (predictions of tokens 2..half_len of the second copy). On user text it
            is the loss over all positions.
        method: "zero" (z of the head set to 0) or "mean" (to its mean over the data).
        top_k: use only the first k heads.
        together: add a row with all the chosen heads ablated at once (when there are several).
        min_delta: |delta| below this many nats is flagged `no_effect`.

    Returns:
        One row per head, then the joint row: `layer`, `head` (-1 in the joint row), `label`
        ("L1H2", or "L1H2+L2H0"), `method`, `score` (from the frame, else NaN), `loss_clean`,
        `loss_ablated`, `delta` (ablated - clean, nats per token), `no_effect`.

    Example:
        >>> import torch, interp
        >>> from sprout import Sprout, SproutConfig
        >>> model = Sprout(SproutConfig(vocab_size=64, context=16, n_layer=2, n_head=2, d_model=32, d_ff=64))
        >>> df = interp.ablate_heads(model, [(0, 0), (1, 1)], half_len=8, n_seqs=4)
        >>> df.label.tolist()
        ['L0H0', 'L1H1', 'L0H0+L1H1']
    """
    if method not in METHODS:
        raise ValueError(f"unknown ablation method {method!r}; choose one of {list(METHODS)}")
    heads, scores = _as_heads(model, heads, top_k)
    layers = sorted({l for l, _ in heads})
    require_hooks(model, [act_name("z", l) for l in layers])
    if data is None:
        half_len = min(half_len, int(model.cfg.n_ctx) // 2)  # clipped to the context, as in head_scores
        rows, loss_from = token_rows(model, repeated_tokens(model, half_len, n_seqs, token_range, seed)), half_len
    else:
        rows, loss_from = token_rows(model, data), 0
    means = _mean_z(model, rows, layers, batch_size) if method == "mean" else {}
    clean = hooked_loss(model, rows, batch_size, loss_from, [])
    groups = [[lh] for lh in heads] + ([heads] if together and len(heads) > 1 else [])
    out = []
    for group in groups:
        ablated = hooked_loss(model, rows, batch_size, loss_from, ablation_hooks(group, means))
        single = len(group) == 1
        out.append(dict(
            layer=group[0][0] if single else -1, head=group[0][1] if single else -1,
            label="+".join(Head(l, h).label for l, h in group), method=method,
            score=scores.get(group[0], float("nan")) if single else float("nan"),
            loss_clean=clean, loss_ablated=ablated, delta=ablated - clean,
            no_effect=abs(ablated - clean) < min_delta,
        ))
    return pd.DataFrame(out)
