"""Activation patching sweeps: put one clean activation into the corrupted run, see how far the metric comes back.

The convention is TransformerLens' `patching.get_act_patch_*` (denoising): the model runs on the
corrupted tokens, one piece of one activation (a layer, a head, a position, a head at a position) is
replaced by its value on the clean tokens, and the metric is read from the patched logits. The values
equal TransformerLens' within float rounding (tested against `get_act_patch_*`).

What differs is the cost: many patches share one forward (the batched engine, `interp._core.patch_engine`).

A metric maps logits [batch, pos, d_vocab] to a scalar, or to one value per batch row ([batch]),
which is averaged; anything else is refused naming the metric (`_metrics`). Texts of unequal token
length are padded: every forward gets their attention mask, and the metric sees NaN at padded
positions (a metric that reads them is refused). Clean equal to corrupted is an error; a metric equal
on both runs gets a warning and `frame.attrs["degenerate"] = True`.
"""

from __future__ import annotations

from typing import Optional, Sequence, Union

import pandas as pd
import torch

from .._core.inputs import TextOrTokens
from .._core.metrics import Metric, check_metric
from .._core.model import HookedModel
from .._core.patch_engine import (
    SITES,
    baselines,
    check_logit_positions,
    check_site,
    clean_and_corrupted,
    patch_frame,
    patch_values,
    patches,
)

__all__ = ["SITES", "patch", "patch_tensor"]


def patch(model: HookedModel, clean: TextOrTokens, corrupted: TextOrTokens, metric: Metric, site: str = "resid_pre", by: str = "position",
          batch_size: Optional[int] = None, logit_positions: Optional[Union[int, Sequence[int]]] = None) -> pd.DataFrame:
    """Activation patching sweep (denoising): the metric with one clean piece of `site` in the corrupted run.

    Args:
        model: a hooked model (Sprout, the walkthrough GPT at a step with the site's hooks).
        clean, corrupted: token ids [batch, pos] (or [pos], text, or a list of texts: padded, and the
            metric then sees NaN at padded positions) of the same shape and padding.
        metric: logits [batch, pos, d_vocab] -> a scalar, or [batch] (averaged over rows).
        site: one of `SITES`: resid_pre, attn_out, mlp_out, z, q, k, v, pattern.
        by: "layer" (the whole activation), "position", "head" (all positions), or "head_position";
            a pattern's position is its destination (query) row, as in TransformerLens.
        batch_size: patches sharing one forward (default: as many as 256 MB of logits allow).
        logit_positions: the positions whose logits the metric reads (an int or a list, e.g. -1): only
            those are unembedded in the sweep's forwards (the unembedding is a large share of their cost)
            and the metric sees NaN everywhere else; a metric that then returns NaN is refused. The
            metric still receives logits [batch, pos, d_vocab], so it needs no change.

    Returns:
        One row per patch (columns in `patch_frame`); `metric` is the patched value, equal to
        TransformerLens' `patching.get_act_patch_<site>_<by>` at that index. `frame.attrs["degenerate"]`
        is True (with a warning) when the metric is the same on clean and corrupted.

    Example:
        >>> import sprout, interp
        >>> model = sprout.load("gpt-4")
        >>> clean = interp.repeated_tokens(model, half_len=16, n_seqs=4)            # random tokens, twice
        >>> corrupted = interp.repeated_tokens(model, half_len=16, n_seqs=4, seed=1)  # nothing to copy
        >>> def metric(logits):  # mean log p of each second-copy token
        ...     return logits[:, 16:-1].log_softmax(-1).gather(-1, clean[:, 17:, None]).mean()
        >>> frame = interp.patch(model, clean, corrupted, metric, site="z", by="head")
        >>> sorted(frame.sort_values("recovered").label.iloc[-3:])  # the heads that restore copying
        ['L0H1', 'L3H1', 'L3H2']
    """
    check_site(model, site, by)
    check_metric(metric)
    clean, corrupted, mask = clean_and_corrupted(model, clean, corrupted)
    todo = patches(model, site, by, corrupted.shape[1])
    positions = check_logit_positions(logit_positions, corrupted.shape[1])
    values = patch_values(model, clean, corrupted, metric, site, todo, batch_size, positions, mask)
    clean_value, corrupted_value = baselines(model, clean, corrupted, metric, mask)
    return patch_frame(todo, site, {"metric": values}, clean_value, corrupted_value)


def patch_tensor(frame: pd.DataFrame, column: str = "metric") -> torch.Tensor:
    """A patch frame's values in TransformerLens' layout: [layer], [layer, pos], [layer, head], or
    [layer, pos, head] ([layer, head, pos] for pattern)."""
    axes = [a for a in ("layer", "pos", "head") if (frame[a] >= 0).any()]
    if (frame["site"] == "pattern").all() and axes == ["layer", "pos", "head"]:
        axes = ["layer", "head", "pos"]
    shape = [int(frame[a].max()) + 1 for a in axes]
    out = torch.full(shape, float("nan"))
    index = tuple(torch.tensor(frame[a].to_numpy()) for a in axes)
    out[index] = torch.tensor(frame[column].to_numpy(), dtype=out.dtype)
    return out

