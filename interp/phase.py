"""The measures that move together at the induction phase change (Olsson et al. 2022), for one model.

A training run's snapshots are each measured with `phase_measures`; plotted against training tokens
they show the previous-token head, the induction head, the K-composition between them and the
in-context-learning score changing at the same time.

The in-context-learning score is Olsson et al.'s loss late in the context minus loss early in it
(their tokens 500 and 50 of 512). Scaled to a 128-token context: the mean loss at positions
`LATE` = 112..127 minus the mean at `EARLY` = 8..23 (of windows of 128 held-out tokens); a model
that uses its context has a negative score.
"""
from __future__ import annotations

import warnings
from typing import Optional

import pandas as pd
import torch

from sprout.text import check_tokens

from ._inputs import sequences
from ._model import logits_of
from ._specs import Head, as_heads
from .composition import composition_scores
from .heads import head_scores

EARLY, LATE = range(8, 24), range(112, 128)


def icl_tokens(model, tokens) -> torch.Tensor:
    """The first LATE.stop + 1 = 129 ids of every row: ids [batch, 129] (the model reads the first 128; the
    last is only a target). Takes ids [batch, pos] / [pos], a text or a list of texts (each cut to 129
    tokens, so texts of unequal length need no padding); float ids and ids outside the vocabulary are
    refused as the forward refuses them."""
    rows = sequences(model, tokens)
    short = [len(r) for r in rows if len(r) < LATE.stop + 1]
    if short:
        raise ValueError(f"the in-context-learning score needs ids [batch, >= {LATE.stop + 1}], got a row of "
                         f"{short[0]} tokens")
    ids = torch.stack([r[:LATE.stop + 1] for r in rows])
    check_tokens(model, ids[:, :-1])  # what the model reads: the forward's checks and words
    check_tokens(model, ids[:, 1:])  # the targets: the last one too must be in the vocabulary
    return ids.long().to(model.cfg.device)


@torch.inference_mode()
def icl_score(model, tokens) -> float:
    """Mean loss at positions LATE minus mean loss at positions EARLY, over ids [batch, 129+] (nats);
    `tokens` as `icl_tokens` takes them."""
    ids = icl_tokens(model, tokens)
    logits = logits_of(model, ids[:, :-1])
    loss = torch.nn.functional.cross_entropy(logits.float().transpose(1, 2), ids[:, 1:], reduction="none")  # [batch, pos]
    return float(loss[:, LATE].mean() - loss[:, EARLY].mean())


def phase_heads(model) -> tuple[str, str]:
    """The circuit to follow over training: the best induction head ("L{l}H{h}") and the best
    previous-token head in a layer below it (the head that can feed its keys)."""
    ind = head_scores(model, "induction").iloc[0]
    prev = head_scores(model, "previous_token")
    prev = prev[prev["layer"] < int(ind.layer)]
    best = Head(int(ind.layer), int(ind["head"]))
    if prev.empty:
        raise ValueError(f"the best induction head {best} is in the first layer: no earlier head can feed it")
    return Head(int(prev.iloc[0].layer), int(prev.iloc[0]["head"])).label, best.label


def _score(frame: pd.DataFrame, head: Optional[Head]) -> tuple[Head, float]:
    """(head, score) of `head` in a head_scores frame, or of its best head when `head` is None."""
    if head is None:
        row = frame.iloc[0]
        return Head(int(row.layer), int(row["head"])), float(row.score)
    row = frame[(frame["layer"] == head.layer) & (frame["head"] == head.head)]
    return head, float(row.score.iloc[0])


def _followed(model, heads) -> tuple[Optional[Head], Optional[Head]]:
    """phase_measures' `heads` = (previous-token head, induction head), checked: the first feeds the second's
    keys, so it must sit in an earlier layer."""
    if heads is None:
        return None, None
    if isinstance(heads, str) or not hasattr(heads, "__len__") or len(heads) != 2:
        raise ValueError(f"heads must be (previous-token head, induction head), e.g. ('L1H0', 'L3H1'), got {heads!r}")
    prev, ind = as_heads(model, list(heads), "heads")
    if prev.layer == ind.layer:
        warnings.warn(f"heads=({prev}, {ind}) are in one layer: {prev} cannot feed {ind}'s keys, so there is no "
                      "K-composition to measure", RuntimeWarning, stacklevel=3)
    if prev.layer > ind.layer:
        raise ValueError(f"heads=({prev}, {ind}): the previous-token head {prev} must be in an earlier layer than the "
                         f"induction head {ind} (it feeds its keys); the order is (previous-token head, induction "
                         "head): are they swapped?")
    return prev, ind


def phase_measures(model, tokens=None, heads: Optional[tuple[str, str]] = None) -> dict:
    """Previous-token and induction score, the K-composition of the previous-token head into the
    induction head against its random baseline, and (given held-out ids [batch, 129+]) the
    in-context-learning score.

    `heads` = (previous-token head, induction head), e.g. ("L1H0", "L3H1"), follows one circuit over
    snapshots (`phase_heads` of the final model picks it); by default each snapshot's best heads."""
    prev, ind = _followed(model, heads)
    if tokens is not None:
        tokens = icl_tokens(model, tokens)  # checked before any work
    prev, prev_score = _score(head_scores(model, "previous_token"), prev)
    ind, ind_score = _score(head_scores(model, "induction"), ind)
    out = {"previous-token score": prev_score, "induction score": ind_score}
    if ind.layer > prev.layer:  # each snapshot's own best heads may be in any order: then there is no K-composition
        row = composition_scores(model, "k").set_index(["sender", "receiver"]).loc[(prev.label, ind.label)]
        out["K-composition (x random)"] = float(row.score / row.baseline)
    if tokens is not None:
        out["in-context score (late - early loss)"] = icl_score(model, tokens)
    return out


def phase_table(measures: dict) -> pd.DataFrame:
    """{tokens seen: phase_measures(...)} -> one row per snapshot and measure: `tokens`, `measure`, `value`."""
    rows = [(t, m, v) for t, d in sorted(measures.items()) for m, v in d.items()]
    return pd.DataFrame(rows, columns=["tokens", "measure", "value"])
