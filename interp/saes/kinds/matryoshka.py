"""matryoshka: BatchTopK whose loss also asks each prefix of the latents to reconstruct the input alone
(Bussmann, Nabeshima et al. 2025, "Learning Multi-Level Features with Matryoshka Sparse Autoencoders")."""
from __future__ import annotations

from typing import Sequence

from .batchtopk import BatchTopK


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
