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

from typing import Optional

import pandas as pd
import torch

from ._model import logits_of
from .composition import composition_scores
from .heads import head_scores
from .path_patching import as_node

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


def phase_heads(model) -> tuple[str, str]:
    """The circuit to follow over training: the best induction head ("L{l}H{h}") and the best
    previous-token head in a layer below it (the head that can feed its keys)."""
    ind = head_scores(model, "induction").iloc[0]
    prev = head_scores(model, "previous_token")
    prev = prev[prev["layer"] < int(ind.layer)]
    if prev.empty:
        raise ValueError(f"the best induction head L{int(ind.layer)}H{int(ind['head'])} is in the first layer: "
                         "no earlier head can feed it")
    return f"L{int(prev.iloc[0].layer)}H{int(prev.iloc[0]['head'])}", f"L{int(ind.layer)}H{int(ind['head'])}"


def _score(model, frame: pd.DataFrame, label) -> tuple[str, float]:
    """(label, score) of head `label` in a head_scores frame, or of its best head when `label` is None."""
    if label is None:
        row = frame.iloc[0]
        return f"L{int(row.layer)}H{int(row['head'])}", float(row.score)
    node = as_node(model, label)
    if node.kind != "head":
        raise ValueError(f"phase_measures follows heads ('L{{layer}}H{{head}}'), got {label!r}")
    row = frame[(frame["layer"] == node.layer) & (frame["head"] == node.head)]
    return node.label, float(row.score.iloc[0])


def phase_measures(model, tokens=None, heads: Optional[tuple[str, str]] = None) -> dict:
    """Previous-token and induction score, the K-composition of the previous-token head into the
    induction head against its random baseline, and (given held-out ids [batch, 129+]) the
    in-context-learning score.

    `heads` = (previous-token head, induction head), e.g. ("L1H0", "L3H1"), follows one circuit over
    snapshots (`phase_heads` of the final model picks it); by default each snapshot's best heads."""
    prev, ind = heads if heads is not None else (None, None)
    prev, prev_score = _score(model, head_scores(model, "previous_token"), prev)
    ind, ind_score = _score(model, head_scores(model, "induction"), ind)
    out = {"previous-token score": prev_score, "induction score": ind_score}
    if as_node(model, ind).layer > as_node(model, prev).layer:
        row = composition_scores(model, "k").set_index(["sender", "receiver"]).loc[(prev, ind)]
        out["K-composition (x random)"] = float(row.score / row.baseline)
    if tokens is not None:
        out["in-context score (late - early loss)"] = icl_score(model, tokens)
    return out


def phase_table(measures: dict) -> pd.DataFrame:
    """{tokens seen: phase_measures(...)} -> one row per snapshot and measure: `tokens`, `measure`, `value`."""
    rows = [(t, m, v) for t, d in sorted(measures.items()) for m, v in d.items()]
    return pd.DataFrame(rows, columns=["tokens", "measure", "value"])
