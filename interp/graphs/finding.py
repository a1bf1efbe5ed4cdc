"""The demo finding: how a model copies the next piece of a repeated invented name, read off its attribution graph.

A prompt that ends inside a name's second occurrence ("... Zorbin Plax ... Zorbin") ends with tokens that
match an earlier stretch (the first occurrence); the piece that followed that stretch (" P") is the
correct next piece, and only copying predicts it. `copy_site` finds the stretch from the tokens alone
(the longest earlier match of the prompt's last tokens). `name_copy` builds the graph of that piece's
(demeaned) logit and splits the logit's direct attribution into groups of nodes defined by rule from the
graph: every non-logit node falls in exactly one, and the groups plus the constant (biases, the held
prefix, features beyond a cap) sum to the logit's value.

Feature groups (supernodes) use each feature's input: the share of its incoming |attribution| that comes
from nodes at a given position. Through the frozen attention a feature at one position reads nodes at
others, so a feature reading mostly from elsewhere is one that attention feeds:

* copy features at the current position: features there reading more from the earlier next piece's
  position than from their own (what an induction head moved);
* previous-token features: features at the earlier next piece reading more from the position before it
  (the earlier copy of the current piece) than from their own (what a previous-token head moved);
* features at the earlier next piece: the other features there (the piece itself).

Head loadings (`head_loadings`) name the heads carrying the edges from the earlier next piece's position
into the logit and into the copy features. `copy_interventions` ablates each supernode in the real model
(`intervene`, three regimes) beside random features of the same activation.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence, Union

import pandas as pd
import torch

from .._core.inputs import TextOrTokens
from .._core.model import HookedModel
from .attribution import _replacement, attribute
from .dictionaries import TranscoderInput
from .graph import Graph
from .heads import head_loadings
from .interventions import REGIMES, intervene
from .replacement import ReplacementModel

SUPERNODES = ("copy features at the current position", "features at the earlier next piece", "previous-token features")
GROUPS = SUPERNODES[:1] + ("other features at the current position", "the earlier next piece's token") + SUPERNODES[1:] + (
    "the current token", "the earlier name's matching tokens", "errors at the current position", "other errors", "other tokens",
    "other features", "constant")


@dataclass(frozen=True)
class CopySite:
    """Where a prompt copies from: positions in its tokens.

    Attributes:
        current: the last position (the piece just read).
        match_start, match_end: the earlier stretch equal to the prompt's last match_end - match_start + 1
            tokens (the name's first occurrence, up to the piece matching the current one).
        source: match_end + 1, the earlier next piece.
        target: the token id at source: the correct next piece.
    """

    current: int
    match_start: int
    match_end: int
    source: int
    target: int

    @property
    def length(self) -> int:
        return self.match_end - self.match_start + 1


def copy_site(tokens: Union[torch.Tensor, Sequence[int]]) -> CopySite:
    """The longest earlier stretch matching the end of `tokens` [pos] (the latest one among equals), and the
    token that followed it. A ValueError if the last token never occurred before with a token after it."""
    ids = [int(t) for t in (tokens.reshape(-1).tolist() if isinstance(tokens, torch.Tensor) else tokens)]
    q = len(ids) - 1
    best: Optional[tuple[int, int]] = None  # (length, end)
    for end in range(q - 1, -1, -1):
        n = 0
        # the stretch and the token after it (end + 1) end before the current tail (q - n + 1 ..) starts
        while n <= end and n < q - end - 1 and ids[end - n] == ids[q - n]:
            n += 1
        if n and (best is None or n > best[0]):
            best = (n, end)
    if best is None:
        raise ValueError("the prompt's last token occurs nowhere before it: a copying prompt ends with the first "
                         "piece(s) of a name's second occurrence (e.g. '... Zorbin Plax ... Zorbin')")
    n, end = best
    return CopySite(current=q, match_start=end - n + 1, match_end=end, source=end + 1, target=ids[end + 1])


@dataclass
class NameCopy:
    """What `name_copy` returns.

    Attributes:
        graph: the attribution graph with the correct next piece's logit as its one target.
        site: the CopySite.
        value: the target's value (the demeaned logit of the next piece at the last position).
        probability: the model's probability of the next piece; top1: whether it is the most probable.
        groups: DataFrame, one row per group of GROUPS (module docstring): group, nodes (node indices),
            n_nodes, attribution (the sum of their direct edges into the logit; the constant's is the rest),
            share (attribution / value). Attributions sum to value.
        heads: DataFrame, one row per (into, layer, head): into ("logit" or "copy features"), layer, head,
            share (the part of the edges from the earlier next piece's position carried by that head),
            fraction (share over those edges' sum).
    """

    graph: Graph
    site: CopySite
    value: float
    probability: float
    top1: bool
    groups: pd.DataFrame
    heads: pd.DataFrame

    def supernode(self, name: str) -> list[int]:
        """The feature nodes of a supernode (one of SUPERNODES)."""
        if name not in SUPERNODES:
            raise ValueError(f"supernode must be one of {SUPERNODES}, got {name!r}")
        return list(self.groups.set_index("group").loc[name, "nodes"])


def name_copy(model: Union[HookedModel, ReplacementModel], prompt: TextOrTokens, transcoders: TranscoderInput = None, *,
              max_feature_nodes: Optional[int] = None, batch_size: int = 256, dtype: Optional[torch.dtype] = None) -> NameCopy:
    """The attribution graph of copying a name's next piece, summarised (module docstring).

    Args:
        model, transcoders, max_feature_nodes, batch_size, dtype: as in `interp.attribute`.
        prompt: text or ids ending with the first piece(s) of a name's second occurrence.

    Returns:
        NameCopy: the graph, the site, the groups' shares of the logit and the heads carrying the copy.

    Example:
        >>> found = interp.graphs.name_copy(model, "A baker named Zorbin Plax baked bread. Zorbin")  # doctest: +SKIP
        >>> found.groups[["group", "share"]]                                                        # doctest: +SKIP
    """
    rm = _replacement(model, transcoders, dtype, 1)
    tokens = rm.tokens(prompt)
    site = copy_site(tokens)
    if site.source < rm.prefix or site.current < rm.prefix:
        raise ValueError("the earlier occurrence lies in the held prefix: put some text before the name")
    graph = attribute(rm, tokens, target=[site.target], max_feature_nodes=max_feature_nodes, batch_size=batch_size)
    with torch.no_grad():
        last = rm.model(tokens[None])[0, -1].double()
    value = float(last[site.target] - last.mean())
    probs = torch.softmax(last, -1)
    groups = _groups(graph, site, value)
    heads = _heads(rm, graph, site, groups)
    return NameCopy(graph, site, value, float(probs[site.target]), bool(int(probs.argmax()) == site.target), groups, heads)


def input_shares(graph: Graph, positions: Sequence[int]) -> torch.Tensor:
    """[n_features, len(positions)]: the share of each feature node's incoming |attribution| from nodes at
    each of `positions` (features, errors and tokens there)."""
    A = graph.adjacency_matrix[:graph.n_features].double().abs()
    pos = torch.tensor(graph.nodes["pos"].to_numpy())
    total = A.sum(1).clamp_min(1e-30)
    return torch.stack([A[:, pos == p].sum(1) / total for p in positions], 1)


def _groups(graph: Graph, site: CopySite, value: float) -> pd.DataFrame:
    nodes = graph.nodes
    kind, pos = nodes["kind"].to_numpy(), nodes["pos"].to_numpy()
    shares = input_shares(graph, [site.current, site.source, site.source - 1]).numpy()
    here, src, before = shares[:, 0], shares[:, 1], shares[:, 2]
    member: dict[str, list[int]] = {g: [] for g in GROUPS}
    for i in range(graph.slices()["logit"].start):
        member[_group_of(i, kind[i], int(pos[i]), site, here, src, before)].append(i)
    row = graph.adjacency_matrix[graph.slices()["logit"].start].double()
    records = []
    for g in GROUPS:
        attribution = float(row[member[g]].sum()) if g != "constant" else value - float(row.sum())
        records.append({"group": g, "nodes": member[g], "n_nodes": len(member[g]), "attribution": attribution,
                        "share": attribution / value if value else float("nan")})
    return pd.DataFrame(records)


def _group_of(i: int, kind: str, pos: int, site: CopySite, here, src, before) -> str:
    if kind == "token":
        if site.match_start <= pos <= site.match_end:
            return "the earlier name's matching tokens"
        return {site.source: "the earlier next piece's token", site.current: "the current token"}.get(pos, "other tokens")
    if kind == "error":
        return "errors at the current position" if pos == site.current else "other errors"
    if pos == site.current:
        return SUPERNODES[0] if src[i] > here[i] else "other features at the current position"
    if pos == site.source:
        return "previous-token features" if before[i] > src[i] else "features at the earlier next piece"
    return "other features"


def _heads(rm: ReplacementModel, graph: Graph, site: CopySite, groups: pd.DataFrame) -> pd.DataFrame:
    """Head loadings of the edges from the earlier next piece's position into the logit and into the copy
    features, summed per (layer, head) over those sources."""
    at_source = set(graph.nodes.index[graph.nodes["pos"] == site.source].tolist())
    copy = list(groups.set_index("group").loc[SUPERNODES[0], "nodes"])
    into = [("logit", graph.slices()["logit"].start, graph.n_layers)] + [
        ("copy features", f, int(graph.active_features[graph.selected_features[f], 0]) + 1) for f in copy]
    parts = []
    for label, target, n_blocks in into:
        for layer in range(n_blocks):  # a feature of layer l reads the attention of blocks 0..l
            frame = head_loadings(rm, graph, target, layer)
            frame = frame[frame["source"].isin(at_source) & (frame["head"] >= 0)]
            parts.append(frame.assign(into=label, layer=layer))
    cols = ["into", "layer", "head", "share", "fraction"]
    if not parts:
        return pd.DataFrame(columns=cols)
    heads = pd.concat(parts).groupby(["into", "layer", "head"], as_index=False)["share"].sum()
    total = {label: float(graph.adjacency_matrix[t, sorted(at_source)].double().sum()) for label, t, _ in into[:1]}
    total["copy features"] = float(graph.adjacency_matrix[copy][:, sorted(at_source)].double().sum()) if copy else 0.0
    heads["fraction"] = [s / total[i] if total[i] else float("nan") for i, s in zip(heads["into"], heads["share"])]
    return heads.sort_values(["into", "share"], ascending=[False, False], ignore_index=True)[cols]


def copy_interventions(model: Union[HookedModel, ReplacementModel], found: NameCopy, transcoders: TranscoderInput = None, *,
                       n_random: int = 20, seed: int = 0, dtype: Optional[torch.dtype] = None) -> pd.DataFrame:
    """Ablate (scale 0) each non-empty supernode of `found` in the real model (`intervene`), beside `n_random`
    random groups of features of the same activation.

    Returns:
        DataFrame, one row per (supernode, regime): supernode, regime, n_nodes, predicted_direct,
        predicted_total, measured (the change of the next piece's demeaned logit), random_median,
        random_p05 (the 5th percentile of the random groups' changes: a drop beyond it beats 95% of them),
        beats_random (measured < random_p05).
    """
    rows = []
    for name in SUPERNODES:
        nodes = found.supernode(name)
        if not nodes:
            continue
        frame = intervene(model, found.graph, nodes, scale=0.0, transcoders=transcoders, dtype=dtype,
                          n_random=n_random, seed=seed)
        for regime in REGIMES:
            part = frame[frame["regime"] == regime]
            chosen = part[part["intervention"] == "chosen"].iloc[0]
            random = part.loc[part["intervention"] != "chosen", "measured"]
            p05 = float(random.quantile(0.05)) if len(random) else float("nan")
            rows.append({"supernode": name, "regime": regime, "n_nodes": len(nodes),
                         "predicted_direct": float(chosen["predicted_direct"]),
                         "predicted_total": float(chosen["predicted_total"]), "measured": float(chosen["measured"]),
                         "random_median": float(random.median()) if len(random) else float("nan"), "random_p05": p05,
                         "beats_random": bool(len(random)) and float(chosen["measured"]) < p05})
    return pd.DataFrame(rows)
