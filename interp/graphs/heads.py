"""Head loadings: each edge into one target split exactly over the attention heads of one layer.

In the frozen model block k's attention adds sum_h result_h (each head's write, `blocks.{k}.attn.hook_result`,
linear in the stream before it: its pattern and ln1's scale are frozen) to the stream, so
resid_mid = resid_pre + sum_h result_h + b_O. A path from a source to the target passes block k's
attention through at most one head, or bypasses it along the residual stream; so the direct effect
splits exactly as edge = sum_h share_h + bypass. Each share is a backward pass in which only head h's
result (or only the bypass) carries the gradient across block k: the H + 1 of them run as one batch.
Sources after block k's attention (features of layer >= k, their errors) do not cross it: their whole
edge is the bypass.
"""
from __future__ import annotations

from typing import Callable, Optional, Union

import pandas as pd
import torch

from sprout.names import act_name

from .._core.model import HookedModel, n_heads
from .attribution import _replacement, _Rows, active_features
from .dictionaries import TranscoderInput
from .graph import Graph
from .replacement import ReplacementModel


def head_loadings(model: Union[HookedModel, ReplacementModel], graph: Graph, target: int, layer: int,
                  transcoders: TranscoderInput = None, *, dtype: Optional[torch.dtype] = None) -> pd.DataFrame:
    """Every edge into node `target` of `graph`, split over the heads of block `layer` (module docstring).

    Args:
        model: the model the graph was made from (or its ReplacementModel); transcoders and dtype as in
            `interp.attribute` (the same ones: the shares sum to the graph's edges).
        graph: an attribution graph.
        target: a feature or logit node of the graph (its index in node order).
        layer: the block whose heads split the edges.

    Returns:
        DataFrame, one row per (source node, part): source (node index), source_kind, head (0..n_heads-1,
        or -1 for the bypass), share (that part of the edge), edge (the graph's edge); only sources whose
        edge is not zero. For each source the shares sum to the edge.
    """
    rm = _replacement(model, transcoders, dtype, graph.prefix)
    H = n_heads(rm.model)
    if isinstance(layer, bool) or not isinstance(layer, int) or not 0 <= layer < rm.n_layers:
        raise ValueError(f"layer must be a block 0..{rm.n_layers - 1}, got {layer!r}")
    s = graph.slices()
    if not (0 <= target < s["error"].start or s["logit"].start <= target < graph.n_nodes):
        raise ValueError(f"target must be a feature node (0..{s['error'].start - 1}) or a logit node "
                         f"({s['logit'].start}..{graph.n_nodes - 1}) of the graph, got {target!r}")
    frozen = rm.freeze(graph.input_tokens)
    active, values = active_features(frozen)
    if not torch.equal(active, graph.active_features.to(active.device)):
        raise ValueError("the graph's active features are not this model's on its prompt: give the model and "
                         "transcoders the graph was made with")
    rows = _Rows(rm, frozen, active, values, H + 1, extra_hooks=_route_through_one_head(layer, H))
    if target < s["error"].start:
        parts = rows.feature_rows(graph.selected_features[target].repeat(H + 1))
    else:
        parts = rows.logit_rows(_direction(graph, target - s["logit"].start, frozen.logits.dtype).repeat(H + 1, 1))
    parts = _graph_columns(parts, graph, len(active))
    parts[:H, _after(graph, layer)] = 0  # written after the attention: every copy saw the whole edge, the bypass's
    return _frame(graph, parts, graph.adjacency_matrix[target].to(parts.dtype), H)


def _route_through_one_head(layer: int, H: int) -> list[tuple[str, Callable]]:
    """Hooks for a batch of H + 1 copies: across block `layer`'s attention copy h < H passes gradient only
    through head h, copy H only along the residual stream. The values are untouched."""
    held: dict = {}
    select = torch.eye(H + 1)[:, :H]  # [copy, head]
    bypass = torch.eye(H + 1)[:, H]

    def keep_pre(act, hook):
        held["pre"] = act

    def keep_result(act, hook):
        held["result"] = act

    def route(act, hook):
        result, pre = held["result"], held["pre"]
        part = (result * select.to(result)[:, None, :, None]).sum(2) + pre * bypass.to(pre)[:, None, None]
        return act.detach() + (part - part.detach())

    return [(act_name("resid_pre", layer), keep_pre), (act_name("result", layer), keep_result),
            (act_name("resid_mid", layer), route)]


def _after(graph: Graph, layer: int) -> torch.Tensor:
    """Mask of the source nodes written after block `layer`'s attention (features and errors of layers >= layer)."""
    after = torch.zeros(graph.n_nodes, dtype=torch.bool)
    feats = graph.active_features[graph.selected_features]
    after[:graph.n_features] = feats[:, 0] >= layer
    errors = graph.slices()["error"]
    after[errors] = (torch.arange(graph.n_layers) >= layer).repeat_interleave(graph.n_pos)
    return after


def _direction(graph: Graph, i: int, dtype: torch.dtype) -> torch.Tensor:
    _, idx = graph.logit_targets[i]
    if idx >= graph.vocab_size:
        raise ValueError("head loadings of a direction target need the direction itself: attribute a token target")
    d = torch.full((graph.vocab_size,), -1.0 / graph.vocab_size, dtype=dtype)
    d[idx] += 1.0
    return d[None]


def _graph_columns(parts: torch.Tensor, graph: Graph, n_active: int) -> torch.Tensor:
    """Rows over [active | errors | tokens] -> over the graph's nodes (logit columns zero)."""
    out = torch.zeros(parts.shape[0], graph.n_nodes, dtype=parts.dtype)
    n_sel = graph.n_features
    out[:, :n_sel] = parts[:, graph.selected_features]
    out[:, n_sel:n_sel + parts.shape[1] - n_active] = parts[:, n_active:]
    return out


def _frame(graph: Graph, parts: torch.Tensor, edge: torch.Tensor, H: int) -> pd.DataFrame:
    sources = (edge != 0).nonzero(as_tuple=True)[0]
    kinds = graph._kind_of_nodes()
    records = []
    for src in sources.tolist():
        for h in range(H + 1):
            records.append({"source": src, "source_kind": kinds[src], "head": h if h < H else -1,
                            "share": float(parts[h, src]), "edge": float(edge[src])})
    return pd.DataFrame(records, columns=["source", "source_kind", "head", "share", "edge"])
