"""Smoothed bigram and trigram language models over token ids: the baselines a small transformer should beat.

The smoothing is **interpolated Kneser-Ney** (Kneser & Ney 1995; in the interpolated form of Chen &
Goodman 1998, one absolute discount per order). With `c(.)` counts in the fitted sequence, `N1+(. v w)`
the number of distinct tokens seen before the pair `v w`, and `D_k` the discount of order k:

    p1(w)       = max(N1+(. w) - D1, 0) / N1+(. .)  +  D1 * T1 / N1+(. .) * 1/d_vocab
    p2(w | v)   = max(c(v w) - D2, 0) / c(v .)      +  D2 * N1+(v .) / c(v .) * p1(w)
    p3(w | u v) = max(c(u v w) - D3, 0) / c(u v .)  +  D3 * N1+(u v .) / c(u v .) * q2(w | v)

p1 is the continuation unigram (how many different tokens precede w, not how often w occurs),
interpolated with the uniform guess (`T1`: the tokens seen after anything), so every id keeps a
non-zero probability (a text with no bigram at all gives the uniform guess). q2, the middle order
under a trigram, is p2's formula on continuation counts `N1+(. v w)` (with its own discount) instead
of `c(v w)`, as Kneser-Ney prescribes for every order but the highest. A context never seen falls
back to the next order down whole. Each `D_k` is Ney, Essen & Kneser's estimate n1 / (n1 + 2 n2) from
that order's counts of count 1 and 2 (0.5 if it has none of count 1), or one fixed `discount` for
every order. Each distribution sums to 1 over the vocabulary.

Scoring a sequence, the first target has only one token before it: a trigram model predicts it with
its bigram p2 (from raw counts), every later target with p3.

Counting is vectorised: each n-gram is one int64 key (`u * V^2 + v * V + w`), counted with `np.unique`
and looked up with `np.searchsorted`, so fitting on 5M tokens takes a few seconds.
"""
from __future__ import annotations

from typing import Optional, Sequence, Union

import numpy as np
import torch
from jaxtyping import Float, Int

TokenIds = Union[Int[torch.Tensor, " n"], np.ndarray, Sequence[int]]


class _Level:
    """One order's counts: sorted n-gram keys with their counts, and each context's total and distinct
    continuations (contexts = key // d_vocab)."""

    def __init__(self, keys: np.ndarray, counts: np.ndarray, d_vocab: int) -> None:
        self.keys, self.counts = keys, counts.astype(np.float64)
        ctx = keys // d_vocab
        starts = np.flatnonzero(np.r_[True, ctx[1:] != ctx[:-1]]) if len(ctx) else np.zeros(0, np.int64)
        self.ctx = ctx[starts]
        self.ctx_total = np.add.reduceat(self.counts, starts) if len(ctx) else np.zeros(0)
        self.ctx_types = np.diff(np.r_[starts, len(ctx)]).astype(np.float64)

    def count(self, keys: np.ndarray) -> np.ndarray:
        return _lookup(self.keys, self.counts, keys)

    def context(self, ctx: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(total count, distinct continuations) of each context (0, 0 where never seen)."""
        return _lookup(self.ctx, self.ctx_total, ctx), _lookup(self.ctx, self.ctx_types, ctx)


def _lookup(sorted_keys: np.ndarray, values: np.ndarray, query: np.ndarray) -> np.ndarray:
    """values[i] where sorted_keys[i] == query, else 0."""
    if len(sorted_keys) == 0:
        return np.zeros(len(query))
    at = np.minimum(np.searchsorted(sorted_keys, query), len(sorted_keys) - 1)
    return np.where(sorted_keys[at] == query, values[at], 0.0)


def _discount(counts: np.ndarray, fixed: Optional[float]) -> float:
    if fixed is not None:
        return fixed
    n1, n2 = int((counts == 1).sum()), int((counts == 2).sum())
    return n1 / (n1 + 2 * n2) if n1 else 0.5


def _as_ids(tokens: TokenIds, d_vocab: int, what: str) -> np.ndarray:
    ids = np.asarray(tokens.detach().cpu() if isinstance(tokens, torch.Tensor) else tokens)
    if ids.ndim != 1 or (ids.size and not np.issubdtype(ids.dtype, np.integer)):
        raise ValueError(f"{what} must be a 1-D sequence of integer token ids, got shape {ids.shape} of {ids.dtype}")
    if ids.size and (ids.min() < 0 or ids.max() >= d_vocab):
        raise ValueError(f"{what} holds ids outside 0..{d_vocab - 1} (d_vocab {d_vocab}): {ids.min()}..{ids.max()}")
    return ids.astype(np.int64)


class KneserNey:
    """An interpolated Kneser-Ney bigram or trigram model over token ids, fitted on one sequence.

    Args:
        tokens: the training ids, a 1-D sequence [n] (e.g. a model's training text, tokenised).
        d_vocab: the vocabulary size V (ids are 0..V-1; an id never seen keeps probability > 0).
        order: 2 (bigram) or 3 (trigram; it can also score as a bigram, `order=2` in `log_probs`).
        discount: one absolute discount in (0, 1] for every order; None: each order's n1 / (n1 + 2 n2).

    Example:
        >>> import torch
        >>> lm = KneserNey(torch.tensor([0, 1, 2, 0, 1, 2, 0, 1]), d_vocab=4, order=3)
        >>> round(float(lm.next_token_log_probs([0, 1]).exp().sum()), 6)
        1.0
        >>> bool(lm.log_probs(torch.tensor([0, 1, 2]))[1].exp() > 0.5)  # "2" after "0 1": seen twice
        True
    """

    def __init__(self, tokens: TokenIds, d_vocab: int, order: int = 2, discount: Optional[float] = None) -> None:
        if order not in (2, 3):
            raise ValueError(f"order must be 2 (bigram) or 3 (trigram), got {order!r}")
        if isinstance(d_vocab, bool) or not isinstance(d_vocab, int) or not 1 <= d_vocab <= 2**20:
            raise ValueError(f"d_vocab must be an integer in 1..{2**20} (keys are int64 V^3), got {d_vocab!r}")
        if discount is not None and not 0 < discount <= 1:
            raise ValueError(f"discount must be in (0, 1] (or None to estimate it), got {discount!r}")
        ids = _as_ids(tokens, d_vocab, "tokens")  # shorter than an n-gram: the lower orders (at worst uniform)
        self.d_vocab, self.order, V = d_vocab, order, d_vocab
        bigrams = ids[:-1] * V + ids[1:]
        self.bigram = _Level(*np.unique(bigrams, return_counts=True), V)  # raw counts c(v w)
        # continuation unigram: distinct tokens before w = distinct bigram types ending in w
        self.continuation = np.bincount(self.bigram.keys % V, minlength=V).astype(np.float64)
        # D1, D2 and, for a trigram, "2c" (the middle order's, on continuation counts) and D3
        self.discounts: dict[Union[int, str], float] = {1: _discount(self.continuation, discount),
                                                        2: _discount(self.bigram.counts, discount)}
        if order == 3:
            trigrams = (ids[:-2] * V + ids[1:-1]) * V + ids[2:]
            self.trigram = _Level(*np.unique(trigrams, return_counts=True), V)
            # the middle order on continuation counts N1+(. v w): distinct u before each pair v w
            self.middle = _Level(*np.unique(self.trigram.keys % (V * V), return_counts=True), V)
            self.discounts.update({"2c": _discount(self.middle.counts, discount), 3: _discount(self.trigram.counts, discount)})

    # ------------------------------------------------------------------------- the orders

    def _p1(self, w: np.ndarray) -> np.ndarray:
        D, total = self.discounts[1], self.continuation.sum()
        if total == 0:  # no bigram was fitted: the uniform guess
            return np.full(len(w), 1.0 / self.d_vocab)
        seen = float((self.continuation > 0).sum())
        return np.maximum(self.continuation[w] - D, 0) / total + D * seen / total / self.d_vocab

    def _interpolate(self, level: _Level, D: float, ctx: np.ndarray, w: np.ndarray, lower: np.ndarray) -> np.ndarray:
        total, types = level.context(ctx)
        own = np.maximum(level.count(ctx * self.d_vocab + w) - D, 0)
        seen = total > 0
        safe = np.where(seen, total, 1.0)
        return np.where(seen, own / safe + D * types / safe * lower, lower)

    def _p2(self, v: np.ndarray, w: np.ndarray, level: Optional[_Level] = None, D: Optional[float] = None) -> np.ndarray:
        return self._interpolate(level or self.bigram, self.discounts[2] if D is None else D, v, w, self._p1(w))

    def _p3(self, u: np.ndarray, v: np.ndarray, w: np.ndarray) -> np.ndarray:
        q2 = self._p2(v, w, self.middle, self.discounts["2c"])
        return self._interpolate(self.trigram, self.discounts[3], u * self.d_vocab + v, w, q2)

    # ------------------------------------------------------------------------- scoring

    def log_probs(self, tokens: TokenIds, order: Optional[int] = None) -> Float[torch.Tensor, " n_minus_1"]:
        """log p(tokens[i] | the up to order-1 tokens before it), for i = 1..n-1: [n - 1], float64.

        `order` (default the model's) may be 2 for a trigram model: its bigram p2.
        """
        order = self.order if order is None else order
        if order not in (2, 3) or order > self.order:
            raise ValueError(f"order must be 2{' or 3' if self.order == 3 else ''} for this {self.order}-gram model, "
                             f"got {order!r}")
        ids = _as_ids(tokens, self.d_vocab, "tokens")
        if len(ids) < 2:
            return torch.zeros(0, dtype=torch.float64)
        p = self._p2(ids[:-1], ids[1:])
        if order == 3 and len(ids) > 2:
            p[1:] = self._p3(ids[:-2], ids[1:-1], ids[2:])
        return torch.from_numpy(np.log(p))

    def next_token_log_probs(self, context: Sequence[int]) -> Float[torch.Tensor, " d_vocab"]:
        """log p(w | context) for every id w: [d_vocab], float64 (the last order-1 ids of `context` count)."""
        ctx = _as_ids(context, self.d_vocab, "context")
        if len(ctx) == 0:
            raise ValueError("context must hold at least one id")
        w = np.arange(self.d_vocab)
        if self.order == 3 and len(ctx) >= 2:
            p = self._p3(np.full_like(w, ctx[-2]), np.full_like(w, ctx[-1]), w)
        else:
            p = self._p2(np.full_like(w, ctx[-1]), w)
        return torch.from_numpy(np.log(p))

    def loss(self, tokens: TokenIds, order: Optional[int] = None) -> float:
        """Mean nats per predicted token of `tokens` (targets 1..n-1)."""
        lp = self.log_probs(tokens, order)
        if lp.numel() == 0:
            raise ValueError("tokens: fewer than two ids, nothing to predict")
        return float(-lp.mean())
