"""Gradient estimates of every edge's effect: EAP and EAP-IG, from a few backward passes.

score(u -> v) = (clean_u - ablated_u) . dm/d(input of v), summed over batch and positions: the
first-order estimate of metric(clean) - metric(u -> v ablated) (Syed, Rager & Conmy 2023). The gradient
is taken on each receiver's own copy of the stream (split inputs), so one backward pass gives every
edge's score.

EAP takes the gradient at the clean run, and misses an edge whose effect runs through a saturated
nonlinearity (a sharp softmax, a probability near 1): the gradient there is ~0 while patching moves
the metric a lot. EAP-IG (Hanna, Pezzelle & Belinkov 2024) averages the gradient over `steps` points
on a straight path from the ablated to the clean values, alpha = k / steps for k = 1..steps (a Riemann
sum of integrated gradients): "inputs" moves the embedding alone, one pass per step; "activations"
moves one layer's senders at a time (the embedding, each layer's heads, each MLP) with everything
else computed as usual, steps x (1 + 2 n_layers) passes.
"""
from __future__ import annotations

from typing import Any, Optional

import torch
from jaxtyping import Float

from .edges import EdgeGraph
from .patching import EdgePass, Metric, metric_value, run_pass


def receiver_grads(model: Any, graph: EdgeGraph, clean: torch.Tensor, edge_pass: EdgePass, metric: Metric
                   ) -> Float[torch.Tensor, "batch pos receiver d_model"]:
    """dm/d(input of each receiver) in one forward and backward with `edge_pass` (track=True)."""
    with torch.enable_grad():
        value = metric_value(metric, run_pass(model, clean, edge_pass))
        if not value.requires_grad:
            raise ValueError("metric has no gradient: EAP and EAP-IG differentiate it through the model, so it "
                             "must be computed from the logits with torch operations (not .item(), argmax or "
                             "detach); a non-differentiable metric can use method='exact' or 'acdc'")
        cols = sorted(edge_pass.received)
        inputs = [edge_pass.received[c] for c in cols]
        grads = torch.autograd.grad(value, inputs, allow_unused=True)
    parts = [torch.zeros_like(x) if g is None else g for x, g in zip(inputs, grads)]
    return torch.cat(parts, dim=2).detach()


def _scores(graph: EdgeGraph, delta: torch.Tensor, grads: torch.Tensor) -> Float[torch.Tensor, " edge"]:
    """(clean - ablated) [batch, pos, sender, d] . grads [batch, pos, receiver, d], summed, at the edges."""
    dense = torch.einsum("bpsd,bprd->sr", delta.double(), grads.double())
    return graph.flat(dense)


def eap(model: Any, graph: EdgeGraph, clean: torch.Tensor, outs: torch.Tensor, ablated: torch.Tensor,
        metric: Metric) -> Float[torch.Tensor, " edge"]:
    """EAP: one forward and one backward at the clean run. Returns scores [edge]."""
    grads = receiver_grads(model, graph, clean, EdgePass(graph, ablated, track=True), metric)
    return _scores(graph, outs - ablated, grads)


def _alphas(steps: int) -> list[float]:
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ValueError(f"steps must be a whole number >= 1 (the points on EAP-IG's path), got {steps!r}")
    return [k / steps for k in range(1, steps + 1)]


def eap_ig_inputs(model: Any, graph: EdgeGraph, clean: torch.Tensor, outs: torch.Tensor, ablated: torch.Tensor,
                  metric: Metric, steps: int = 5) -> Float[torch.Tensor, " edge"]:
    """EAP-IG on the inputs: the embedding moves from its ablated to its clean value, `steps` passes."""
    total: Optional[torch.Tensor] = None
    emb_clean, emb_ablated = outs[:, :, :1], ablated[:, :, :1]
    for a in _alphas(steps):
        def blend(first: int, x: torch.Tensor, a: float = a) -> torch.Tensor:
            return emb_ablated + a * (emb_clean - emb_ablated) if first == 0 else x
        g = receiver_grads(model, graph, clean, EdgePass(graph, ablated, sender_fn=blend, track=True), metric)
        total = g if total is None else total + g
    assert total is not None
    return _scores(graph, outs - ablated, total / steps)


def _groups(graph: EdgeGraph) -> list[tuple[int, int]]:
    """(first sender, count) of each group EAP-IG-activations moves at once: the embedding, each layer's heads, each MLP."""
    H = graph.n_heads
    out = [(0, 1)]
    for l in range(graph.n_layers):
        out += [(1 + l * (H + 1), H), (1 + l * (H + 1) + H, 1)]
    return out


def eap_ig_activations(model: Any, graph: EdgeGraph, clean: torch.Tensor, outs: torch.Tensor, ablated: torch.Tensor,
                       metric: Metric, steps: int = 5) -> Float[torch.Tensor, " edge"]:
    """EAP-IG on the activations: each group of senders moves alone along its path; steps x (1 + 2L) passes."""
    alphas = _alphas(steps)
    delta = outs - ablated
    dense = torch.zeros(graph.n_senders, graph.n_receivers, dtype=torch.float64, device=delta.device)
    for first, count in _groups(graph):
        total: Optional[torch.Tensor] = None
        for a in alphas:
            def blend(f: int, x: torch.Tensor, a: float = a, first: int = first, count: int = count) -> torch.Tensor:
                if f != first:
                    return x
                lo, hi = ablated[:, :, first:first + count], outs[:, :, first:first + count]
                return lo + a * (hi - lo)
            g = receiver_grads(model, graph, clean, EdgePass(graph, ablated, sender_fn=blend, track=True), metric)
            total = g if total is None else total + g
        assert total is not None
        part = delta[:, :, first:first + count].double()
        dense[first:first + count] = torch.einsum("bpsd,bprd->sr", part, (total / steps).double())
    return graph.flat(dense)
