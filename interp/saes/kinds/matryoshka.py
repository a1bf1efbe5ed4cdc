"""matryoshka: BatchTopK whose loss also asks each prefix of the latents to reconstruct the input alone
(Bussmann, Nabeshima et al. 2025, "Learning Multi-Level Features with Matryoshka Sparse Autoencoders")."""
from __future__ import annotations

from typing import Optional, Sequence, Union, cast

import torch
from jaxtyping import Float

from .base import Dictionary
from .batchtopk import BatchTopK


class Matryoshka(BatchTopK):
    name = "matryoshka"

    def __init__(self, k: int, widths: Sequence[int]) -> None:
        super().__init__(k)
        self.widths = list(widths)

    def reconstruction(self, target: Float[torch.Tensor, "rows d_out"], acts: Float[torch.Tensor, "rows d_sae"], sae: Dictionary,
                       extra: Optional[Float[torch.Tensor, "rows d_out"]]) -> Float[torch.Tensor, " rows"]:
        """The mean over prefixes m of |x - (acts[:, :m] @ W_dec[:m] + b_dec)|^2 (the last prefix is every
        latent: the plain BatchTopK loss)."""
        out = (sae.b_dec if extra is None else sae.b_dec + extra) - target  # minus the residual so far
        total: Union[float, torch.Tensor] = 0.0
        start = 0
        for m in self.widths:
            out = out + acts[:, start:m] @ sae.W_dec[start:m]
            total, start = total + out.pow(2).sum(-1), m
        return cast(torch.Tensor, total / len(self.widths))  # a tensor: widths is never empty
