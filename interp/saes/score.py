"""A whole dictionary's interpretability score, beside PCA and random directions (issue 38, item 6).

`interpretability_score(model, sae, train, test, n)` describes `n` random latents that fire on `train`
with `interp.saes.describe` (chosen on `train`, scored on `test`), and, under the same procedure, the top
`n` principal directions of the dictionary's input activations on `train` and `n` random unit directions
of that space. A direction has no firing of its own: it "fires" where its centred projection exceeds
the train quantile that gives it the median train density of the latents described (the same threshold
on test), and that excess is its activation. `interpretability_summary` gives, per source, the share of
those with held-out detection AUROC >= 0.8: the score.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Optional, Sequence

import numpy as np
import pandas as pd
import torch

from .._core.batching import TextOrTokens
from .._core.model import HookedModel
from .baselines import pca_basis
from .describe import GOOD_AUROC, Tokens, choose, hook_acts, score_description, tokens_of
from .settings import COUNT, check_args

if TYPE_CHECKING:
    from .sae import SAE

SOURCES = ("dictionary", "pca", "random")


def _encode(sae, x: torch.Tensor, chunk: int = 4096) -> torch.Tensor:
    with torch.inference_mode():
        return torch.cat([sae.encode(x[i:i + chunk]) for i in range(0, len(x), chunk)])


def _described(model: HookedModel, source: str, index: int, tok: tuple[Tokens, Tokens], act: tuple[np.ndarray, np.ndarray],
               max_units: int, min_count: int) -> dict:
    desc = choose(model, tok[0], act[0] > 0, max_units, min_count)
    return dict(source=source, index=index, **score_description(desc, tok[1], act[1]))


def _directions(x_tr: torch.Tensor, n: int, seed: int) -> dict[str, torch.Tensor]:
    """{"pca": the top n principal directions [n, d], "random": n random unit directions [n, d]} (float64)."""
    _, basis = pca_basis(x_tr)
    g = torch.Generator().manual_seed(seed)
    rand = torch.randn(n, x_tr.shape[1], generator=g, dtype=torch.float64)
    return {"pca": basis[:, :n].T, "random": rand / rand.norm(dim=-1, keepdim=True)}


def interpretability_score(model: HookedModel, sae: SAE, train: TextOrTokens, test: TextOrTokens, n: int = 64,
                           baselines: bool = True, seed: int = 0, max_units: int = 8, min_count: int = 2,
                           seq_len: Optional[int] = None, latents: Optional[Sequence[int]] = None) -> pd.DataFrame:
    """Held-out description scores of n random live latents (and of n PCA and n random directions).

    Args:
        model, sae: a hooked model and an `interp.SAE` / `interp.Transcoder` trained on it.
        train, test: the text descriptions are chosen on, and the held-out text they are scored on.
        n: latents (and directions of each baseline) described; baselines: also the PCA and random directions.
        latents: describe these latents instead of n random live ones (a page's shown latents with its sample).

    Returns:
        One row per latent or direction: `source` ("dictionary", "pca", "random"), `index` (latent id or
        direction number), and `describe_latent`'s columns (`kind`, `description`, `train_f1`,
        `precision`, `recall`, `auroc`, `fuzz`, `density`, `n_fire`).
    """
    check_args("interpretability_score", n=(n, *COUNT), baselines=(baselines, "bool", None), seed=(seed, "int", (0, None, "[")),
               max_units=(max_units, *COUNT), min_count=(min_count, *COUNT), seq_len=(seq_len, "Optional[int]", COUNT[1]))
    if sae.hook_name is None:
        raise ValueError("interpretability_score: the dictionary has no hook_name (the hook it reads)")
    (tok_tr, rows_tr), (tok_te, rows_te) = tokens_of(model, train, seq_len), tokens_of(model, test, seq_len)
    x_tr, x_te = hook_acts(model, sae.hook_name, rows_tr), hook_acts(model, sae.hook_name, rows_te)
    a_tr, a_te = _encode(sae, x_tr), _encode(sae, x_te)
    live = (a_tr > 0).any(0).nonzero().flatten()
    if len(live) == 0:
        raise ValueError("interpretability_score: no latent fires on the train text")
    pick = live[torch.randperm(len(live), generator=torch.Generator().manual_seed(seed))[:n]].tolist() \
        if latents is None else [int(j) for j in latents]
    toks = (tok_tr, tok_te)
    rows = [_described(model, "dictionary", j, toks, (a_tr[:, j].numpy(), a_te[:, j].numpy()), max_units, min_count)
            for j in pick]
    if baselines:
        density = float(np.median([(a_tr[:, j] > 0).double().mean().item() for j in pick]))
        density = density if density > 0 else 1 / len(x_tr)
        mean = x_tr.double().mean(0)
        for source, dirs in _directions(x_tr, min(n, x_tr.shape[1]), seed).items():
            for i, u in enumerate(dirs):
                p_tr, p_te = ((x_tr.double() - mean) @ u).numpy(), ((x_te.double() - mean) @ u).numpy()
                cut = float(np.quantile(p_tr, 1 - density))
                rows.append(_described(model, source, i, toks, (p_tr - cut, p_te - cut), max_units, min_count))
    return pd.DataFrame(rows)


def interpretability_summary(scores: pd.DataFrame, good: float = GOOD_AUROC) -> pd.DataFrame:
    """Per source of an `interpretability_score` frame: `n`, `share_good` (held-out AUROC >= `good`: the
    interpretability score), `median_auroc`, `median_fuzz`, `median_precision`, `median_recall`."""
    if not isinstance(scores, pd.DataFrame):
        raise TypeError(f"interpretability_summary: scores must be interpretability_score's DataFrame, got {type(scores).__name__}")
    check_args("interpretability_summary", good=(good, "float", (0, 1, "[]")))
    missing = {"source", "auroc", "fuzz", "precision", "recall"} - set(scores.columns)
    if missing:
        raise ValueError(f"interpretability_summary: the frame lacks {sorted(missing)} (interpretability_score's frame)")
    g = scores.groupby("source", sort=False)
    return pd.DataFrame(dict(n=g.size(), share_good=g.auroc.apply(lambda a: float((a >= good).mean())),
                             median_auroc=g.auroc.median(), median_fuzz=g.fuzz.median(),
                             median_precision=g.precision.median(), median_recall=g.recall.median())).reset_index()
