"""The base class of the kinds: how latents fire and what training adds to the loss (ReLU's rule, no penalty)."""
from __future__ import annotations

from typing import Optional, Protocol, cast

import torch
from jaxtyping import Float


class Dictionary(Protocol):
    """What a kind reads of its dictionary (an `interp.SAE` or `interp.Transcoder`; this package does not import
    theirs, which imports it): the threshold (None for the kinds without one), the decoder and its bias."""

    @property
    def threshold(self) -> Optional[Float[torch.Tensor, " d_sae"]]: ...
    @property
    def W_dec(self) -> Float[torch.Tensor, "d_sae d_out"]: ...
    @property
    def b_dec(self) -> Float[torch.Tensor, " d_out"]: ...
    def decode(self, acts: Float[torch.Tensor, "*batch d_sae"]) -> Float[torch.Tensor, "*batch d_out"]: ...


def threshold_of(sae: Dictionary) -> Float[torch.Tensor, " d_sae"]:
    """The dictionary's threshold (JumpReLU's per latent; BatchTopK's one, repeated): a threshold kind's SAE has one."""
    return cast(torch.Tensor, sae.threshold)


class Kind:
    """The sparsity rule of one dictionary kind (a base class: ReLU's rule without its penalty)."""

    name = "base"
    has_penalty = False

    def encode(self, pre: Float[torch.Tensor, "*batch d_sae"], sae: Dictionary) -> Float[torch.Tensor, "*batch d_sae"]:
        """Latents [..., d_sae] from pre-activations [..., d_sae] at inference."""
        return torch.relu(pre)

    def train_acts(self, pre: Float[torch.Tensor, "rows d_sae"], sae: Dictionary,
                   global_rows: int) -> Float[torch.Tensor, "rows d_sae"]:
        """Latents [rows, d_sae] as training computes them (differentiable; `global_rows` is the rows of
        the whole batch over all processes)."""
        return self.encode(pre, sae)

    def penalty(self, pre: Float[torch.Tensor, "rows d_sae"], acts: Float[torch.Tensor, "rows d_sae"],
                sae: Dictionary) -> Float[torch.Tensor, " rows"]:
        """The sparsity term per row [rows], before its coefficient (0 for the TopK kinds)."""
        return acts.new_zeros(acts.shape[0])

    def reconstruction(self, target: Float[torch.Tensor, "rows d_out"], acts: Float[torch.Tensor, "rows d_sae"], sae: Dictionary,
                       extra: Optional[Float[torch.Tensor, "rows d_out"]]) -> Float[torch.Tensor, " rows"]:
        """Squared error per row [rows] of the reconstruction (`extra`: a skip term added to it)."""
        out = sae.decode(acts) if extra is None else sae.decode(acts) + extra
        return (out - target).pow(2).sum(-1)

    def after_step(self, acts: Float[torch.Tensor, "rows d_sae"], sae: Dictionary, threshold_lr: float) -> None:
        """Update what the kind learns outside the gradient (BatchTopK's inference threshold)."""
