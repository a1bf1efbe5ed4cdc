"""What a dictionary must beat: codes with no training, at the same L0 on the same tokens.

A sparse dictionary is worth its training only if it reconstructs better than codes anyone could write
down without training one (issue 38):

- an SAE against the **PCA code**: each token's activation written in the principal basis of the fit
  activations (centred on their mean), keeping its L0 largest-magnitude coefficients and zeroing the rest,
  where L0 is the number of latents the dictionary fired on that same token;
- a transcoder against **least-squares regression** (the MLP's output as an affine map of the
  transcoder's input, fitted by ordinary least squares: dense, no sparsity at all) and the **MLP's own
  top neurons** (each token's L0 hidden neurons `blocks.{l}.mlp.hook_post` whose writes
  |h_i| ||W_out[i]|| are largest, the rest zeroed, through `W_out` and `b_out`).

`fit_baselines` reads the fit activations once (float64 running sums: memory does not grow with the
data) and returns the `Baselines` (mean, PCA basis, regression weights) that `interp.sae_metrics(...,
baselines=True)` splices in. Fit on the dictionary's training text for an out-of-sample comparison; a
fit on the measured text itself only favours the baselines.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Optional, Union

import torch
import torch.nn.functional as F
from jaxtyping import Float, Int

from sprout.names import act_name, layer_of

from .._core.batching import TextOrTokens, batches, token_rows
from .._core.model import HookedModel
from .splice import is_transcoder

if TYPE_CHECKING:
    from .sae import SAE

SAE_BASELINES = ("pca",)
TRANSCODER_BASELINES = ("regression", "top_neurons")


@dataclass
class Baselines:
    """The fitted baselines of one dictionary (float64; shapes with d the target's width).

    Attributes:
        transcoder: whether these are a transcoder's baselines (regression, top neurons) or an SAE's (PCA).
        mean: [d] the target's mean over the fit tokens (what mean ablation writes).
        basis: [d, d] principal directions as columns, by decreasing variance (SAE; else None).
        W_reg, b_reg: [d_in, d], [d]: the least-squares affine map from input to MLP output (transcoder).
        W_out, b_out: [d_mlp, d], [d]: the MLP's output weights (transcoder).
        n_tokens: the fit tokens.
    """

    transcoder: bool
    mean: Float[torch.Tensor, " d"]
    n_tokens: int
    basis: Optional[Float[torch.Tensor, "d d"]] = None
    W_reg: Optional[Float[torch.Tensor, "d_in d"]] = None
    b_reg: Optional[Float[torch.Tensor, " d"]] = None
    W_out: Optional[Float[torch.Tensor, "d_mlp d"]] = None
    b_out: Optional[Float[torch.Tensor, " d"]] = None

    @property
    def names(self) -> tuple[str, ...]:
        return TRANSCODER_BASELINES if self.transcoder else SAE_BASELINES


def keep_largest(coef: Float[torch.Tensor, "n m"], l0: Union[int, Int[torch.Tensor, " n"]]) -> Float[torch.Tensor, "n m"]:
    """coef with all but each row's `l0` largest-magnitude entries zeroed (`l0` one int or one per row)."""
    n, m = coef.shape
    l0 = torch.as_tensor(l0, device=coef.device).expand(n).clamp(0, m)
    order = coef.abs().argsort(dim=-1, descending=True)
    rank = torch.empty_like(order).scatter_(-1, order, torch.arange(m, device=coef.device).expand(n, m))
    return coef * (rank < l0[:, None]).to(coef.dtype)


def pca_basis(x: Float[torch.Tensor, "n d"]) -> tuple[Float[torch.Tensor, " d"], Float[torch.Tensor, "d d"]]:
    """(mean [d], principal directions [d, d] as columns by decreasing variance) of the rows of x."""
    x = x.double()
    mean = x.mean(0)
    return mean, _principal(_centred_cov(x.T @ x, x.sum(0), len(x)))


def _centred_cov(xx: torch.Tensor, sx: torch.Tensor, n: int) -> torch.Tensor:
    return xx / n - torch.outer(sx, sx) / n**2


def _principal(cov: torch.Tensor) -> torch.Tensor:
    values, vectors = torch.linalg.eigh(cov)  # ascending
    return vectors.flip(-1)


def pca_code(x: Float[torch.Tensor, "n d"], mean: Float[torch.Tensor, " d"], basis: Float[torch.Tensor, "d d"],
             l0: Union[int, Int[torch.Tensor, " n"]]) -> Float[torch.Tensor, "n d"]:
    """x rebuilt from its `l0` largest-magnitude coefficients in the (centred) principal basis."""
    coef = (x.double() - mean) @ basis
    return keep_largest(coef, l0) @ basis.T + mean


def top_neurons(hidden: Float[torch.Tensor, "n d_mlp"], W_out: Float[torch.Tensor, "d_mlp d"], b_out: Float[torch.Tensor, " d"],
                l0: Union[int, Int[torch.Tensor, " n"]]) -> Float[torch.Tensor, "n d"]:
    """The MLP's output written by each token's `l0` neurons whose writes |h_i| ||W_out[i]|| are largest."""
    hidden, W_out = hidden.double(), W_out.double()
    size = hidden * W_out.norm(dim=-1)
    kept = keep_largest(size, l0) != 0
    return (hidden * kept.to(hidden.dtype)) @ W_out + b_out.double()


def regression(x_in: Float[torch.Tensor, "n d_in"], y: Float[torch.Tensor, "n d"]) -> tuple[torch.Tensor, torch.Tensor]:
    """(W [d_in, d], b [d]): the least-squares affine map from x_in to y."""
    x1 = torch.cat([x_in.double(), x_in.new_ones(len(x_in), 1).double()], 1)
    return _solve(x1.T @ x1, x1.T @ y.double())


def _solve(gram: torch.Tensor, cross: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    ridge = 1e-10 * gram.diagonal().mean().clamp_min(1e-30)  # only for exactly collinear inputs (a constant column)
    w = torch.linalg.solve(gram + ridge * torch.eye(len(gram), dtype=gram.dtype, device=gram.device), cross)
    return w[:-1], w[-1]


class _FitSums:
    """Running float64 sums for the mean, the covariance and the normal equations."""

    def __init__(self) -> None:
        self.n = 0
        self.sums: dict = {}

    def add(self, key: str, value: torch.Tensor) -> None:
        self.sums[key] = value if key not in self.sums else self.sums[key] + value


def _fit_names(model: HookedModel, sae: SAE) -> list[str]:
    """[the hook read] for an SAE (its target too); [the hook read, the hook replaced] for a transcoder."""
    if sae.hook_name is None:
        raise ValueError("fit_baselines: the dictionary has no hook_name (the hook it reads)")
    return [sae.hook_name, str(getattr(sae, "hook_name_out"))] if is_transcoder(sae) else [sae.hook_name]


@torch.inference_mode()
def fit_baselines(model: HookedModel, sae: SAE, data: TextOrTokens, batch_size: int = 8,
                  seq_len: Optional[int] = None) -> Baselines:
    """The baselines of `sae` (an SAE or a transcoder) fitted on every token of `data`.

    Args:
        model: the hooked model the dictionary reads.
        sae: the dictionary (its `hook_name`, and a transcoder's `hook_name_out`, say what is fitted).
        data: text, texts or ids: the dictionary's training text for an out-of-sample comparison.

    Returns:
        Baselines: the target's mean; an SAE's PCA basis; a transcoder's regression and MLP output weights.
    """
    names = _fit_names(model, sae)
    s = _FitSums()
    for _, ids in batches(token_rows(model, data, seq_len), batch_size, device=model.cfg.device):
        _, cache = model.run_with_cache(ids, names_filter=names, stop_at_layer=_stop(model, names[-1]))
        y = cache[names[-1]].flatten(0, -2).double().cpu()
        s.n += len(y)
        s.add("y", y.sum(0))
        if is_transcoder(sae):
            x1 = torch.cat([cache[names[0]].flatten(0, -2).double().cpu(), y.new_ones(len(y), 1)], 1)
            s.add("gram", x1.T @ x1)
            s.add("cross", x1.T @ y)
        else:
            s.add("yy", y.T @ y)
    if s.n == 0:
        raise ValueError("fit_baselines: the data has no token to fit on")
    mean = s.sums["y"] / s.n
    if not is_transcoder(sae):
        return Baselines(False, mean, s.n, basis=_principal(_centred_cov(s.sums["yy"], s.sums["y"], s.n)))
    W_reg, b_reg = _solve(s.sums["gram"], s.sums["cross"])
    layer = layer_of(names[-1])
    W_out, b_out = getattr(model, "W_out", None), getattr(model, "b_out", None)
    if W_out is None:
        raise ValueError(f"fit_baselines: the model has no W_out [n_layers, d_mlp, d_model]: the top-neuron baseline of "
                         f"the transcoder at {sae.hook_name!r} needs the MLP's output weights")
    return Baselines(True, mean, s.n, W_reg=W_reg, b_reg=b_reg, W_out=W_out[layer].detach().double().cpu(),
                     b_out=(b_out[layer].detach().double().cpu() if b_out is not None else torch.zeros_like(mean)))


def _stop(model: HookedModel, name: str) -> Optional[int]:
    layer = layer_of(name)
    return None if layer is None or layer + 1 >= int(model.cfg.n_layers) else layer + 1


def hidden_name(sae: SAE) -> str:
    """The MLP's hidden neurons a transcoder's top-neuron baseline reads."""
    return act_name("mlp_post", layer_of(str(getattr(sae, "hook_name_out"))))


def outputs(fit: Baselines, x_in: torch.Tensor, hidden: Optional[torch.Tensor],
            l0: Int[torch.Tensor, " n"]) -> dict[str, torch.Tensor]:
    """{baseline: its output [n, d] (float64)} for inputs x_in [n, d_in] (an SAE's: its target), the MLP's
    hidden [n, d_mlp] (transcoders) and the dictionary's L0 on each token [n]."""
    dev = x_in.device
    if not fit.transcoder:
        assert fit.basis is not None
        return {"pca": pca_code(x_in, fit.mean.to(dev), fit.basis.to(dev), l0)}
    assert fit.W_reg is not None and fit.b_reg is not None and fit.W_out is not None and fit.b_out is not None
    assert hidden is not None
    return {"regression": x_in.double() @ fit.W_reg.to(dev) + fit.b_reg.to(dev),
            "top_neurons": top_neurons(hidden, fit.W_out.to(dev), fit.b_out.to(dev), l0)}


def ce_kl(ids: torch.Tensor, mask: torch.Tensor, log_p: torch.Tensor, logits: torch.Tensor) -> tuple[float, float]:
    """(summed next-token cross-entropy over predictions of a real token from a real token, summed
    KL(clean || these logits) over real tokens) for logits [batch, pos, vocab]; log_p the clean log-probs."""
    pred = mask[:, :-1] & mask[:, 1:]
    log_q = F.log_softmax(logits.float(), -1)
    ce = F.nll_loss(log_q[:, :-1][pred], ids[:, 1:][pred], reduction="sum").item()
    kl = (log_p.exp() * (log_p - log_q)).sum(-1)[mask].double().sum().item()
    return ce, kl


def baseline_columns(row: dict, ce_mean: float, kl_mean: float, methods: dict, n: int, n_pred: int, tss: float) -> dict:
    """The dictionary's row with mean ablation, each baseline's columns and the margins over the best.

    Args:
        row: the dictionary's own metrics (`sae_metrics` without baselines).
        ce_mean, kl_mean: mean-ablated mean cross-entropy and KL per token.
        methods: {baseline: summed sse, ce, kl, l0}; n / n_pred: tokens / predictions; tss: the target's
            total sum of squares about its mean.
    """
    clean, zero = row["ce_clean"], row["ce_zero"]

    def recovered(ce: float, ablated: float) -> float:
        return (ablated - ce) / (ablated - clean) if ablated != clean else float("nan")

    out = {**row, "ce_mean": ce_mean, "ce_loss_recovered_mean": recovered(row["ce_spliced"], ce_mean), "kl_mean": kl_mean}
    for name, m in methods.items():
        ce = m["ce"] / n_pred if n_pred else float("nan")
        out.update({f"{name}_explained_variance": 1 - m["sse"] / tss if tss > 0 else float("nan"),
                    f"{name}_ce_loss_recovered": recovered(ce, zero), f"{name}_ce_loss_recovered_mean": recovered(ce, ce_mean),
                    f"{name}_kl": m["kl"] / n, f"{name}_l0": m["l0"] / n})
    best = max(methods, key=lambda b: out[f"{b}_explained_variance"])
    out["best_baseline"] = best
    for col, key in (("ev_margin", "explained_variance"), ("ce_margin", "ce_loss_recovered_mean"),
                     ("ce_zero_margin", "ce_loss_recovered")):
        mine = out[key]
        out[col] = mine - max(out[f"{b}_{key}"] for b in methods)
    return out
