"""relu: ReLU latents and an L1 penalty (Bricken et al. 2023, "Towards Monosemanticity"; Conerly et al.
2024, "Circuits Updates, April 2024"). Decoder rows have unit norm, so the penalty cannot be dodged."""
from __future__ import annotations

import torch
from jaxtyping import Float

from .base import Dictionary, Kind


class ReLU(Kind):
    name = "relu"
    has_penalty = True

    def penalty(self, pre: Float[torch.Tensor, "rows d_sae"], acts: Float[torch.Tensor, "rows d_sae"],
                sae: Dictionary) -> Float[torch.Tensor, " rows"]:
        return acts.abs().sum(-1)  # decoder rows have unit norm, so this is Conerly et al.'s sum |f_i| ||d_i||
