"""topk: the k largest pre-activations of each row, ReLU'd; no penalty (Gao et al. 2024, "Scaling and
evaluating sparse autoencoders"; dead latents are handled by AuxK in training)."""
from __future__ import annotations

import torch

from .base import Kind


class TopK(Kind):
    name = "topk"

    def __init__(self, k: int):
        self.k = k

    def encode(self, pre, sae):
        values, indices = pre.topk(self.k, dim=-1, sorted=False)
        return torch.zeros_like(pre).scatter_(-1, indices, values.relu())
