"""Residual-stream growth: the RMS of the stream per token at every layer boundary, streamed.

RMS(x) = sqrt(mean_i x_i^2) over d_model, one number per token. The stream is read after the
embedding (`blocks.0.hook_resid_pre`), after each attention (`resid_mid`) and after each block
(`resid_post`); what each block writes (`hook_attn_out`, `hook_mlp_out`) is compared with the stream
it is added to. Batches are reduced as they come: a running sum for the means and, for the quantiles,
a fixed log-spaced histogram (`LogHistogram`), so memory does not grow with the number of tokens.
"""
from __future__ import annotations

import math
import numbers
from typing import Optional

import pandas as pd
import torch
from jaxtyping import Float

from sprout.names import act_name

from .._core.batching import TextOrTokens, batches, token_rows
from .._core.model import HookedModel, n_layers, require_hooks


class LogHistogram:
    """Counts of positive values in `n_bins` log-spaced bins on [lo, hi]: quantiles in constant memory.

    A quantile is read by linear interpolation (in log space) inside the bin that holds it, so its
    relative error is at most one bin width, (hi / lo) ** (1 / n_bins) - 1 (0.58% by default). Values
    outside [lo, hi] are counted in the edge bins; the exact min and max are kept and bound every answer.
    """

    def __init__(self, lo: float = 1e-6, hi: float = 1e6, n_bins: int = 4800) -> None:
        self.log_lo, self.log_hi, self.n_bins = math.log(lo), math.log(hi), n_bins
        self.counts = torch.zeros(n_bins, dtype=torch.float64)
        self.min, self.max, self.n = math.inf, -math.inf, 0
        self.n_nan = 0  # NaN values (from NaN weights) make every quantile NaN, like the mean

    def add(self, values: Float[torch.Tensor, "..."]) -> None:
        v = values.detach().double().reshape(-1).cpu()
        nan = v.isnan()
        self.n_nan += int(nan.sum())
        v = v[~nan]
        if v.numel() == 0:
            return
        pos = (v.clamp(min=1e-300).log() - self.log_lo) / (self.log_hi - self.log_lo) * self.n_bins
        self.counts += torch.bincount(pos.clamp(0, self.n_bins - 1).floor().long(), minlength=self.n_bins).double()
        self.min, self.max = min(self.min, v.min().item()), max(self.max, v.max().item())
        self.n += v.numel()

    def quantile(self, q: float) -> float:
        """The q-quantile; NaN when no values came or any was NaN (as the mean of those values is)."""
        if self.n == 0 or self.n_nan:
            return float("nan")
        cum = self.counts.cumsum(0)
        target = q * self.n
        b = int(torch.searchsorted(cum, torch.tensor([target], dtype=torch.float64)).clamp(max=self.n_bins - 1))
        before = cum[b - 1].item() if b > 0 else 0.0
        frac = (target - before) / max(self.counts[b].item(), 1e-300)
        log_v = self.log_lo + (b + min(max(frac, 0.0), 1.0)) * (self.log_hi - self.log_lo) / self.n_bins
        return min(max(math.exp(log_v), self.min), self.max)


def rms(x: Float[torch.Tensor, "*batch d_model"]) -> Float[torch.Tensor, "*batch"]:
    """Per-token RMS over the last dimension: [..., d_model] -> [...] (float32)."""
    return x.float().pow(2).mean(-1).sqrt()


def rms_sites(model: HookedModel, include_mid: bool = True, include_writes: bool = True) -> list[dict]:
    """What `residual_rms` reads: hook name, kind, depth, and (for writes) the stream written to."""
    first = act_name("resid_pre", 0)
    sites = [dict(site=first, kind="stream", layer=0.0, block_in=first)]
    for l in range(n_layers(model)):
        # the stream entering block l is resid_pre l, the same tensor as resid_post l - 1: read it once
        pre = first if l == 0 else act_name("resid_post", l - 1)
        mid = act_name("resid_mid", l)
        if include_writes:
            sites.append(dict(site=act_name("attn_out", l), kind="attn_out", layer=l + 0.5, adds_to=pre))
        if include_mid:
            sites.append(dict(site=mid, kind="stream", layer=l + 0.5, block_in=pre))
        if include_writes:
            sites.append(dict(site=act_name("mlp_out", l), kind="mlp_out", layer=l + 1.0, adds_to=mid))
        sites.append(dict(site=act_name("resid_post", l), kind="stream", layer=l + 1.0, block_in=pre))
    return sites


def _check_quantiles(quantiles) -> None:
    if isinstance(quantiles, (str, bytes)) or not hasattr(quantiles, "__len__") or len(quantiles) != 3:
        raise ValueError(f"quantiles must be three levels (reported as q05, q50, q95), got {quantiles!r}")
    for q in quantiles:
        if isinstance(q, bool) or not isinstance(q, numbers.Real) or not 0 <= float(q) <= 1:  # NaN fails 0 <= q
            raise ValueError(f"quantiles must be numbers in [0, 1], got {q!r} in {tuple(quantiles)}")


@torch.inference_mode()
def residual_rms(model: HookedModel, data: TextOrTokens, batch_size: int = 8, seq_len: Optional[int] = None,
                 include_mid: bool = True, include_writes: bool = True,
                 quantiles: tuple = (0.05, 0.5, 0.95)) -> pd.DataFrame:
    """RMS of the residual stream per token at every layer boundary, and of what each block writes.

    Args:
        model: a hooked model.
        data: held-out text(s) or ids [pos] / [batch, pos]; cut into windows of `seq_len`
            tokens (default the model's context), run `batch_size` windows at a time.
        include_mid: also read the stream after each attention (`resid_mid`).
        include_writes: also read the attention and MLP outputs (needs `resid_mid` for the MLP's ratio).
        quantiles: three quantile levels, reported as q05 / q50 / q95 (from a log histogram, relative
            error < 0.6%).

    Returns:
        One row per site, in depth order: `site` (hook name), `kind` ("stream", "attn_out" or
        "mlp_out"), `layer` (0 = after the embedding, l = after block l, l - 0.5 = after block l's
        attention; a write sits at the depth of the stream it produces), `mean` (mean over tokens of the
        per-token RMS), `q05`, `q50`, `q95`, `growth` (stream rows: mean / mean of the stream entering
        that block, so after block l it is block l's growth factor; NaN for the embedding and for
        writes), `ratio` (writes: mean over tokens of RMS(write) / RMS(stream it is added to); NaN for
        the stream), `n_tokens`.

    Example:
        >>> import torch, interp
        >>> from sprout import Sprout, SproutConfig
        >>> model = Sprout(SproutConfig(vocab_size=64, context=16, n_layer=2, n_head=2, d_model=32, d_ff=64))
        >>> df = interp.residual_rms(model, torch.randint(0, 64, (4, 16)))
        >>> df[df.kind == "stream"].layer.tolist()
        [0.0, 0.5, 1.0, 1.5, 2.0]
    """
    _check_quantiles(quantiles)
    sites = rms_sites(model, include_mid, include_writes)
    names = list(dict.fromkeys(n for s in sites for n in (s.get("block_in"), s.get("adds_to"), s["site"]) if n))
    require_hooks(model, names)
    hist = {s["site"]: LogHistogram() for s in sites}
    total = {name: 0.0 for name in names}
    ratio = {s["site"]: 0.0 for s in sites}
    n = 0
    for _, ids in batches(token_rows(model, data, seq_len), batch_size, device=model.cfg.device):
        _, cache = model.run_with_cache(ids, names_filter=names)
        r = {name: rms(cache[name]) for name in names}  # [batch, pos] each
        for name in names:
            total[name] += r[name].double().sum().item()
        for s in sites:
            v = r[s["site"]]
            hist[s["site"]].add(v)
            if "adds_to" in s:
                ratio[s["site"]] += (v / r[s["adds_to"]]).double().sum().item()
        n += ids.numel()
        del cache
    if n == 0:
        raise ValueError("no tokens to measure")
    mean = {name: total[name] / n for name in total}
    rows = []
    for s in sites:
        h = hist[s["site"]]
        is_stream = s["kind"] == "stream"
        rows.append(dict(
            site=s["site"], kind=s["kind"], layer=s["layer"], mean=mean[s["site"]],
            q05=h.quantile(quantiles[0]), q50=h.quantile(quantiles[1]), q95=h.quantile(quantiles[2]),
            growth=mean[s["site"]] / mean[s["block_in"]] if is_stream and s["layer"] > 0 else float("nan"),
            ratio=float("nan") if is_stream else ratio[s["site"]] / n, n_tokens=n,
        ))
    return pd.DataFrame(rows)
