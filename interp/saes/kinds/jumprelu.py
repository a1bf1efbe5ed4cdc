"""jumprelu: z H(z - threshold) with a learned threshold per latent, trained through the straight-through
estimator with an L0 penalty (Rajamanoharan et al. 2024, "Jumping Ahead: Improving Reconstruction Fidelity
with JumpReLU Sparse Autoencoders")."""
from __future__ import annotations

import torch
from jaxtyping import Float

from .base import Dictionary, Kind, threshold_of


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

    def __init__(self, bandwidth: float = 0.05) -> None:
        self.bandwidth = bandwidth

    def encode(self, pre: Float[torch.Tensor, "*batch d_sae"], sae: Dictionary) -> Float[torch.Tensor, "*batch d_sae"]:
        return pre * (pre > threshold_of(sae)).to(pre.dtype) * (pre > 0).to(pre.dtype)

    def train_acts(self, pre: Float[torch.Tensor, "rows d_sae"], sae: Dictionary,
                   global_rows: int) -> Float[torch.Tensor, "rows d_sae"]:
        return _JumpReLUFn.apply(pre, sae.threshold, self.bandwidth)

    def penalty(self, pre: Float[torch.Tensor, "rows d_sae"], acts: Float[torch.Tensor, "rows d_sae"],
                sae: Dictionary) -> Float[torch.Tensor, " rows"]:
        return _StepFn.apply(pre, sae.threshold, self.bandwidth).sum(-1)  # L0
