"""The edge graph a circuit is searched in: every upstream writer to every downstream reader.

Senders (writers to the residual stream), in the order the forward pass makes them: the embedding
("embed", read at `blocks.0.hook_resid_pre`), then per layer each head's own output
(`blocks.{l}.attn.hook_result`, "L{l}H{h}") and the MLP's (`blocks.{l}.hook_mlp_out`, "MLP{l}").
Receivers (readers), in the same order: per layer each head's query, key and value inputs apart
(`blocks.{l}.hook_q_input` / `hook_k_input` / `hook_v_input`, TransformerLens' split inputs: each head
its own copy of the stream, before ln1), the MLP's input (`blocks.{l}.hook_mlp_in`, before ln2), and the
logits (the last `hook_resid_post`, before the final norm). An edge joins every sender to every receiver
it precedes (the same layer's heads feed that layer's MLP), so the count is ACDC's and EAP-IG's:
sum_l [3H (1 + l(H+1)) + 1 + l(H+1) + H] + 1 + L(H+1); 18 for gpt-1 (1 layer, 3 heads), 309 for gpt-4.

Edges are indexed receiver by receiver, senders in forward order within each; a dense [sender,
receiver] matrix (`valid`) says which pairs are edges, and `dense`/`flat` move between the two views.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pandas as pd
import torch
from jaxtyping import Bool, Float

from sprout.names import head_label

VIAS = ("q", "k", "v", "mlp_in", "logits")


@dataclass(frozen=True)
class EdgeGraph:
    """The edges of a model with `n_layers` blocks of `n_heads` heads and an MLP each (see the module doc)."""

    n_layers: int
    n_heads: int

    @property
    def n_senders(self) -> int:
        return 1 + self.n_layers * (self.n_heads + 1)

    @property
    def n_receivers(self) -> int:
        return self.n_layers * (3 * self.n_heads + 1) + 1

    def upstream(self, r: int) -> int:
        """How many senders precede receiver `r` (the first `upstream(r)` senders write before it reads)."""
        per = 3 * self.n_heads + 1
        l, i = divmod(r, per)
        base = 1 + l * (self.n_heads + 1)
        return base + self.n_heads if i == 3 * self.n_heads else base

    def attn_columns(self, layer: int) -> slice:
        """Receiver columns of block `layer`'s q, k, v inputs: q of heads 0..H-1, then k, then v."""
        start = layer * (3 * self.n_heads + 1)
        return slice(start, start + 3 * self.n_heads)

    def mlp_column(self, layer: int) -> int:
        return layer * (3 * self.n_heads + 1) + 3 * self.n_heads

    @property
    def logits_column(self) -> int:
        return self.n_receivers - 1

    @property
    def valid(self) -> Bool[torch.Tensor, "sender receiver"]:
        """True where (sender, receiver) is an edge."""
        ups = torch.tensor([self.upstream(r) for r in range(self.n_receivers)])
        return torch.arange(self.n_senders)[:, None] < ups[None, :]

    @property
    def n_edges(self) -> int:
        return int(self.valid.sum())

    def index(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(sender, receiver) index tensors [edge], receiver by receiver, senders in forward order."""
        r, s = self.valid.T.nonzero(as_tuple=True)
        return s, r

    def dense(self, values: Float[torch.Tensor, "*copy edge"], fill: float = 0.0) -> Float[torch.Tensor, "*copy sender receiver"]:
        """A [sender, receiver] matrix holding `values` [edge] at the edges and `fill` elsewhere (differentiable);
        values [copy, edge] give one matrix per copy."""
        s, r = (t.to(values.device) for t in self.index())
        flat = values.reshape(-1, values.size(-1))
        out = torch.full((flat.size(0), self.n_senders, self.n_receivers), fill, dtype=values.dtype, device=values.device)
        out = out.index_put((torch.arange(flat.size(0), device=values.device)[:, None], s[None], r[None]), flat)
        return out.reshape(*values.shape[:-1], self.n_senders, self.n_receivers)

    def flat(self, matrix: Float[torch.Tensor, "sender receiver"]) -> Float[torch.Tensor, " edge"]:
        """The edges' entries [edge] of a [sender, receiver] matrix."""
        s, r = self.index()
        return matrix[s.to(matrix.device), r.to(matrix.device)]

    def sender_name(self, s: int) -> str:
        if s == 0:
            return "embed"
        l, i = divmod(s - 1, self.n_heads + 1)
        return f"MLP{l}" if i == self.n_heads else head_label(l, i)

    def receiver_name(self, r: int) -> tuple[str, str]:
        """(receiver, via) of receiver column `r`: ("L1H0", "k"), ("MLP1", "mlp_in"), ("logits", "logits")."""
        if r == self.logits_column:
            return "logits", "logits"
        l, i = divmod(r, 3 * self.n_heads + 1)
        if i == 3 * self.n_heads:
            return f"MLP{l}", "mlp_in"
        via, h = divmod(i, self.n_heads)
        return head_label(l, h), VIAS[via]

    def sender_layer(self, s: int) -> int:
        """The block a sender belongs to (-1 for the embedding)."""
        return -1 if s == 0 else (s - 1) // (self.n_heads + 1)

    def receiver_layer(self, r: int) -> int:
        """The block a receiver belongs to (n_layers for the logits)."""
        return r // (3 * self.n_heads + 1)

    @property
    def edges(self) -> pd.DataFrame:
        """One row per edge: sender, receiver, via, sender_layer, receiver_layer (receiver by receiver)."""
        s, r = self.index()
        rows = [(self.sender_name(a), *self.receiver_name(b), self.sender_layer(a), self.receiver_layer(b))
                for a, b in zip(s.tolist(), r.tolist())]
        return pd.DataFrame(rows, columns=["sender", "receiver", "via", "sender_layer", "receiver_layer"])

    @property
    def counts(self) -> dict[str, int]:
        """Edges by the input they enter (q, k, v, mlp_in, logits), and "total"."""
        by = self.edges["via"].value_counts()
        return {**{v: int(by.get(v, 0)) for v in VIAS}, "total": self.n_edges}

    def edge_ids(self, names: Any) -> list[int]:
        """Edge indices of (sender, receiver, via) triples; an unknown edge is an error naming it."""
        table = {tuple(row): i for i, row in enumerate(self.edges[["sender", "receiver", "via"]].itertuples(index=False))}
        out = []
        for name in names:
            key = tuple(name)
            if key not in table:
                raise ValueError(f"no edge {key} in this graph of {self.n_layers} layers x {self.n_heads} heads; "
                                 "an edge is (sender, receiver, via), e.g. ('L0H0', 'L1H0', 'k')")
            out.append(table[key])
        return out


def edge_graph(model: Any) -> EdgeGraph:
    """The edge graph of a hooked model with split inputs (Sprout, the walkthrough GPT).

    Args:
        model: a model whose `cfg` has `n_layers` and `n_heads`, with TransformerLens' split inputs
            (`set_use_split_qkv_input`, `blocks.{l}.hook_q_input`) and an MLP in every block.

    Returns:
        the `EdgeGraph`: `.edges` (one row per edge), `.counts` (per input kind and total), `.n_edges`.

    Example:
        >>> from sprout import Sprout, SproutConfig
        >>> edge_graph(Sprout(SproutConfig.preset("gpt-4", vocab_size=64, d_model=48))).n_edges
        309
    """
    require_split_inputs(model)
    return EdgeGraph(int(model.cfg.n_layers), int(model.cfg.n_heads))


def require_split_inputs(model: Any) -> None:
    """A clear error when `model` lacks what edge patching reads: split q/k/v inputs, hook_mlp_in, an MLP per block."""
    cfg = getattr(model, "cfg", None)
    if cfg is None or not hasattr(cfg, "n_layers") or not hasattr(cfg, "n_heads"):
        raise ValueError(f"model {type(model).__name__} has no TransformerLens config (model.cfg.n_layers, n_heads)")
    names = getattr(model, "mod_dict", {})
    missing = [n for n in ("blocks.0.hook_q_input", "blocks.0.hook_mlp_in", "blocks.0.attn.hook_result")
               if n not in names]
    if missing or not hasattr(model, "set_use_split_qkv_input") or not hasattr(model, "set_use_hook_mlp_in"):
        raise ValueError(f"model {type(model).__name__} has no split inputs (missing {missing or 'set_use_split_qkv_input'}): "
                         "edge patching needs TransformerLens' use_split_qkv_input and use_hook_mlp_in, which "
                         "give every head and MLP its own copy of the residual stream")
    if getattr(cfg, "attn_only", False):
        raise ValueError("model is attention-only: the edge graph here needs an MLP in every block")
