"""How good a dictionary is: reconstruction, sparsity, and what splicing it in does to the model's loss.

`sae_metrics(model, sae, data)` streams the data through the model in batches, three forwards per
batch (clean, spliced, zero-ablated), and returns one row:

- `fvu` (fraction of variance unexplained) = sum_i ||x_i - x̂_i||^2 / sum_i ||x_i - mean(x)||^2 over
  every real token (x the dictionary's target: the hook's activation for an SAE, the MLP's output
  `hook_mlp_out` for a transcoder), `explained_variance` = 1 - fvu, `mse` per element;
- `l0`: mean number of nonzero latents per token;
- `dead_fraction`: latents that never fire on any of the `n_tokens` tokens measured (the window is the
  whole sample); `dense_fraction`: latents firing on more than `dense_threshold` (default 10%) of them;
- `ce_clean`, `ce_spliced` (the activation replaced by the reconstruction, no error term), `ce_zero`
  (the activation replaced by zeros: for a transcoder, the MLP's output zeroed): mean next-token
  cross-entropy in nats over every prediction of a real token from a real token;
- `ce_loss_recovered` = (ce_zero - ce_spliced) / (ce_zero - ce_clean), 1 for a perfect dictionary; NaN
  (with a warning) from fewer than `MIN_CE_PREDICTIONS` predictions, where it is noise;
- `kl_spliced`, `kl_zero`: mean KL(clean || spliced) and KL(clean || zero-ablated) of the next-token
  distributions, over every real token;
- `ce_loss_recovered_se`: its standard error with the windows (rows) as the sampled units, by the delta
  method for a ratio of sums: with a_w, b_w window w's summed (ce_zero - ce_spliced) and (ce_zero - ce_clean)
  and R = sum a / sum b, se = sqrt(W / (W - 1) * sum_w (a_w - R b_w)^2) / |sum b| over W windows (NaN for
  one). Windows cut from one text are consecutive passages, not independent draws, so it is a lower bound
  on the spread another text of the same size would show (docs/features.md measures how far below).

`dead_fractions(model, saes, data)` counts the dead fraction alone for several dictionaries at once, from
one forward per batch that stops after the last block they read (the shipped dictionaries' check).

With `baselines=True` (issue 38) the row also measures, on the same tokens, the codes a dictionary must
beat at the same L0 (`interp.saes.baselines`: an SAE's PCA code, a transcoder's least-squares regression
and the MLP's own top neurons), CE recovered against mean ablation beside zero ablation (with its standard error,
`ce_loss_recovered_mean_se`), and the margins of the dictionary over the best baseline (`ev_margin`,
`ce_margin`, `ce_zero_margin`).

Padding: ids [batch, pos] with an `attention_mask` [batch, pos] (1 token, 0 padding) run with that
mask, and padded positions count in nothing; a list of texts is tokenized text by text (no padding).
"""
from __future__ import annotations

import warnings
from typing import TYPE_CHECKING, Optional, Union

import pandas as pd
import torch
import torch.nn.functional as F
from jaxtyping import Float, Int

from sprout.names import layer_of

from .._core.batching import TextOrTokens, batches, token_rows
from .._core.inputs import stream_windows
from .._core.model import HookedModel, require_hooks
from .baselines import Baselines, baseline_columns, ce_kl, fit_baselines, hidden_name, outputs
from .settings import COUNT, check_args
from .splice import _as_list, _spliced, is_transcoder, latent_name

if TYPE_CHECKING:
    from .sae import SAE

MIN_CE_PREDICTIONS = 32  # fewer next-token predictions than this give no ce_loss_recovered (NaN, with a warning)


def _chunks(model: HookedModel, data: TextOrTokens, batch_size: int, seq_len: Optional[int], attention_mask):
    """Yields (ids [batch, pos], mask [batch, pos] bool)."""
    device = model.cfg.device
    if attention_mask is None:
        for _, ids in batches(token_rows(model, data, seq_len), batch_size, device=device):
            yield ids, torch.ones_like(ids, dtype=torch.bool)
        return
    if not isinstance(data, torch.Tensor) or data.dim() != 2:
        raise ValueError("attention_mask goes with token ids [batch, pos] (padded); a list of texts needs none: "
                         "each text is tokenized on its own")
    mask = torch.as_tensor(attention_mask)
    if mask.shape != data.shape:
        raise ValueError(f"attention_mask has shape {list(mask.shape)} but the ids have shape {list(data.shape)}")
    if mask.is_complex() or not ((mask == 0) | (mask == 1)).all():
        raise ValueError("attention_mask must hold only 0 (padding) and 1 (real token); "
                         f"got values {sorted({float(v) for v in mask.unique()[:6].tolist()})}")
    if data.shape[1] > int(model.cfg.n_ctx):
        raise ValueError(f"padded ids of {data.shape[1]} positions exceed the model's context of {model.cfg.n_ctx}: "
                         "pass shorter rows (or a list of texts, which is cut into windows)")
    for start in range(0, data.shape[0], batch_size):
        yield data[start:start + batch_size].to(device), mask[start:start + batch_size].to(device).bool()


class _Sums:
    """Running float64 sums over batches; of each window, only its summed losses (for the standard errors)."""

    def __init__(self, d_sae: int, fit: Optional[Baselines] = None):
        self.fit = fit
        self.methods = {m: dict(sse=0.0, ce=0.0, kl=0.0, l0=0.0) for m in (fit.names if fit is not None else ())}
        self.n = 0
        self.sse = self.sq = self.l0 = 0.0
        self.sum_x: Optional[torch.Tensor] = None
        self.fires = torch.zeros(d_sae, dtype=torch.float64)
        self.ce = {"clean": 0.0, "spliced": 0.0, "zero": 0.0, "mean": 0.0}
        self.kl = {"spliced": 0.0, "zero": 0.0, "mean": 0.0}
        self.n_pred = 0
        self.per_window: dict[str, list] = {k: [] for k in self.ce}  # summed CE of each window: the standard errors
        self.window_preds: list = []  # each window's number of predictions (a window of one token has none)

    def add_recons(self, x, recons, acts):
        x, recons = x.double(), recons.double()
        self.n += x.shape[0]
        self.sse += (x - recons).pow(2).sum().item()
        self.sq += x.pow(2).sum().item()
        s = x.sum(0)
        self.sum_x = s if self.sum_x is None else self.sum_x + s
        on = acts != 0
        self.l0 += on.sum().item()
        self.fires += on.sum(0).double().cpu()

    def add_logits(self, ids, mask, clean, spliced, zero):
        pred = mask[:, :-1] & mask[:, 1:]  # predictions of a real token from a real token
        targets = ids[:, 1:][pred]
        log_p = F.log_softmax(clean.float(), -1)
        for name, logits in (("clean", clean), ("spliced", spliced), ("zero", zero)):
            log_q = F.log_softmax(logits.float(), -1) if name != "clean" else log_p
            self.ce[name] += F.nll_loss(log_q[:, :-1][pred], targets, reduction="sum").item()
            self.per_window[name].append(window_ce(ids, pred, log_q))
            if name != "clean":
                self.kl[name] += (log_p.exp() * (log_p - log_q)).sum(-1)[mask].double().sum().item()
        self.n_pred += int(pred.sum())
        self.window_preds.append(pred.sum(-1).cpu())

    def row(self, dense_threshold: float) -> dict:
        assert self.sum_x is not None  # row() is read only after tokens were added (n > 0)
        tss = self.sq - self.sum_x.pow(2).sum().item() / self.n
        fvu = self.sse / tss if tss > 0 else float("nan")
        freq = self.fires / self.n
        ce = {k: v / self.n_pred for k, v in self.ce.items()} if self.n_pred else dict.fromkeys(self.ce, float("nan"))
        gap = ce["zero"] - ce["clean"]
        if self.n_pred < MIN_CE_PREDICTIONS:  # a ratio of differences of a few losses is noise, not a measurement
            warnings.warn(f"ce_loss_recovered is NaN: {self.n_pred} next-token predictions (of real tokens from real "
                          f"tokens) are too few to measure it; give at least {MIN_CE_PREDICTIONS}", stacklevel=3)
            gap = 0.0
        row = dict(n_tokens=self.n, fvu=fvu, explained_variance=1 - fvu, mse=self.sse / (self.n * self.sum_x.numel()),
                   l0=self.l0 / self.n, dead_fraction=dead_fraction(self.fires),
                   dense_fraction=float((freq > dense_threshold).double().mean()),
                   ce_clean=ce["clean"], ce_spliced=ce["spliced"], ce_zero=ce["zero"],
                   ce_loss_recovered=(ce["zero"] - ce["spliced"]) / gap if gap != 0 else float("nan"),
                   ce_loss_recovered_se=self.recovered_se("zero") if gap != 0 else float("nan"),
                   kl_spliced=self.kl["spliced"] / self.n, kl_zero=self.kl["zero"] / self.n, n_predictions=self.n_pred)
        if self.fit is None:
            return row
        out = baseline_columns(row, ce["mean"], self.kl["mean"] / self.n, self.methods, self.n, self.n_pred, tss)
        recovers = gap != 0 and ce["mean"] != ce["clean"]
        return {**out, "ce_loss_recovered_mean_se": self.recovered_se("mean") if recovers else float("nan")}

    def recovered_se(self, ablation: str) -> float:
        """The standard error of CE recovered against `ablation` ("zero" or "mean"), windows as the units."""
        some = torch.cat(self.window_preds) > 0  # a window with no prediction is no sampled unit
        clean, spliced, ablated = (torch.cat(self.per_window[k])[some] for k in ("clean", "spliced", ablation))
        return ratio_se(ablated - spliced, ablated - clean)


def window_ce(ids: Int[torch.Tensor, "batch pos"], pred: torch.Tensor, log_q: torch.Tensor) -> Float[torch.Tensor, " batch"]:
    """Each window's summed next-token cross-entropy (float64) over the predictions `pred` [batch, pos - 1]."""
    nll = -log_q[:, :-1].gather(-1, ids[:, 1:, None])[..., 0].double()
    return torch.where(pred, nll, 0.0).sum(-1).cpu()  # selected, not multiplied: a padded slot's inf counts for nothing


def ratio_se(a: Float[torch.Tensor, " w"], b: Float[torch.Tensor, " w"]) -> float:
    """The delta-method standard error of sum(a) / sum(b) with the w pairs (a_i, b_i) as the sampled units
    (NaN for fewer than two, or sum(b) = 0)."""
    w, total = len(a), float(b.sum())
    if w < 2 or total == 0:
        return float("nan")
    r = float(a.sum()) / total
    return float(((a - r * b).pow(2).sum() * w / (w - 1)).sqrt()) / abs(total)


def dead_fraction(fires: Float[torch.Tensor, " d_sae"]) -> float:
    """The fraction of latents that never fired: `fires` [d_sae] counts (or flags) each latent's firings."""
    return float((fires == 0).double().mean())


@torch.inference_mode()
def dead_fractions(model: HookedModel, saes: list, data: TextOrTokens, batch_size: int = 32,
                   seq_len: Optional[int] = None) -> tuple[list[float], int]:
    """Each dictionary's dead fraction on `data` (as `sae_metrics`' `dead_fraction`), for all of them from one
    forward per batch of windows that stops after the last block they read; and the number of tokens.

    Args:
        saes: SAEs or transcoders of `model` (each encodes its `hook_name`).
        data: text or ids, one stream cut into windows of `seq_len` tokens (default the model's context;
            a shorter tail is dropped).

    Returns:
        ([dead fraction per dictionary, in order], tokens measured).
    """
    check_args("dead_fractions", batch_size=(batch_size, *COUNT), seq_len=(seq_len, "Optional[int]", COUNT[1]))
    saes = _as_list(saes, splice=False)  # nothing is spliced: an MLP's skip and skipless transcoders count together
    if not saes:
        raise ValueError("dead_fractions: saes is empty: give at least one SAE or transcoder")
    hooks = sorted({s.hook_name for s in saes})
    require_hooks(model, hooks)
    layers = [layer_of(h) for h in hooks]
    last = None if None in layers else max(l for l in layers if l is not None) + 1  # a hook outside blocks: run all
    ids = stream_windows(model, data, seq_len).to(model.cfg.device)
    fires = [torch.zeros(int(s.W_enc.shape[1]), dtype=torch.bool) for s in saes]
    for start in range(0, len(ids), batch_size):
        _, cache = model.run_with_cache(ids[start:start + batch_size], names_filter=hooks, stop_at_layer=last)
        for s, f in zip(saes, fires):
            f |= (s.encode(cache[s.hook_name]) != 0).flatten(0, -2).any(0).cpu()
    return [dead_fraction(f) for f in fires], ids.numel()


def _target_name(sae) -> str:
    return sae.hook_name_out if is_transcoder(sae) else sae.hook_name


def _check_finite(t: torch.Tensor, what: str) -> None:
    if not torch.isfinite(t).all():
        raise ValueError(f"{what}: NaN or infinite values; the metrics would be meaningless")


@torch.inference_mode()
def _batch(model: HookedModel, sae, ids, mask, sums: _Sums) -> None:
    target = _target_name(sae)
    forward = dict(attention_mask=mask.long()) if not mask.all() else {}
    seen = {}

    def keep(name):
        def hook(x, hook):
            seen[name] = x
        return hook

    extra = [] if sums.fit is None else [(sae.hook_name, keep("input"))]
    if sums.fit is not None and is_transcoder(sae):
        extra.append((hidden_name(sae), keep("hidden")))
    clean = model.run_with_hooks(ids, fwd_hooks=[(target, keep("target")), *extra], **forward)
    _check_finite(seen["target"], f"the activation at {target}")
    with _spliced(model, [sae], use_error_term=False):
        fwd = [(latent_name(sae, "hook_sae_acts_post"), keep("acts")), (latent_name(sae, "hook_sae_recons"), keep("recons"))]
        spliced_logits = model.run_with_hooks(ids, fwd_hooks=fwd, **forward)
    zero = model.run_with_hooks(ids, fwd_hooks=[(target, lambda x, hook: torch.zeros_like(x))], **forward)
    _check_finite(seen["acts"], f"the latents of the dictionary at {sae.hook_name}")
    sums.add_recons(seen["target"][mask], seen["recons"][mask], seen["acts"][mask])
    sums.add_logits(ids, mask, clean, spliced_logits, zero)
    if sums.fit is not None:
        _baseline_batch(model, sums, ids, mask, forward, seen, clean, target)


def _baseline_batch(model: HookedModel, sums: _Sums, ids, mask, forward: dict, seen: dict, clean, target: str) -> None:
    """Mean ablation and each baseline spliced in at the target, on the same tokens (issue 38)."""
    fit = sums.fit
    assert fit is not None
    shape, log_p = seen["target"].shape, F.log_softmax(clean.float(), -1)
    mean = fit.mean.to(seen["target"])

    def put(values):
        return lambda x, hook: values.to(x.dtype).reshape(shape)

    mean_logits = model.run_with_hooks(ids, fwd_hooks=[(target, put(mean.expand(shape)))], **forward)
    ce, kl = ce_kl(ids, mask, log_p, mean_logits)
    sums.per_window["mean"].append(window_ce(ids, mask[:, :-1] & mask[:, 1:], F.log_softmax(mean_logits.float(), -1)))
    sums.ce["mean"] += ce
    sums.kl["mean"] += kl
    l0 = (seen["acts"] != 0).flatten(0, -2).sum(-1)
    hidden = seen["hidden"].flatten(0, -2) if "hidden" in seen else None
    x = seen["target"].flatten(0, -2).double()
    for name, out in outputs(fit, seen["input"].flatten(0, -2), hidden, l0).items():
        ce, kl = ce_kl(ids, mask, log_p, model.run_with_hooks(ids, fwd_hooks=[(target, put(out))], **forward))
        m, real = sums.methods[name], mask.flatten()
        m["ce"], m["kl"] = m["ce"] + ce, m["kl"] + kl
        m["sse"] += (x - out)[real].pow(2).sum().item()
        m["l0"] += float(seen["input"].shape[-1] * int(real.sum()) if name == "regression" else l0[real].sum())


def sae_metrics(model: HookedModel, sae: SAE, data: TextOrTokens, batch_size: int = 8, seq_len: Optional[int] = None,
                attention_mask: Optional[Int[torch.Tensor, "batch pos"]] = None, dense_threshold: float = 0.1,
                baselines: bool = False, baseline_fit: Union[TextOrTokens, Baselines, None] = None) -> pd.DataFrame:
    """Reconstruction, sparsity and spliced-model loss of an SAE or a transcoder on `data` (one row).

    Args:
        model: the hooked model the dictionary was trained on.
        sae: an `interp.SAE` (replaces `sae.hook_name`) or `interp.Transcoder` (replaces `hook_name_out`
            by its prediction from `hook_name`).
        data: text, a list of texts, or ids [pos] / [batch, pos]; cut into windows of `seq_len`
            (default the model's context) and streamed `batch_size` windows at a time.
        attention_mask: [batch, pos] for padded ids (1 token, 0 padding); padding counts in nothing.
        dense_threshold: a latent firing on more than this fraction of tokens counts as dense.
        baselines: also measure, on the same tokens, the codes a dictionary must beat at the same L0
            (`interp.saes.baselines`: an SAE's PCA code; a transcoder's least-squares regression and the
            MLP's own top neurons) and mean ablation beside zero ablation.
        baseline_fit: what the baselines are fitted on: a fitted `Baselines` (`fit_baselines`), or text /
            texts / ids to fit them on (the dictionary's training text, for an out-of-sample comparison);
            default `data` itself (an in-sample fit, which only favours the baselines).

    Returns:
        One row: `hook`, `hook_out`, `kind`, `d_sae`, `n_tokens`, `fvu`, `explained_variance`, `mse`, `l0`,
        `dead_fraction`, `dense_fraction`, `ce_clean`, `ce_spliced`, `ce_zero`, `ce_loss_recovered`,
        `ce_loss_recovered_se`, `kl_spliced`, `kl_zero`, `n_predictions` (definitions in the module docstring).
        With `baselines`, also `ce_mean`, `ce_loss_recovered_mean` (against mean ablation) and its
        `ce_loss_recovered_mean_se`, `kl_mean`; per baseline b
        (`pca`; or `regression`, `top_neurons`) `{b}_explained_variance`, `{b}_ce_loss_recovered`,
        `{b}_ce_loss_recovered_mean`, `{b}_kl`, `{b}_l0`; `best_baseline` (highest EV) and the margins
        of the dictionary over the best baseline of each column: `ev_margin`, `ce_margin` (CE recovered
        against mean ablation), `ce_zero_margin`.

    Example:
        >>> import sprout, interp
        >>> model = sprout.load("gpt-4")
        >>> sae = interp.load_sae(model, "blocks.3.hook_resid_post")
        >>> row = interp.sae_metrics(model, sae, interp.held_out_stories(2_000)).iloc[0]
        >>> bool(row["l0"] <= 192 / 12), bool(row["explained_variance"] > 0.8), bool(row["ce_loss_recovered"] > 0.9)
        (True, True, True)
    """
    check_args("sae_metrics", batch_size=(batch_size, *COUNT), seq_len=(seq_len, "Optional[int]", COUNT[1]),
               dense_threshold=(dense_threshold, "float", (0, 1, "[)")))
    (sae,) = _as_list([sae])
    require_hooks(model, [sae.hook_name, _target_name(sae)])
    if hasattr(sae, "check_model"):
        sae.check_model(model, f"the {type(sae).__name__} at {sae.hook_name!r}")
    fit = None
    if baselines:
        fit = baseline_fit if isinstance(baseline_fit, Baselines) else \
            fit_baselines(model, sae, data if baseline_fit is None else baseline_fit, batch_size, seq_len)
        if fit.transcoder != is_transcoder(sae):
            raise ValueError("baseline_fit: fitted for " + ("a transcoder" if fit.transcoder else "an SAE")
                             + f", but the dictionary at {sae.hook_name!r} is not one")
    elif baseline_fit is not None:
        raise ValueError("baseline_fit is for baselines=True")
    sums = _Sums(int(sae.W_enc.shape[1]), fit)
    for ids, mask in _chunks(model, data, batch_size, seq_len, attention_mask):
        if mask.any():
            _batch(model, sae, ids, mask, sums)
    if sums.n == 0:
        raise ValueError("the data has no real (unmasked) token: nothing to measure")
    kind = "transcoder" if is_transcoder(sae) else "sae"
    head = dict(hook=sae.hook_name, hook_out=_target_name(sae), kind=kind, d_sae=int(sae.W_enc.shape[1]))
    return pd.DataFrame([{**head, **sums.row(dense_threshold)}])
