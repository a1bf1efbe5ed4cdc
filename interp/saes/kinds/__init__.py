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

from typing import Optional, Sequence, cast

from .base import Kind
from .batchtopk import BatchTopK, batch_threshold
from .jumprelu import JumpReLU
from .matryoshka import Matryoshka
from .relu import ReLU
from .topk import TopK

KIND_NAMES = ("relu", "topk", "batchtopk", "jumprelu", "matryoshka")
TOPK_KINDS = ("topk", "batchtopk", "matryoshka")
THRESHOLD_KINDS = ("jumprelu", "batchtopk", "matryoshka")
# k when none is given: the L0 the shipped dictionaries are held to (SAELens' TopK default, 100, is more
# latents per row than a d_model of 192 can use), or every latent of a smaller dictionary
DEFAULT_K = 32


def default_k(d_sae: int) -> int:
    return min(DEFAULT_K, d_sae)


def make_kind(name: str, k: Optional[int], d_sae: int, widths: Optional[Sequence[int]] = None,
              bandwidth: float = 0.05) -> Kind:
    """The Kind called `name`, its k and widths checked (errors name the argument and the value)."""
    if name not in KIND_NAMES:
        raise ValueError(f"kind must be one of {', '.join(KIND_NAMES)}, got {name!r}")
    if name in TOPK_KINDS:
        k = default_k(d_sae) if k is None else k
        check_k(k, d_sae)
    elif k is not None:
        raise ValueError(f"k is for the TopK kinds ({', '.join(TOPK_KINDS)}); kind {name!r} takes none, got k={k!r}")
    if name == "relu":
        return ReLU()
    if name == "jumprelu":
        return JumpReLU(bandwidth)
    k = cast(int, k)  # the TopK kinds' k, checked above
    if name == "topk":
        return TopK(k)
    if name == "batchtopk":
        return BatchTopK(k)
    return Matryoshka(k, check_widths(widths, d_sae))


def check_k(k: object, d_sae: int) -> None:
    if isinstance(k, bool) or not isinstance(k, int):
        raise TypeError(f"k must be an int (latents per row), got {k!r} ({type(k).__name__})")
    if not 1 <= k <= d_sae:
        raise ValueError(f"k must be in 1..d_sae={d_sae}, got k={k}")


def default_widths(d_sae: int) -> list[int]:
    """Prefixes of a quarter, a half and all of the latents (those at least 1 and distinct). Smaller
    first prefixes than this turn their latents into blends of frequent features when the data has no
    hierarchy to find (measured on the ground-truth test's data)."""
    return sorted({max(1, d_sae // 4), max(1, d_sae // 2), d_sae})


def check_widths(widths: Optional[Sequence[int]], d_sae: int) -> list[int]:
    if widths is None:
        return default_widths(d_sae)
    widths = list(widths)
    if not widths or any(isinstance(w, bool) or not isinstance(w, int) for w in widths):
        raise TypeError(f"matryoshka widths must be a non-empty list of ints, got {widths!r}")
    if widths != sorted(set(widths)) or widths[0] < 1 or widths[-1] != d_sae:
        raise ValueError(f"matryoshka widths must increase strictly from >= 1 to d_sae={d_sae}, got {widths}")
    return widths


__all__ = ["BatchTopK", "JumpReLU", "KIND_NAMES", "Kind", "Matryoshka", "ReLU", "THRESHOLD_KINDS", "TOPK_KINDS", "TopK",
           "batch_threshold", "check_k", "check_widths", "default_widths", "make_kind"]
