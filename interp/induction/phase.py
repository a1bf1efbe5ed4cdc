"""The measures that move together at the induction phase change (Olsson et al. 2022), for one model.

A training run's snapshots are each measured with `phase_measures`; plotted against training tokens
they show the previous-token head, the induction head, the K-composition between them and the
in-context-learning score changing at the same time.

The in-context-learning score is Olsson et al.'s loss late in the context minus loss early in it
(their tokens 500 and 50 of 512). Scaled to a 128-token context: the mean loss at positions
`LATE` = 112..127 minus the mean at `EARLY` = 8..23 (of windows of 128 held-out tokens); a model
that uses its context has a negative score.

Controls: a measure that rises for every head pair says nothing about this circuit. `control_pairs`
picks, for the followed pair (previous-token head -> induction head), the other heads of the induction
head's layer fed by the same previous-token head and the other heads of the previous-token head's layer
feeding the induction head; `phase_measures(controls=...)` adds their K-composition, and every tracked
pair's percentile among all the model's composing pairs, to each snapshot.

Abrupt: `phase_change` says whether the snapshots resolve a change at all (criterion in its docstring):
two snapshots that bracket a rise show that it happened between them, not that it was sudden.
"""
from __future__ import annotations

import warnings
from typing import Optional, Sequence

import pandas as pd
import torch
from jaxtyping import Int

from sprout.tl.text import check_tokens

from .._core.inputs import TextOrTokens, sequences
from .._core.model import HookedModel, logits_of
from .._core.specs import Head, HeadSpec, as_heads
from ..heads import composition_scores, head_scores

EARLY, LATE = range(8, 24), range(112, 128)


def icl_tokens(model: HookedModel, tokens: TextOrTokens) -> Int[torch.Tensor, "batch 129"]:
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
def icl_score(model: HookedModel, data: TextOrTokens) -> float:
    """Mean loss at positions LATE minus mean loss at positions EARLY, over ids [batch, 129+] (nats);
    `data` as `icl_tokens` takes it."""
    ids = icl_tokens(model, data)
    logits = logits_of(model, ids[:, :-1])
    loss = torch.nn.functional.cross_entropy(logits.float().transpose(1, 2), ids[:, 1:], reduction="none")  # [batch, pos]
    return float(loss[:, LATE].mean() - loss[:, EARLY].mean())


def phase_heads(model: HookedModel) -> tuple[str, str]:
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


def _followed(model: HookedModel, heads) -> tuple[Optional[Head], Optional[Head]]:
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


def control_pairs(model: HookedModel, heads: tuple[str, str]) -> list[tuple[str, str]]:
    """Control pairs for the followed (previous-token head, induction head): the previous-token head into
    each other head of the induction head's layer, and each other head of the previous-token head's
    layer into the induction head."""
    prev, ind = _followed(model, heads)
    if prev is None or ind is None:
        raise ValueError("control_pairs needs heads=(previous-token head, induction head), e.g. ('L1H0', 'L3H1')")
    H = int(model.cfg.n_heads)
    return ([(prev.label, Head(ind.layer, h).label) for h in range(H) if h != ind.head]
            + [(Head(prev.layer, h).label, ind.label) for h in range(H) if h != prev.head])


def _composition(model: HookedModel, pairs: list[tuple[str, ...]]) -> dict:
    comp = composition_scores(model, "k").set_index(["sender", "receiver"])
    out = {}
    for i, (s, r) in enumerate(pairs):
        row = comp.loc[(s, r)]
        name = "K-composition" if i == 0 else f"control {s} -> {r}: K-composition"
        out[f"{name} (x random)"] = float(row.score / row.baseline)
        out[f"{name} percentile"] = float(row.percentile)
    return out


def phase_measures(model: HookedModel, data: Optional[TextOrTokens] = None, heads: Optional[tuple[str, str]] = None,
                   controls: Optional[Sequence[Sequence[HeadSpec]]] = None) -> dict:
    """Previous-token and induction score, the K-composition of the previous-token head into the
    induction head against its random baseline, and (given held-out ids [batch, 129+]) the
    in-context-learning score.

    `heads` = (previous-token head, induction head), e.g. ("L1H0", "L3H1"), follows one circuit over
    snapshots (`phase_heads` of the final model picks it); by default each snapshot's best heads.
    `controls`: (sender, receiver) pairs (e.g. `control_pairs(final_model, heads)`) whose K-composition
    is tracked beside the circuit's; every tracked pair also gets its percentile among all the model's
    composing pairs ("... percentile", 0-100)."""
    prev, ind = _followed(model, heads)
    if data is not None:
        data = icl_tokens(model, data)  # checked before any work
    prev, prev_score = _score(head_scores(model, "previous_token"), prev)
    ind, ind_score = _score(head_scores(model, "induction"), ind)
    out = {"previous-token score": prev_score, "induction score": ind_score}
    if ind.layer > prev.layer:  # each snapshot's own best heads may be in any order: then there is no K-composition
        tracked: list[tuple[str, ...]] = [(prev.label, ind.label)]
        tracked += [tuple(h.label for h in as_heads(model, list(pair), "controls")) for pair in (controls or [])]
        out.update(_composition(model, tracked))
    if data is not None:
        out["in-context score (late - early loss)"] = icl_score(model, data)
    return out


def phase_table(measures: dict) -> pd.DataFrame:
    """{tokens seen: phase_measures(...)} -> one row per snapshot and measure: `tokens`, `measure`, `value`."""
    rows = [(t, m, v) for t, d in sorted(measures.items()) for m, v in d.items()]
    return pd.DataFrame(rows, columns=["tokens", "measure", "value"])


def phase_change(table: pd.DataFrame, measure: str = "induction score", share: float = 0.5,
                 abrupt_fraction: float = 0.25) -> dict:
    """Where a measure of a `phase_table` changes most, and whether the snapshots resolve it.

    The way is from the measure's first value to its extreme (its maximum if it rises more than it falls,
    else its minimum). The change is the shortest stretch between two snapshots over which the measure
    covers at least `share` of that way. It is `resolved` when some snapshot lies strictly inside that
    stretch (the snapshots saw the change happen, not only its two sides), and `abrupt` when it is
    resolved and spans at most `abrupt_fraction` of the training tokens seen by its end.

    Returns:
        {"measure", "start_tokens", "end_tokens", "start_value", "end_value", "first", "extreme",
        "inside" (snapshots strictly inside), "resolved", "abrupt", "text" (one sentence saying so)}.
    """
    rows = table[table["measure"] == measure].sort_values("tokens")
    if len(rows) < 2:
        raise ValueError(f"the phase table has {len(rows)} snapshot(s) of {measure!r}: a change needs at least two")
    t, v = rows["tokens"].to_numpy(dtype=float), rows["value"].to_numpy(dtype=float)
    first = v[0]
    extreme = v.max() if v.max() - first >= first - v.min() else v.min()
    if extreme == first:
        return dict(measure=measure, start_tokens=None, end_tokens=None, start_value=first, end_value=first, first=first,
                    extreme=first, inside=0, resolved=False, abrupt=False, text=f"{measure} does not change over the snapshots")
    sign = 1.0 if extreme > first else -1.0
    need = share * abs(extreme - first)
    stretches = [(t[j] - t[i], -sign * (v[j] - v[i]), i, j) for i in range(len(v)) for j in range(i + 1, len(v))
                 if sign * (v[j] - v[i]) >= need]
    _, _, start, end = min(stretches)
    inside = end - start - 1
    resolved = inside > 0
    abrupt = resolved and (t[end] - t[start]) <= abrupt_fraction * t[end]
    how = ("abruptly" if abrupt else "gradually") if resolved else "somewhere"
    text = (f"{measure} moves from {v[start]:.2f} to {v[end]:.2f} ({abs(v[end] - v[start]) / abs(extreme - first):.0%} of "
            f"its way from {first:.2f} to {extreme:.2f}) {how} between {t[start]:,.0f} and {t[end]:,.0f} training tokens "
            f"({inside} snapshot(s) inside" + ("" if resolved else ": the snapshots bracket the change but do not resolve it")
            + ")")
    return dict(measure=measure, start_tokens=float(t[start]), end_tokens=float(t[end]), start_value=float(v[start]),
                end_value=float(v[end]), first=float(first), extreme=float(extreme), inside=inside, resolved=resolved,
                abrupt=bool(abrupt), text=text)
