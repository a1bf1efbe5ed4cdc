"""The sparsity mechanism of each kind of dictionary: how latents fire, and what training adds to the loss.

One base class, `Kind`, and one subclass per architecture. A kind holds no weights; it reads the
dictionary's (`threshold` for JumpReLU and BatchTopK at inference) and keeps its hyperparameters (k,
bandwidth, prefix widths). `encode` is the inference rule; `train_acts` the rule training uses (the same
except for BatchTopK, which picks its latents over the whole batch); `penalty` the sparsity term of the
loss; `reconstruction` the reconstruction term (Matryoshka's nested prefixes).

Kinds, as SAELens, sparsify and dictionary_learning define them:
    relu        ReLU and an L1 penalty on the latents (unit-norm decoder rows, so the penalty
                cannot be dodged by shrinking latents and growing decoder rows): Bricken et al. 2023,
                "Towards Monosemanticity"; Conerly et al. 2024, "Circuits Updates, April 2024".
    topk        the k largest pre-activations of each row, ReLU'd; no penalty: Gao et al. 2024,
                "Scaling and evaluating sparse autoencoders" (with the AuxK loss for dead latents).
    batchtopk   the k * batch largest over the whole batch (k per row on average); at inference one
                learned threshold (the running mean of the smallest latent kept): Bussmann et al. 2024,
                "BatchTopK Sparse Autoencoders".
    jumprelu    z * H(z - threshold) with a learned threshold per latent, trained through the
                straight-through estimator with an L0 penalty (the step function's pseudo-derivative,
                a rectangle kernel of width `bandwidth`): Rajamanoharan et al. 2024, "Jumping Ahead".
    matryoshka  BatchTopK whose loss also asks each prefix of the latents (the first m of them, for
                each m in `widths`) to reconstruct the input alone: Bussmann, Nabeshima et al. 2025,
                "Learning Multi-Level Features with Matryoshka Sparse Autoencoders".
"""
from __future__ import annotations

from typing import Optional, Sequence

import torch
import torch.distributed as dist

KIND_NAMES = ("relu", "topk", "batchtopk", "jumprelu", "matryoshka")
TOPK_KINDS = ("topk", "batchtopk", "matryoshka")
THRESHOLD_KINDS = ("jumprelu", "batchtopk", "matryoshka")


class Kind:
    """The sparsity rule of one dictionary kind (a base class: ReLU's rule without its penalty)."""

    name = "base"
    has_penalty = False

    def encode(self, pre: torch.Tensor, sae) -> torch.Tensor:
        """Latents [..., d_sae] from pre-activations [..., d_sae] at inference."""
        return torch.relu(pre)

    def train_acts(self, pre: torch.Tensor, sae, global_rows: int) -> torch.Tensor:
        """Latents [rows, d_sae] as training computes them (differentiable; `global_rows` is the rows of
        the whole batch over all processes)."""
        return self.encode(pre, sae)

    def penalty(self, pre: torch.Tensor, acts: torch.Tensor, sae) -> torch.Tensor:
        """The sparsity term per row [rows], before its coefficient (0 for the TopK kinds)."""
        return acts.new_zeros(acts.shape[0])

    def reconstruction(self, target: torch.Tensor, acts: torch.Tensor, sae, extra: Optional[torch.Tensor]) -> torch.Tensor:
        """Squared error per row [rows] of the reconstruction (`extra`: a skip term added to it)."""
        out = sae.decode(acts) if extra is None else sae.decode(acts) + extra
        return (out - target).pow(2).sum(-1)

    def after_step(self, acts: torch.Tensor, sae, threshold_lr: float) -> None:
        """Update what the kind learns outside the gradient (BatchTopK's inference threshold)."""


class ReLU(Kind):
    name = "relu"
    has_penalty = True

    def penalty(self, pre, acts, sae):
        return acts.abs().sum(-1)  # decoder rows have unit norm, so this is Conerly et al.'s sum |f_i| ||d_i||


class TopK(Kind):
    name = "topk"

    def __init__(self, k: int):
        self.k = k

    def encode(self, pre, sae):
        values, indices = pre.topk(self.k, dim=-1, sorted=False)
        return torch.zeros_like(pre).scatter_(-1, indices, values.relu())


class BatchTopK(Kind):
    name = "batchtopk"

    def __init__(self, k: int):
        self.k = k

    def encode(self, pre, sae):
        return pre * (pre > sae.threshold).to(pre.dtype) * (pre > 0).to(pre.dtype)

    def train_acts(self, pre, sae, global_rows):
        act = pre.relu()
        cut = batch_threshold(act.detach(), self.k * global_rows)
        return act * (act >= cut).to(act.dtype) * (act > 0).to(act.dtype)

    def after_step(self, acts, sae, threshold_lr):
        """threshold <- (1 - lr) threshold + lr * (the smallest positive latent of the batch, over all
        processes): the running estimate of the cut BatchTopK makes, used alone at inference."""
        a = acts.detach()
        smallest = torch.where(a > 0, a, torch.full_like(a, float("inf"))).min()
        if dist.is_initialized():
            dist.all_reduce(smallest, op=dist.ReduceOp.MIN)
        if torch.isfinite(smallest):
            with torch.no_grad():
                sae.threshold.mul_(1 - threshold_lr).add_(threshold_lr * smallest.to(sae.threshold.dtype))


def batch_threshold(act: torch.Tensor, n_keep: int) -> torch.Tensor:
    """The n_keep-th largest value of act [rows, d_sae] over the batch of every process (0 if fewer)."""
    flat = act.reshape(-1)
    local = flat.topk(min(n_keep, flat.numel()), sorted=False).values
    if dist.is_initialized():
        padded = torch.full((n_keep,), -1.0, dtype=flat.dtype, device=flat.device)
        padded[:local.numel()] = local
        parts = [torch.empty_like(padded) for _ in range(dist.get_world_size())]
        dist.all_gather(parts, padded)
        local = torch.cat(parts)
    if local.numel() < n_keep:
        return flat.new_tensor(0.0)
    return local.topk(n_keep, sorted=False).values.min().clamp_min(0)


class Matryoshka(BatchTopK):
    name = "matryoshka"

    def __init__(self, k: int, widths: Sequence[int]):
        super().__init__(k)
        self.widths = list(widths)

    def reconstruction(self, target, acts, sae, extra):
        """The mean over prefixes m of |x - (acts[:, :m] @ W_dec[:m] + b_dec)|^2 (the last prefix is every
        latent: the plain BatchTopK loss)."""
        out = (sae.b_dec if extra is None else sae.b_dec + extra) - target  # minus the residual so far
        total, start = 0.0, 0
        for m in self.widths:
            out = out + acts[:, start:m] @ sae.W_dec[start:m]
            total, start = total + out.pow(2).sum(-1), m
        return total / len(self.widths)


def _rectangle(u: torch.Tensor) -> torch.Tensor:
    return ((u > -0.5) & (u < 0.5)).to(u.dtype)


class _JumpReLUFn(torch.autograd.Function):
    """z H(z - t): the gradient to z where it fires; to t the straight-through estimate
    -(t / eps) K((z - t) / eps), K the rectangle kernel (Rajamanoharan et al. 2024, eq. 11)."""

    @staticmethod
    def forward(ctx, z, t, eps):
        ctx.save_for_backward(z, t)
        ctx.eps = eps
        return z * (z > t).to(z.dtype)

    @staticmethod
    def backward(ctx, g):
        z, t = ctx.saved_tensors
        grad_t = (-(t / ctx.eps) * _rectangle((z - t) / ctx.eps) * g).sum(0)
        return (z > t).to(z.dtype) * g, grad_t, None


class _StepFn(torch.autograd.Function):
    """H(z - t), whose gradient to t is the pseudo-derivative -(1 / eps) K((z - t) / eps) (to z: none)."""

    @staticmethod
    def forward(ctx, z, t, eps):
        ctx.save_for_backward(z, t)
        ctx.eps = eps
        return (z > t).to(z.dtype)

    @staticmethod
    def backward(ctx, g):
        z, t = ctx.saved_tensors
        return None, (-(1.0 / ctx.eps) * _rectangle((z - t) / ctx.eps) * g).sum(0), None


class JumpReLU(Kind):
    name = "jumprelu"
    has_penalty = True

    def __init__(self, bandwidth: float = 0.05):
        self.bandwidth = bandwidth

    def encode(self, pre, sae):
        return pre * (pre > sae.threshold).to(pre.dtype) * (pre > 0).to(pre.dtype)

    def train_acts(self, pre, sae, global_rows):
        return _JumpReLUFn.apply(pre, sae.threshold, self.bandwidth)

    def penalty(self, pre, acts, sae):
        return _StepFn.apply(pre, sae.threshold, self.bandwidth).sum(-1)  # L0


def make_kind(name: str, k: Optional[int], d_sae: int, widths: Optional[Sequence[int]] = None,
              bandwidth: float = 0.05) -> Kind:
    """The Kind called `name`, its k and widths checked (errors name the argument and the value)."""
    if name not in KIND_NAMES:
        raise ValueError(f"kind must be one of {', '.join(KIND_NAMES)}, got {name!r}")
    if name in TOPK_KINDS:
        check_k(k, d_sae)
    elif k is not None:
        raise ValueError(f"k is for the TopK kinds ({', '.join(TOPK_KINDS)}); kind {name!r} takes none, got k={k!r}")
    if name == "relu":
        return ReLU()
    if name == "topk":
        return TopK(k)
    if name == "batchtopk":
        return BatchTopK(k)
    if name == "jumprelu":
        return JumpReLU(bandwidth)
    return Matryoshka(k, check_widths(widths, d_sae))


def check_k(k, d_sae: int) -> None:
    if isinstance(k, bool) or not isinstance(k, int):
        raise TypeError(f"k must be an int (latents per row), got {k!r} ({type(k).__name__})")
    if not 1 <= k <= d_sae:
        raise ValueError(f"k must be in 1..d_sae={d_sae}, got k={k}")


def default_widths(d_sae: int) -> list[int]:
    """Prefixes of 1/8, 1/4, 1/2 and all of the latents (those that are at least 1 and distinct)."""
    return sorted({max(1, d_sae // 8), max(1, d_sae // 4), max(1, d_sae // 2), d_sae})


def check_widths(widths, d_sae: int) -> list[int]:
    if widths is None:
        return default_widths(d_sae)
    widths = list(widths)
    if not widths or any(isinstance(w, bool) or not isinstance(w, int) for w in widths):
        raise TypeError(f"matryoshka widths must be a non-empty list of ints, got {widths!r}")
    if widths != sorted(set(widths)) or widths[0] < 1 or widths[-1] != d_sae:
        raise ValueError(f"matryoshka widths must increase strictly from >= 1 to d_sae={d_sae}, got {widths}")
    return widths
