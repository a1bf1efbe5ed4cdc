"""topk: the k largest pre-activations of each row, ReLU'd; no penalty (Gao et al. 2024, "Scaling and
evaluating sparse autoencoders"; dead latents are handled by AuxK in training)."""
from __future__ import annotations

import torch
from jaxtyping import Float

from .base import Dictionary, Kind


class TopK(Kind):
    name = "topk"

    def __init__(self, k: int) -> None:
        self.k = k

    def encode(self, pre: Float[torch.Tensor, "*batch d_sae"], sae: Dictionary) -> Float[torch.Tensor, "*batch d_sae"]:
        values, indices = pre.topk(self.k, dim=-1, sorted=False)
        return torch.zeros_like(pre).scatter_(-1, indices, values.relu())
