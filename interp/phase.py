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

import pandas as pd
import torch

from ._model import logits_of
from .composition import composition_scores
from .heads import head_scores

EARLY, LATE = range(8, 24), range(112, 128)


@torch.inference_mode()
def icl_score(model, tokens: torch.Tensor) -> float:
    """Mean loss at positions LATE minus mean loss at positions EARLY, over ids [batch, 128+] (nats)."""
    if tokens.dim() != 2 or tokens.shape[1] < LATE.stop + 1:
        raise ValueError(f"the in-context-learning score needs ids [batch, >= {LATE.stop + 1}], got {tuple(tokens.shape)}")
    ids = tokens[:, :LATE.stop + 1]
    logits = logits_of(model, ids[:, :-1])
    loss = torch.nn.functional.cross_entropy(logits.float().transpose(1, 2), ids[:, 1:], reduction="none")  # [batch, pos]
    return float(loss[:, LATE].mean() - loss[:, EARLY].mean())


def phase_measures(model, tokens=None) -> dict:
    """Previous-token and induction score of the best head, the K-composition of the best previous-token
    head into the best induction head against its random baseline, and (given held-out ids [batch, 129+])
    the in-context-learning score."""
    prev = head_scores(model, "previous_token").iloc[0]
    ind = head_scores(model, "induction").iloc[0]
    out = {"previous-token score": float(prev.score), "induction score": float(ind.score)}
    if int(ind.layer) > int(prev.layer):
        k = composition_scores(model, "k").set_index(["sender", "receiver"])
        row = k.loc[(f"L{int(prev.layer)}H{int(prev['head'])}", f"L{int(ind.layer)}H{int(ind['head'])}")]
        out["K-composition (x random)"] = float(row.score / row.baseline)
    if tokens is not None:
        out["in-context score (late - early loss)"] = icl_score(model, tokens)
    return out


def phase_table(measures: dict) -> pd.DataFrame:
    """{tokens seen: phase_measures(...)} -> one row per snapshot and measure: `tokens`, `measure`, `value`."""
    rows = [(t, m, v) for t, d in sorted(measures.items()) for m, v in d.items()]
    return pd.DataFrame(rows, columns=["tokens", "measure", "value"])
