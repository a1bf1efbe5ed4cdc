"""Interventions guided by a graph: set or scale a feature, or a supernode (a group of features), in the
real model, and compare the change of the logit targets with what the graph predicts.

An edit of feature f (layer l, position p) from activation a to a' is made as in a model with its
transcoder spliced in with the error term (`interp.spliced(..., use_error_term=True)`): the MLP output at
(l, p) becomes reconstruction(edited) + error(clean) = true output + (a' - a) W_dec[f], so everything else
runs as the model does. That change is added at the transcoder's output hook, in three regimes:

* "frozen attention and norms": every attention pattern and norm scale held at the prompt's values
  (downstream MLPs and features respond);
* "frozen attention": patterns held, norms live;
* "free": nothing held.

Predictions from the graph, for a logit target t: "predicted_direct" = sum_f (a'_f / a_f - 1) A[t, f],
the direct effect, exact in the fully frozen model (MLPs held too); "predicted_total" adds the paths
through other features, each feature's activation moving with its pre-activation (slope 1: the
linearisation of an active ReLU or TopK latent). Beside the chosen features, random groups of other
feature nodes of about the same activation (one drawn among the nearest in activation for each chosen
feature), edited the same way, are a baseline: an edit that moves the logits no more than theirs says little.
"""
from __future__ import annotations

from typing import Optional, Sequence, Union

import pandas as pd
import torch

from .._core.model import HookedModel
from .attribution import _replacement
from .dictionaries import TranscoderInput
from .graph import Graph
from .replacement import ReplacementModel, frozen_hook_names

REGIMES = ("frozen attention and norms", "frozen attention", "free")


def intervene(model: Union[HookedModel, ReplacementModel], graph: Graph, features: Sequence[int], *,
              scale: Optional[float] = None, value: Optional[float] = None, transcoders: TranscoderInput = None,
              dtype: Optional[torch.dtype] = None, n_random: int = 5, seed: int = 0) -> pd.DataFrame:
    """Edit feature nodes of `graph` in the real model and compare with the graph's predictions.

    Args:
        model, transcoders, dtype: as given to `interp.attribute` for this graph.
        graph: the attribution graph of the prompt.
        features: feature node indices (one, or a supernode's).
        scale: multiply each activation by this; or `value`: set each to this.
        n_random: random baseline groups; seed: their draw.

    Returns:
        DataFrame, one row per (intervention, regime, logit target): intervention ("chosen", "random 0",
        ...), nodes (the feature nodes edited), regime, logit (the target's text), vocab_index,
        predicted_direct, predicted_total, measured (the change of the demeaned logit).
    """
    if (scale is None) == (value is None):
        raise ValueError("give exactly one of scale= (multiply the activations) or value= (set them)")
    chosen = _check_features(graph, features)
    rm = _replacement(model, transcoders, dtype, graph.prefix)
    groups = [("chosen", chosen)] + [(f"random {i}", g) for i, g in enumerate(_random_groups(graph, chosen, n_random, seed))]
    tokens = graph.input_tokens
    frozen = rm.freeze(tokens)
    directions = _directions(graph, frozen.logits.dtype)
    rows = []
    for name, group in groups:
        fractions = _fractions(graph, group, scale, value)
        direct, total = _predictions(graph, fractions)
        for regime in REGIMES:
            measured = _measure(rm, frozen, graph, fractions, regime, directions)
            for k, (text, idx) in enumerate(graph.logit_targets):
                rows.append({"intervention": name, "nodes": list(group), "regime": regime, "logit": text,
                             "vocab_index": idx, "predicted_direct": float(direct[k]), "predicted_total": float(total[k]),
                             "measured": float(measured[k])})
    return pd.DataFrame(rows)


def _check_features(graph: Graph, features: Sequence[int]) -> list[int]:
    items: list = [features] if isinstance(features, int) else list(features)
    if not items:
        raise ValueError("features is empty: give feature node indices of the graph")
    bad = [f for f in items if isinstance(f, bool) or not isinstance(f, int) or not 0 <= f < graph.n_features]
    if bad:
        raise ValueError(f"feature node(s) {bad} are not feature nodes of the graph (0..{graph.n_features - 1})")
    return items


def _random_groups(graph: Graph, chosen: list[int], n: int, seed: int) -> list[list[int]]:
    """Groups of other feature nodes, each member drawn among the 5 nodes nearest in activation to one chosen."""
    acts = graph.activation_values[graph.selected_features].double()
    others = torch.tensor([i for i in range(graph.n_features) if i not in set(chosen)], dtype=torch.long)
    if len(others) < len(chosen):
        return []
    g = torch.Generator().manual_seed(seed)
    groups = []
    for _ in range(n):
        group: list[int] = []
        for c in chosen:
            pool = [i for i in others[(acts[others] - acts[c]).abs().argsort()].tolist() if i not in group][:5]
            group.append(pool[int(torch.randint(len(pool), (1,), generator=g))])
        groups.append(group)
    return groups


def _fractions(graph: Graph, group: list[int], scale, value) -> dict[int, float]:
    """{feature node: a'/a - 1}, the change of its source in units of its column."""
    acts = graph.activation_values[graph.selected_features]
    return {f: (float(scale) - 1.0 if scale is not None else float(value) / float(acts[f]) - 1.0) for f in group}


def _predictions(graph: Graph, fractions: dict[int, float]) -> tuple[torch.Tensor, torch.Tensor]:
    """(direct, total) predicted change of each logit target."""
    A = graph.adjacency_matrix.double()
    n_f, logits = graph.n_features, graph.slices()["logit"]
    delta = torch.zeros(graph.n_nodes, dtype=torch.float64)
    for f, frac in fractions.items():
        delta[f] = frac
    direct = A[logits] @ delta
    acts = graph.activation_values[graph.selected_features].double()
    pinned = torch.tensor(list(fractions), dtype=torch.long)
    current, total = delta.clone(), delta.clone()
    for _ in range(graph.n_layers + 1):  # a feature's pre-activation change over its activation: its own fraction
        current = torch.zeros_like(current).index_copy(0, torch.arange(n_f), (A[:n_f] @ current) / acts)
        current[pinned] = 0  # the edited features are set, not free to respond
        if not bool(current.any()):
            break
        total += current
    return direct, A[logits] @ total


def _directions(graph: Graph, dtype: torch.dtype) -> torch.Tensor:
    V = graph.vocab_size
    out = torch.full((graph.n_logits, V), -1.0 / V, dtype=dtype)
    for k, (_, idx) in enumerate(graph.logit_targets):
        if idx >= V:
            raise ValueError("interventions measure token targets; this graph has a direction target")
        out[k, idx] += 1.0
    return out


def _measure(rm: ReplacementModel, frozen, graph: Graph, fractions: dict[int, float], regime: str,
             directions: torch.Tensor) -> torch.Tensor:
    """The change of each logit target's value when the features move by their fractions, in `regime`."""
    held = [n for n in frozen_hook_names(rm.model) if regime == "frozen attention and norms" or
            (regime == "frozen attention" and n.endswith("hook_pattern"))]
    hooks = [(n, (lambda v: lambda act, hook: v)(frozen.frozen[n])) for n in held]
    d = rm.dicts
    adds: dict[int, torch.Tensor] = {}
    for f, frac in fractions.items():
        layer, pos, feat = graph.active_features[graph.selected_features[f]].tolist()
        a = frozen.acts[layer][pos, feat]
        for out in d.writes(layer):
            add = adds.setdefault(out, torch.zeros_like(frozen.mlp_out[out]))
            add[pos] += frac * a * d.decoder(layer, out)[feat]
    hooks += [(d.output_hook(out), (lambda x: lambda act, hook: act + x.to(act.dtype))(add)) for out, add in adds.items()]
    with torch.no_grad():
        logits = rm.model.run_with_hooks(frozen.tokens[None], fwd_hooks=hooks)[0, -1]
    return directions @ (logits - frozen.logits[-1]).cpu()
