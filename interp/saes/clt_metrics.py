"""How good a cross-layer transcoder is: each MLP output's reconstruction, sparsity per layer and in all, and
the model's loss with every MLP replaced at once.

`clt_metrics(model, clt, data)` streams the data in batches; per batch one clean forward caching every MLP's
input and output, one spliced forward (each MLP output replaced by the CLT's reconstruction, the features of
layer l read from the *spliced* model's own stream at layer l, as a replacement model runs) and two ablated
ones (every MLP output zeroed; every MLP output replaced by its mean over the data, measured in a first
pass). A per-layer transcoder set compares on the same footing through `from_transcoders` (a CLT whose
features write only to their own layer: the same outputs). Columns, one row per output layer and a row
`layer == "all"`:

- `explained_variance` / `fvu`: of that MLP's output, from the clean inputs (all: pooled over layers);
- `l0`: features read at that layer firing per token (all: summed over layers, the L0 per token to report
  beside every score); `dead_fraction`: features read there that never fire on the data (all: of every feature;
  a padded per-layer set's padding is not counted);
- on the "all" row: `ce_clean`, `ce_spliced`, `ce_zero`, `ce_mean` (mean next-token cross-entropy, nats),
  `ce_loss_recovered` (against zero ablation) and `ce_loss_recovered_mean` (against mean ablation), their
  standard errors `ce_loss_recovered_se` and `ce_loss_recovered_mean_se` (each window a unit, as
  `interp.sae_metrics` computes them: a lower bound), `kl_spliced`, `n_tokens`.

`clt_dead_fractions(model, clt, data)` counts only the features that never fire, from clean forwards: for the
long text that dead features are counted over.
"""
from __future__ import annotations

from typing import Callable, Optional, Sequence

import pandas as pd
import torch
import torch.nn.functional as F

from .._core.batching import TextOrTokens, batches, token_rows
from .._core.model import HookedModel
from .clt import CrossLayerTranscoder
from .metrics import ratio_se, window_ce
from .sae import Transcoder
from .settings import COUNT, check_args


def from_transcoders(transcoders: Sequence[Transcoder]) -> CrossLayerTranscoder:
    """A per-layer set (one threshold-kind or ReLU-free JumpReLU transcoder per block) as a CLT whose features
    write only to their own layer: the same activations and outputs. Transcoders of different widths are padded
    to the widest with latents that never fire (zero encoder, bias and decoder: JumpReLU needs pre > 0); their
    own widths are kept in `info["padded_widths"]`, and `clt_metrics` / `clt_dead_fractions` count only those latents."""
    tcs = list(transcoders)
    if not tcs or not all(isinstance(t, Transcoder) for t in tcs):
        raise TypeError("from_transcoders takes one interp.Transcoder per block, in block order")
    if [t.layer for t in tcs] != list(range(len(tcs))):
        raise ValueError(f"from_transcoders needs transcoders for blocks 0..{len(tcs) - 1} in order; got blocks "
                         f"{[t.layer for t in tcs]}")
    if any(t.kind not in ("jumprelu", "batchtopk", "matryoshka") for t in tcs):
        raise ValueError("from_transcoders: a CLT fires by a threshold; these transcoders are "
                         f"{sorted({t.kind for t in tcs})} (threshold kinds only)")
    t0, width = tcs[0], max(t.d_sae for t in tcs)
    clt = CrossLayerTranscoder(len(tcs), t0.d_in, width, t0.d_out, kind="jumprelu", skip=any(t.skip for t in tcs),
                               dtype=t0.W_enc.dtype)
    with torch.no_grad():
        for p in (clt.W_enc, clt.b_enc, clt.threshold):
            p.zero_()
        for l, t in enumerate(tcs):
            w = t.d_sae
            clt.W_enc[l, :, :w], clt.b_enc[l, :w], clt.b_dec[l] = t.W_enc, t.b_enc, t.b_dec
            clt.threshold[l, :w] = t.threshold if t.threshold is not None else 0.0
            clt.W_dec[l].zero_()
            clt.W_dec[l][:w, 0] = t.W_dec
            if clt.W_skip is not None:
                clt.W_skip[l] = t.W_skip if t.W_skip is not None else 0.0
    clt.model_fingerprint, clt.model_config = t0.model_fingerprint, t0.model_config
    clt.info = {"from_transcoders": [t.info.get("settings", {}) for t in tcs], "padded_widths": [t.d_sae for t in tcs]}
    return clt.eval()


def _own_latents(clt: CrossLayerTranscoder) -> torch.Tensor:
    """[n_layers, d_sae]: True for the CLT's own latents (a padded per-layer set's padding is not: `from_transcoders`).

    Raises:
        ValueError: `info["padded_widths"]` is not one width in 1..d_sae per layer.
    """
    widths = clt.info.get("padded_widths") or [clt.d_sae] * clt.n_layers
    if len(widths) != clt.n_layers or not all(isinstance(w, int) and 0 < w <= clt.d_sae for w in widths):
        raise ValueError(f"the CLT's info['padded_widths'] must hold one width in 1..{clt.d_sae} per layer "
                         f"({clt.n_layers}); got {widths!r}")
    return torch.arange(clt.d_sae)[None, :] < torch.tensor(widths)[:, None]


def _dead(clt: CrossLayerTranscoder, fired: torch.Tensor) -> tuple[list[float], float]:
    """The share of each layer's own latents, and of all of them, that never fired (`fired` [n_layers, d_sae])."""
    own = _own_latents(clt)
    per = [1 - fired[l][own[l]].double().mean().item() for l in range(clt.n_layers)]
    return per, 1 - fired[own].double().mean().item()


def _splice_hooks(clt: CrossLayerTranscoder, store: list) -> list[tuple[str, Callable]]:
    """Hooks that read each layer's features from the live stream and replace each MLP output by the CLT's."""
    hooks: list[tuple[str, Callable]] = []
    xs: list = [None] * clt.n_layers

    def reader(l):
        def hook(act, hook):
            xs[l] = act
            store[l] = clt.encode(l, act)
        return hook

    def writer(o):
        def hook(act, hook):
            out = clt.decode_layer(o, store)
            skip = clt.skip_term(o, xs[o])
            return (out if skip is None else out + skip).to(act.dtype)
        return hook

    for l in range(clt.n_layers):
        hooks += [(clt.hook_names[l], reader(l)), (clt.hook_names_out[l], writer(l))]
    return hooks


def _replace_all(clt: CrossLayerTranscoder, values: list) -> list[tuple[str, Callable]]:
    return [(clt.hook_names_out[l], (lambda v: lambda act, hook: v.expand_as(act).to(act.dtype))(v))
            for l, v in enumerate(values)]


@torch.no_grad()
def _means(model: HookedModel, clt: CrossLayerTranscoder, rows, batch_size: int) -> list[torch.Tensor]:
    """Each MLP output's mean over every token of the data [d_out] (mean ablation's values)."""
    sums, n = [torch.zeros(clt.d_out, dtype=torch.float64) for _ in range(clt.n_layers)], 0
    for _, ids in batches(rows, batch_size, device=model.cfg.device):
        _, cache = model.run_with_cache(ids, names_filter=lambda name: name in clt.hook_names_out)
        for l, h in enumerate(clt.hook_names_out):
            sums[l] += cache[h].double().sum((0, 1)).cpu()
        n += ids.numel()
    return [(s / n).to(clt.W_enc.dtype) for s in sums]


def _check(name: str, model: HookedModel, clt, batch_size: int) -> None:
    check_args(name, batch_size=(batch_size, *COUNT))
    if not isinstance(clt, CrossLayerTranscoder):
        raise TypeError(f"{name} takes an interp.CrossLayerTranscoder (a per-layer set: from_transcoders(list)), "
                        f"got {type(clt).__name__}")
    clt.check_model(model)


@torch.no_grad()
def clt_metrics(model: HookedModel, clt: CrossLayerTranscoder, data: TextOrTokens, batch_size: int = 8,
                seq_len: Optional[int] = None) -> pd.DataFrame:
    """The CLT's metrics on `data` (text, texts or ids), one row per output layer and one for all (see the module).

    Example:
        >>> interp.saes.clt_metrics(model, clt, interp.held_out_stories(20_000))   # doctest: +SKIP
    """
    _check("clt_metrics", model, clt, batch_size)
    rows = token_rows(model, data, seq_len)
    means = _means(model, clt, rows, batch_size)
    L = clt.n_layers
    sse, tss = torch.zeros(L, dtype=torch.float64), torch.zeros(L, dtype=torch.float64)
    sum_y = torch.zeros(L, clt.d_out, dtype=torch.float64)
    fires, fired = torch.zeros(L, clt.d_sae, dtype=torch.float64), torch.zeros(L, clt.d_sae, dtype=torch.bool)
    per_window: dict[str, list] = dict(clean=[], spliced=[], zero=[], mean=[])  # each window's summed CE
    lengths = []
    kl, n, n_pred = 0.0, 0, 0
    for _, ids in batches(rows, batch_size, device=model.cfg.device):
        names = clt.hook_names + clt.hook_names_out
        logits, cache = model.run_with_cache(ids, names_filter=lambda name: name in names)
        x = torch.stack([cache[h] for h in clt.hook_names]).to(clt.W_enc.dtype)
        y = torch.stack([cache[h] for h in clt.hook_names_out]).double()
        acts = clt.encode_all(x)
        err = (clt(x).double() - y).pow(2).sum(-1)  # [L, batch, pos]
        sse += err.sum((1, 2)).cpu()
        tss += y.pow(2).sum((1, 2, 3)).cpu()
        sum_y += y.sum((1, 2)).cpu()
        a = torch.stack(acts) > 0
        fires += a.sum((1, 2)).double().cpu()
        fired |= a.any(1).any(1).cpu()
        pred = torch.ones(ids.shape[0], ids.shape[1] - 1, dtype=torch.bool, device=ids.device)
        log_p = F.log_softmax(logits.float(), -1)
        store: list = [None] * L
        outs = {"clean": logits, "spliced": model.run_with_hooks(ids, fwd_hooks=_splice_hooks(clt, store)),
                "zero": model.run_with_hooks(ids, fwd_hooks=_replace_all(clt, [torch.zeros_like(m) for m in means])),
                "mean": model.run_with_hooks(ids, fwd_hooks=_replace_all(clt, means))}
        for key, out in outs.items():
            log_q = log_p if key == "clean" else F.log_softmax(out.float(), -1)
            per_window[key].append(window_ce(ids, pred, log_q))
            if key == "spliced":
                kl += (log_p.exp() * (log_p - log_q)).sum(-1).double().sum().item()
        n += ids.numel()
        n_pred += ids.shape[0] * (ids.shape[1] - 1)
        lengths += [ids.shape[1]] * ids.shape[0]
    tss = tss - sum_y.pow(2).sum(-1) / n  # sum |y - mean|^2 = sum |y|^2 - |sum y|^2 / n
    some = torch.tensor(lengths) > 1  # a window of one token predicts nothing: no sampled unit
    windows = {k: torch.cat(v)[some] for k, v in per_window.items()}
    return _table(clt, sse, tss, fires, fired, windows, n_pred, kl / n, n)


@torch.no_grad()
def clt_dead_fractions(model: HookedModel, clt: CrossLayerTranscoder, data: TextOrTokens, batch_size: int = 8,
                       seq_len: Optional[int] = None) -> pd.DataFrame:
    """The share of the CLT's features never firing on `data`, per layer read and in all (rows as `clt_metrics`'
    `layer`, `dead_fraction`, with `n_tokens`): one clean forward a batch, for the long text that dead latents
    are counted over, where `clt_metrics`' four forwards would measure losses nobody reads."""
    _check("clt_dead_fractions", model, clt, batch_size)
    fired, n = torch.zeros(clt.n_layers, clt.d_sae, dtype=torch.bool), 0
    for _, ids in batches(token_rows(model, data, seq_len), batch_size, device=model.cfg.device):
        _, cache = model.run_with_cache(ids, names_filter=lambda name: name in clt.hook_names)
        acts = clt.encode_all(torch.stack([cache[h] for h in clt.hook_names]).to(clt.W_enc.dtype))
        fired |= (torch.stack(acts) > 0).any(1).any(1).cpu()
        n += ids.numel()
    per, every = _dead(clt, fired)
    rows = [{"layer": str(l), "dead_fraction": per[l], "n_tokens": n} for l in range(clt.n_layers)]
    return pd.DataFrame(rows + [{"layer": "all", "dead_fraction": every, "n_tokens": n}])


def _table(clt, sse, tss, fires, fired, windows: dict, n_pred: int, kl: float, n: int) -> pd.DataFrame:
    ce = {k: float(w.sum()) / n_pred for k, w in windows.items()}
    dead, every = _dead(clt, fired)
    rows = [{"layer": str(l), "explained_variance": 1 - (sse[l] / tss[l]).item(), "fvu": (sse[l] / tss[l]).item(),
             "l0": fires[l].sum().item() / n, "dead_fraction": dead[l]} for l in range(clt.n_layers)]

    def recovered(ablated: float) -> float:
        return (ablated - ce["spliced"]) / (ablated - ce["clean"]) if ablated != ce["clean"] else float("nan")

    def recovered_se(key: str) -> float:
        a, s, c = windows[key], windows["spliced"], windows["clean"]
        return ratio_se(a - s, a - c) if ce[key] != ce["clean"] else float("nan")

    rows.append({"layer": "all", "explained_variance": 1 - (sse.sum() / tss.sum()).item(), "fvu": (sse.sum() / tss.sum()).item(),
                 "l0": fires.sum().item() / n, "dead_fraction": every,
                 "ce_clean": ce["clean"], "ce_spliced": ce["spliced"], "ce_zero": ce["zero"], "ce_mean": ce["mean"],
                 "ce_loss_recovered": recovered(ce["zero"]), "ce_loss_recovered_mean": recovered(ce["mean"]),
                 "ce_loss_recovered_se": recovered_se("zero"), "ce_loss_recovered_mean_se": recovered_se("mean"),
                 "kl_spliced": kl, "n_tokens": n})
    return pd.DataFrame(rows)
