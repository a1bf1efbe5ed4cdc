"""What a patching metric must return, checked once for every patching analysis (patch, attribution, path patching).

A metric maps logits [batch, pos, d_vocab] to a real number: a scalar, or one value per batch row
([batch], averaged). Anything else (a str, None, a complex number, another shape) is refused naming the
metric. Attribution patching differentiates the metric, so there it must also be a float tensor that
depends on the logits through differentiable operations (not an accuracy, an argmax or a constant).

Positions the metric must not read (padding, and positions outside `logit_positions`) hold NaN in the
logits it sees; a metric that returns NaN there is refused, saying which positions it read.
"""
from __future__ import annotations

import math
import numbers
import warnings
from typing import Callable, Iterable, Optional, Sequence

import numpy as np
import torch
from jaxtyping import Float, Int

Metric = Callable[[Float[torch.Tensor, "batch pos d_vocab"]], Float[torch.Tensor, "*batch"]]  # a scalar or [batch]


def metric_name(metric: object) -> str:
    name = getattr(metric, "__qualname__", None) or getattr(metric, "__name__", None)
    return repr(name) if name else repr(metric)


def check_metric(metric: object) -> None:
    if not callable(metric):
        raise TypeError(f"the metric must be a function of the logits [batch, pos, d_vocab], got {type(metric).__name__}")


def _describe(out) -> str:
    if isinstance(out, torch.Tensor):
        return f"a {out.dtype} tensor of shape {tuple(out.shape)}"
    return f"{type(out).__name__} {out!r}"[:80]


def as_value(metric: object, out: object, batch: int) -> Float[torch.Tensor, ""]:
    """The metric's output as a 0-d real tensor (one value per row is averaged), or an error naming the metric."""
    must = "a real number (a float, or a tensor of one value or one per batch row)"
    if isinstance(out, (torch.Tensor, np.ndarray)) and not isinstance(out, torch.Tensor):
        out = torch.as_tensor(out)
    if isinstance(out, numbers.Real) and not isinstance(out, torch.Tensor):
        out = torch.tensor(float(out))
    if not isinstance(out, torch.Tensor) or out.is_complex():
        raise TypeError(f"the metric {metric_name(metric)} must return {must}; it returned {_describe(out)}")
    if out.dim() == 1 and out.shape[0] == batch:
        return out.double().mean() if not out.is_floating_point() else out.mean()
    if out.dim() != 0:
        raise ValueError(f"the metric must return a scalar or one value per batch row ([{batch}]); "
                         f"it returned shape {tuple(out.shape)}")
    return out


def metric_value(metric: Metric, logits: Float[torch.Tensor, "batch pos d_vocab"]) -> float:
    """The metric of logits [batch, pos, d_vocab] as a float: a scalar, or the mean of one value per batch row."""
    return float(as_value(metric, metric(logits), logits.shape[0]))


def differentiable_value(metric: Metric, logits: Float[torch.Tensor, "batch pos d_vocab"]) -> Float[torch.Tensor, ""]:
    """The metric as a 0-d float tensor with a gradient back to the logits, for attribution patching."""
    out = metric(logits)
    value = as_value(metric, out, logits.shape[0])
    if not (isinstance(out, torch.Tensor) and out.is_floating_point() and value.requires_grad):
        raise TypeError(f"attribution_patch differentiates the metric, so {metric_name(metric)} must return a float "
                        "tensor computed from the logits by differentiable operations (e.g. a logit difference or a "
                        f"log probability); it returned {_describe(out)} without a gradient. An accuracy, an argmax "
                        "or a constant has none: measure those with interp.patch")
    return value


def hide(logits: Float[torch.Tensor, "batch pos d_vocab"], mask: Optional[Int[torch.Tensor, "mask_batch pos"]]
         ) -> Float[torch.Tensor, "batch pos d_vocab"]:
    """Logits [n * batch, pos, d_vocab] with NaN at the padded positions of mask [batch, pos] (None: as they are)."""
    if mask is None:
        return logits
    keep = mask.bool().repeat(logits.shape[0] // mask.shape[0], 1)[..., None]
    return logits.masked_fill(~keep, float("nan"))


def refuse_nan(values: Iterable[float], logit_positions: Optional[Sequence[int]] = None,
               mask: Optional[Int[torch.Tensor, "batch pos"]] = None) -> None:
    """A NaN metric where NaN stands for logits it must not read: say which."""
    if not any(math.isnan(v) for v in values):
        return
    if mask is not None:
        raise ValueError("the metric returned NaN: it reads logits at padded positions (NaN there; rows are padded to "
                         f"the longest text, real tokens per row {mask.sum(1).tolist()}); read each row's real "
                         "positions only, pad on the left (padding_side) so the last position is real, or pass texts "
                         "of equal token length")
    if logit_positions is not None:
        raise ValueError(f"the metric returned NaN with logit_positions={logit_positions}: it reads logits at "
                         "other positions (NaN there); pass those positions too, or no logit_positions")


def degenerate(clean_value: float, corrupted_value: float, what: str = "clean and corrupted") -> bool:
    """True, with a warning, when the metric cannot tell the two runs apart (recovered is then undefined)."""
    if clean_value != corrupted_value:
        return False
    warnings.warn(f"the metric is {clean_value:g} on both {what} runs: the corruption changes nothing it measures, so "
                  "every 'recovered' is NaN and no patch can be told apart; use inputs (or a metric) that differ",
                  RuntimeWarning, stacklevel=3)
    return True
