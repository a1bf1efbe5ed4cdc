"""Circuit search by patching: ACDC (with a threshold sweep) and edge pruning (a learned mask).

ACDC (Conmy et al. 2023): start from the whole graph; visit receivers from the logits backwards
(latest layer first) and, for each, its incoming edges from the latest sender back; ablate the edge for
good when the metric moves by less than tau from its current value, else keep it. One forward per edge
and tau, greedy and order-dependent. A sweep of taus makes it a ranking (as auto-circuit does): an
edge's score is the largest tau at which it survives (0 if it survives none). The default taus are
log-spaced fractions of |metric(clean) - metric(all ablated)|, so the sweep does not depend on the
metric's units.

Edge pruning (Bhaskar et al. 2024, with a sigmoid mask instead of their hard-concrete one): a weight
keep = sigmoid(theta) per edge, optimised with Adam to keep the metric at its clean value,
((m(keep) - m(clean)) / |m(clean) - m(none)|)^2, plus `sparsity` x the mean weight; the score is the
learned weight sigmoid(theta), and the circuit the edges above 1/2.
"""
from __future__ import annotations

from typing import Any, Optional, Sequence

import torch
from jaxtyping import Float

from .edges import EdgeGraph
from .patching import EdgePass, Metric, circuit_metric, metric_value, run_pass

DEFAULT_TAUS = tuple(float(x) for x in torch.logspace(-4, -0.3, 16))


def acdc_order(graph: EdgeGraph) -> list[int]:
    """Edge indices in ACDC's visiting order: receivers from the logits back, senders latest first."""
    s, r = graph.index()
    order = sorted(range(graph.n_edges), key=lambda e: (-int(r[e]), -int(s[e])))
    return order


def _node_sender(graph: EdgeGraph, r: int) -> int:
    """The sender index of the node that receiver column `r` belongs to (-1 for the logits)."""
    if r == graph.logits_column:
        return -1
    l, i = divmod(r, 3 * graph.n_heads + 1)
    return 1 + l * (graph.n_heads + 1) + (graph.n_heads if i == 3 * graph.n_heads else i % graph.n_heads)


def acdc_circuit(model: Any, graph: EdgeGraph, clean: torch.Tensor, ablated: torch.Tensor, metric: Metric,
                 tau: float) -> Float[torch.Tensor, " edge"]:
    """ACDC at one threshold `tau` (in the metric's units): keep [edge], 1 for the edges it keeps, 0 else.

    A node none of whose outgoing edges is kept reaches nothing, so its incoming edges go without a
    forward (ACDC only visits nodes still connected to the output)."""
    s, r = graph.index()
    keep = torch.ones(graph.n_edges)
    current = circuit_metric(model, graph, clean, ablated, metric, keep)
    for e in acdc_order(graph):
        node = _node_sender(graph, int(r[e]))
        keep[e] = 0.0
        if node >= 0 and not bool((keep[s == node] > 0).any()):
            continue
        trial = circuit_metric(model, graph, clean, ablated, metric, keep)
        if abs(trial - current) < tau:
            current = trial
        else:
            keep[e] = 1.0
    return keep


def acdc_scores(model: Any, graph: EdgeGraph, clean: torch.Tensor, ablated: torch.Tensor, metric: Metric,
                taus: Optional[Sequence[float]] = None) -> Float[torch.Tensor, " edge"]:
    """ACDC over a sweep of thresholds: each edge's largest surviving tau [edge] (0: pruned at every tau).

    taus: thresholds as fractions of |metric(clean) - metric(every edge ablated)|; default 16 log-spaced
    from 1e-4 to 0.5."""
    fractions = sorted(DEFAULT_TAUS if taus is None else taus)
    if not fractions or any(not 0 < t for t in fractions):
        raise ValueError(f"taus must be positive fractions of the metric's full range, got {list(fractions)}")
    n = graph.n_edges
    span = abs(circuit_metric(model, graph, clean, ablated, metric, torch.ones(n))
               - circuit_metric(model, graph, clean, ablated, metric, torch.zeros(n)))
    scores = torch.zeros(n, dtype=torch.float64)
    for t in fractions:
        kept = acdc_circuit(model, graph, clean, ablated, metric, t * span)
        scores[kept > 0] = t
    return scores


def mask_scores(model: Any, graph: EdgeGraph, clean: torch.Tensor, ablated: torch.Tensor, metric: Metric,
                steps: int = 200, sparsity: float = 0.1, lr: float = 0.1, seed: int = 0) -> Float[torch.Tensor, " edge"]:
    """Edge pruning with a sigmoid mask: the learned weights sigmoid(theta) [edge] in (0, 1) (1: kept)."""
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ValueError(f"steps must be a whole number >= 1 (optimiser steps of the mask), got {steps!r}")
    n = graph.n_edges
    target = circuit_metric(model, graph, clean, ablated, metric, torch.ones(n))
    span = abs(target - circuit_metric(model, graph, clean, ablated, metric, torch.zeros(n))) or 1.0
    g = torch.Generator().manual_seed(seed)
    theta = (3.0 + 0.01 * torch.randn(n, generator=g)).requires_grad_(True)
    opt = torch.optim.Adam([theta], lr=lr)
    frozen = [p for p in model.parameters() if p.requires_grad]
    for p in frozen:
        p.requires_grad_(False)
    try:
        for _ in range(steps):
            opt.zero_grad()
            keep = torch.sigmoid(theta)
            with torch.enable_grad():
                value = metric_value(metric, run_pass(model, clean, EdgePass(graph, ablated, keep)))
                if not value.requires_grad:
                    raise ValueError("metric has no gradient: edge pruning optimises the mask through it, so it must be "
                                     "computed from the logits with torch operations (not .item(), argmax or detach)")
                loss = ((value - target) / span) ** 2 + sparsity * keep.mean()
                loss.backward()
            opt.step()
    finally:
        for p in frozen:
            p.requires_grad_(True)
    return torch.sigmoid(theta.detach().double())
