"""Weight-based circuit scores: composition between heads, OV copying, positional QK.

Composition (Elhage et al. 2021): how much of what head A writes (its OV circuit `W_V W_O`) a later
head B reads through its query (`W_QK`), key (`W_QK^T`) or value (`W_OV`):
`||W_A W_B||_F / (||W_A||_F ||W_B||_F)`, as TransformerLens' `composition_scores` on `FactoredMatrix` computes it.
Gains are folded: ln1's into `W_Q/W_K/W_V` (the model's `W_Q` ... properties), and Sprout's QK-norm
gains into the d_head columns of `W_Q`/`W_K` here. What the score cannot see on Sprout is RoPE (it
rotates q and k by position before the dot product) and QK-norm's per-vector rescaling: the real
scores are not the bilinear form `x W_QK y^T`. docs/circuits.md measures how far that matters
against path patching.

The score of two random matrices of the same shapes is not zero (about 1/sqrt(d_model) for
rank-d_head maps), so every score comes with that baseline: the mean and spread of the same score on
Gaussian matrices shaped like W_V, W_O, W_Q, W_K. Gaussian matrices are a weak null, though: trained
heads share directions (the embedding's, the norms'), so most trained pairs score above it. The
baseline that discriminates is the model's own distribution: each score's `percentile` among all
pairs of the model that can compose (receiver in a later layer), and its `control_percentile` among
the trained pairs that cannot (receiver in the same or an earlier layer: the same matrices, no path).
"""
from __future__ import annotations

from typing import Optional

import pandas as pd
import torch
from jaxtyping import Float
from transformer_lens.FactoredMatrix import FactoredMatrix

from sprout.names import act_name

from .._core.inputs import TextOrTokens, token_batch
from .._core.model import HookedModel, model_name, n_heads, n_layers, require_hooks
from .._core.specs import VIA, head_label
from ..data import repeated_tokens


def _qk_gains(model: HookedModel) -> tuple[torch.Tensor, torch.Tensor]:
    """QK-norm gains [n_layers, d_head] for queries and keys (ones for a model without QK-norm)."""
    ones = torch.ones(n_layers(model), int(model.cfg.d_head))
    q, k = [], []
    for l, block in enumerate(model.blocks):
        attn = block.attn
        q.append(attn.q_norm.weight.detach().float() if hasattr(attn, "q_norm") else ones[l])
        k.append(attn.k_norm.weight.detach().float() if hasattr(attn, "k_norm") else ones[l])
    return torch.stack(q), torch.stack(k)


def circuits(model: HookedModel) -> tuple[FactoredMatrix, FactoredMatrix]:
    """(QK, OV) FactoredMatrix [n_layers, n_heads, d_model, d_model], every gain folded in."""
    for name in ("W_Q", "W_K", "W_V", "W_O"):
        if not hasattr(model, name):
            raise ValueError(f"{model_name(model)} has no {name} property (TransformerLens' weight layout); "
                             "composition scores read the weight matrices")
    gq, gk = _qk_gains(model)
    W_Q = model.W_Q.detach().float() * gq[:, None, None, :]
    W_K = model.W_K.detach().float() * gk[:, None, None, :]
    return FactoredMatrix(W_Q, W_K.transpose(-2, -1)), FactoredMatrix(model.W_V.detach().float(), model.W_O.detach().float())


def pair_scores(left: FactoredMatrix, right: FactoredMatrix, aligned: bool = False) -> torch.Tensor:
    """||L_i R_j||_F / (||L_i||_F ||R_j||_F) for every left i [..., d, d] and right j: [*left batch, *right batch]
    (with `aligned`, only i = j of equal batches: [batch]).

    Equal to TransformerLens' `composition_scores(left, right, broadcast_dims=True)` (tested), computed in
    the rank-r space: ||a1 a2 b1 b2||_F^2 = tr(Ga M Gb M^T) with M = a2 b1, Ga = a1^T a1, Gb = b2 b2^T, all
    [r, r]. TransformerLens multiplies out and takes SVDs, which takes 14 s for gpt-4's 144 pairs on 2 cores.
    """
    lb, rb = left.A.shape[:-2], right.A.shape[:-2]
    la1, la2 = (t.reshape(-1, *t.shape[-2:]) for t in (left.A, left.B))
    ra1, ra2 = (t.reshape(-1, *t.shape[-2:]) for t in (right.A, right.B))
    Ga, La = la1.transpose(-2, -1) @ la1, la2 @ la2.transpose(-2, -1)
    Ra, Gb = ra1.transpose(-2, -1) @ ra1, ra2 @ ra2.transpose(-2, -1)
    left_norm = torch.einsum("iab,iba->i", Ga, La).sqrt()
    right_norm = torch.einsum("jab,jba->j", Ra, Gb).sqrt()
    if aligned:
        M = la2 @ ra1  # [i, r, r]
        return ((Ga @ M @ Gb) * M).sum((-2, -1)).clamp(min=0).sqrt() / (left_norm * right_norm)
    M = la2[:, None] @ ra1[None]  # [i, j, r, r]
    prod = ((Ga[:, None] @ M @ Gb[None]) * M).sum((-2, -1))
    return (prod.clamp(min=0).sqrt() / (left_norm[:, None] * right_norm[None])).reshape(*lb, *rb, 1, 1)[..., 0, 0]


def _right(kind: str, QK: FactoredMatrix, OV: FactoredMatrix) -> FactoredMatrix:
    if kind not in VIA:
        raise ValueError(f"kind must be one of {list(VIA)}, got {kind!r}")
    return {"q": QK, "k": QK.T, "v": OV}[kind]


def random_baseline(model: HookedModel, kind: str, n: int = 64, seed: int = 0) -> tuple[float, float]:
    """Mean and standard deviation of the composition score of Gaussian matrices shaped like the model's."""
    d_model, d_head = int(model.cfg.d_model), int(model.cfg.d_head)
    g = torch.Generator().manual_seed(seed)

    def rand():
        return FactoredMatrix(torch.randn(n, d_model, d_head, generator=g), torch.randn(n, d_head, d_model, generator=g))
    OV, QK, other = rand(), rand(), rand()
    right = _right(kind, QK, other)
    scores = pair_scores(OV, right, aligned=True)
    return float(scores.mean()), float(scores.std())


@torch.no_grad()
def composition_scores(model: HookedModel, via: str = "k", baseline_samples: int = 64) -> pd.DataFrame:
    """Composition of every head with every head in a later layer, beside a random baseline.

    Args:
        model: a model with TransformerLens' weight properties (`W_Q`, `W_K`, `W_V`, `W_O`).
        via: "q", "k" or "v": which input of the later head reads the earlier head's output (as in
            `path_patch`); the frame's `kind` column says it.
        baseline_samples: random matrix pairs behind the baseline.

    Returns:
        One row per (sender, receiver) with receiver in a later layer: `sender`, `receiver`,
        `sender_layer`, `sender_head`, `receiver_layer`, `receiver_head`, `kind`, `score`,
        `baseline`, `baseline_std`, `ratio` (score / baseline), `z` ((score - baseline) / std),
        `percentile` (share of the model's composing pairs, these rows, scoring at most this, 0-100) and
        `control_percentile` (the same among its non-composing pairs: receiver in the same layer, other
        heads, or an earlier one; NaN for a one-layer model).

    Example:
        >>> import sprout, interp
        >>> keys = interp.composition_scores(sprout.load("gpt-4"), via="k")
        >>> top = keys.sort_values("score").iloc[-1]  # the strongest K-composition
        >>> top.sender, top.receiver
        ('L1H0', 'L3H2')
    """
    QK, OV = circuits(model)
    right = _right(via, QK, OV)
    scores = pair_scores(OV, right)  # [L, H, L, H]
    mean, std = random_baseline(model, via, baseline_samples)
    rows = []
    L, H = n_layers(model), n_heads(model)
    for sl in range(L):
        for sh in range(H):
            for rl in range(sl + 1, L):
                for rh in range(H):
                    rows.append((head_label(sl, sh), head_label(rl, rh), sl, sh, rl, rh, float(scores[sl, sh, rl, rh])))
    frame = pd.DataFrame(rows, columns=["sender", "receiver", "sender_layer", "sender_head", "receiver_layer",
                                        "receiver_head", "score"])
    frame.insert(6, "kind", via)
    frame["baseline"], frame["baseline_std"] = mean, std
    frame["ratio"] = frame["score"] / mean
    frame["z"] = (frame["score"] - mean) / std
    frame["percentile"] = 100 * frame["score"].rank(method="max") / frame["score"].notna().sum()  # NaN: a head writing nothing
    frame["control_percentile"] = control_percentiles(scores, frame["score"])
    return frame


def control_percentiles(scores: Float[torch.Tensor, "layer head layer head"], values: pd.Series) -> list[float]:
    """Per value, the percentage of the trained pairs that cannot compose (receiver layer <= sender
    layer, a head never paired with itself) whose score [L, H, L, H] is at most the value."""
    L, H = scores.shape[:2]
    layer = torch.arange(L)[:, None].expand(L, H)
    cannot = layer.reshape(L, H, 1, 1) >= layer.reshape(1, 1, L, H)
    cannot &= ~torch.eye(L * H, dtype=torch.bool).reshape(L, H, L, H)
    control = scores[cannot]
    control = control[~control.isnan()].sort().values
    if control.numel() == 0:
        return [float("nan")] * len(values)
    v = torch.tensor(values.to_numpy(), dtype=control.dtype)
    at_most = torch.searchsorted(control, v, right=True)
    return torch.where(v.isnan(), float("nan"), 100 * at_most.double() / control.numel()).tolist()


@torch.no_grad()
def ov_copying_scores(model: HookedModel, batch_size: int = 1024) -> pd.DataFrame:
    """How much each head copies: the fraction of tokens t whose own logit is the top one in row t of
    `W_E W_OV W_U` (ln1's and the final norm's gains folded), and Elhage et al.'s eigenvalue score
    sum(Re lambda) / sum(|lambda|) of that full circuit (1: pure copying, -1: pure anti-copying).

    Args:
        batch_size: rows of `W_E` (tokens) multiplied out at once.

    Returns:
        One row per head: `layer`, `head`, `label`, `copying_top1`, `copying_eigen`.
    """
    _, OV = circuits(model)
    W_E, W_U = model.W_E.detach().float(), model.W_U.detach().float()
    rows = []
    for l in range(n_layers(model)):
        for h in range(n_heads(model)):
            A, B = OV.A[l, h], OV.B[l, h]  # [d_model, d_head], [d_head, d_model]
            hits = 0
            for start in range(0, W_E.shape[0], batch_size):
                full = (W_E[start:start + batch_size] @ A) @ (B @ W_U)
                hits += int((full.argmax(-1) == torch.arange(start, start + full.shape[0])).sum())
            eig = torch.linalg.eigvals((B @ W_U) @ (W_E @ A))  # the d_head nonzero eigenvalues
            rows.append((l, h, head_label(l, h), hits / W_E.shape[0], float(eig.real.sum() / eig.abs().sum())))
    return pd.DataFrame(rows, columns=["layer", "head", "label", "copying_top1", "copying_eigen"])


@torch.inference_mode()
def positional_qk_scores(model: HookedModel, data: Optional[TextOrTokens] = None) -> pd.DataFrame:
    """Where each head attends on position alone: every layer's attention input is replaced by its mean
    (over the tokens' positions) at every position, so queries and keys differ only by RoPE; the score is
    the attention on the previous position, averaged over queries 1..pos-1.

    Args:
        data: ids [batch, pos] (or text, or texts of equal token length) whose mean attention input is
            used (default: seeded repeated random tokens).

    Returns:
        One row per head: `layer`, `head`, `label`, `positional_prev_token`.
    """
    tokens = repeated_tokens(model, half_len=16, n_seqs=8) if data is None else \
        token_batch(model, data).unpadded("positional_qk_scores (a mean over every position)")
    if tokens.shape[1] < 2:
        raise ValueError("positional_qk_scores reads attention on the previous position: it needs at least 2 tokens")
    L = n_layers(model)
    names = [act_name("normalized", l, "ln1") for l in range(L)]
    patterns = [act_name("pattern", l) for l in range(L)]
    require_hooks(model, names + patterns)
    _, cache = model.run_with_cache(tokens, names_filter=names)
    means = {n: cache[n].mean((0, 1)) for n in names}  # [d_model]

    def constant(x, hook):
        return means[hook.name].expand_as(x).clone()
    seen = {}

    def keep(p, hook):
        seen[hook.name] = p[0]
    model.run_with_hooks(tokens[:1], fwd_hooks=[(n, constant) for n in names] + [(n, keep) for n in patterns])
    rows = []
    T = tokens.shape[1]
    for l, name in enumerate(patterns):
        prev = seen[name][:, torch.arange(1, T), torch.arange(0, T - 1)].mean(-1)  # [head]
        rows += [(l, h, head_label(l, h), float(prev[h])) for h in range(n_heads(model))]
    return pd.DataFrame(rows, columns=["layer", "head", "label", "positional_prev_token"])
