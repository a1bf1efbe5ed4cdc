"""Edge patching: one forward pass in which chosen edges carry an ablated sender's output.

A receiver's input is the residual stream, the sum of every sender's output before it. Ablating the
edge u -> v changes what v alone reads: input_v = stream - out_u + ablated_u, where out_u is u's output
in this same pass (so downstream of an ablated edge, senders pass on what they now compute, as in
EAP-IG's and MIB's circuit evaluation). The change is made on the receiver's own copy of the stream,
before its norm (the split inputs `hook_q_input` ..., `hook_mlp_in`, the last `hook_resid_post` for the
logits), so no other reader sees it. With a weight `keep` in [0, 1] per edge the receiver reads
stream - (1 - keep) (out_u - ablated_u): 1 keeps the edge, 0 ablates it, values between mix (what mask
learning optimises).

Ablations (what an ablated sender writes): "resample", its output on the corrupted tokens (the
counterfactual, position by position); "mean", its output averaged over the clean batch at each
position; "zero", nothing.
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Callable, Iterator, Optional

import torch
from jaxtyping import Float, Int

from .._core.inputs import TextOrTokens, token_batch
from .edges import EdgeGraph, edge_graph

ABLATIONS = ("resample", "mean", "zero")
Metric = Callable[[torch.Tensor], torch.Tensor]
SenderFn = Callable[[int, torch.Tensor], torch.Tensor]  # (first sender index, output [batch, pos, k, d]) -> output


@contextmanager
def split_inputs(model: Any) -> Iterator[EdgeGraph]:
    """Switch on split q/k/v inputs, hook_mlp_in and head results for the block, and put the flags back after."""
    graph = edge_graph(model)
    cfg = model.cfg
    saved = {f: getattr(cfg, f, False) for f in ("use_attn_in", "use_split_qkv_input", "use_hook_mlp_in", "use_attn_result")}
    was_training = model.training
    try:
        if saved["use_attn_in"]:
            model.set_use_attn_in(False)
        model.set_use_split_qkv_input(True)
        model.set_use_hook_mlp_in(True)
        model.set_use_attn_result(True)
        model.eval()
        yield graph
    finally:
        model.set_use_split_qkv_input(saved["use_split_qkv_input"])
        model.set_use_hook_mlp_in(saved["use_hook_mlp_in"])
        model.set_use_attn_result(saved["use_attn_result"])
        if saved["use_attn_in"]:
            model.set_use_attn_in(True)
        model.train(was_training)


def token_pair(model: Any, clean: TextOrTokens, corrupted: Optional[TextOrTokens], ablation: str
               ) -> tuple[Int[torch.Tensor, "batch pos"], Optional[Int[torch.Tensor, "batch pos"]]]:
    """Both inputs as ids [batch, pos] on the model's device, through interp's one token contract (float ids
    are refused with the forward's words); clear errors for padding, shapes that differ, and an unknown
    ablation."""
    if ablation not in ABLATIONS:
        raise ValueError(f"ablation must be one of {ABLATIONS}, got {ablation!r}")
    pair: list[Optional[torch.Tensor]] = []
    for name, data in (("clean", clean), ("corrupted", corrupted)):
        if data is None:
            pair.append(None)
            continue
        ids, mask = token_batch(model, data)
        if mask is not None:
            raise ValueError(f"{name} has rows of unequal length (padding): edge patching ablates every position, "
                             "so give rows of equal length")
        pair.append(ids)
    clean_ids, corrupted_ids = pair
    assert clean_ids is not None
    if ablation == "resample" and corrupted_ids is None:
        raise ValueError("ablation='resample' needs corrupted tokens (the counterfactual); or use 'mean' or 'zero'")
    if corrupted_ids is not None and corrupted_ids.shape != clean_ids.shape:
        raise ValueError(f"clean and corrupted must have the same shape [batch, pos], got {tuple(clean_ids.shape)} "
                         f"and {tuple(corrupted_ids.shape)}: patching swaps activations position by position")
    return clean_ids, corrupted_ids


class EdgePass:
    """The hooks of one forward pass over the edge graph.

    keep: None (no edge ablated) or [edge] weights (1 keep, 0 ablate). ablated: every sender's ablated
    output [batch, pos, sender, d_model]; keep [copy, edge] runs one copy of the batch per row (the
    tokens repeated copy times). sender_fn replace senders' outputs as they are made
    (EAP-IG's interpolations). With `track`, the embedding is made a leaf that requires grad and every
    receiver's input is kept in `received` (for gradients)."""

    def __init__(self, graph: EdgeGraph, ablated: torch.Tensor, keep: Optional[torch.Tensor] = None,
                 sender_fn: Optional[SenderFn] = None, track: bool = False) -> None:
        self.graph, self.ablated, self.sender_fn, self.track = graph, ablated, sender_fn, track
        self.coef = None if keep is None else graph.dense(1 - keep.to(ablated))  # [sender, receiver]
        self.outs: list[torch.Tensor] = []  # senders' outputs in this pass, each [batch, pos, k, d_model]
        self.received: dict[int, torch.Tensor] = {}  # receiver column -> its input as read

    def _send(self, first: int, x: torch.Tensor) -> torch.Tensor:
        if self.sender_fn is not None:
            x = self.sender_fn(first, x)
        if first == 0 and self.track:  # the leaf every gradient flows back to
            x = x.detach().requires_grad_(True)
        self.outs.append(x)
        return x

    def _receive(self, cols: slice, x: torch.Tensor) -> torch.Tensor:
        """x [batch, pos, n, d_model] (n receivers' copies) minus the ablated edges' differences."""
        if self.coef is not None:
            n_up = self.graph.upstream(cols.start)
            coef = self.coef[..., :n_up, cols]
            nonzero = coef.nonzero() if coef.dim() == 3 else None
            if nonzero is not None and len(nonzero) <= coef.size(0):
                x = self._receive_sparse(x, coef, nonzero)
            else:
                outs = torch.cat(self.outs, dim=2)[:, :, :n_up]
                if coef.dim() == 2:
                    x = x - torch.einsum("bpsd,sn->bpnd", outs - self.ablated[:, :, :n_up], coef)
                else:  # one copy of the batch per row of keep: [copy * batch, ...]
                    k, b = coef.size(0), self.ablated.size(0)
                    diff = outs.unflatten(0, (k, b)) - self.ablated[None, :, :, :n_up]
                    x = x - torch.einsum("kbpsd,ksn->kbpnd", diff, coef).flatten(0, 1)
        if self.track:
            self.received[cols.start] = x
        return x

    def _receive_sparse(self, x: torch.Tensor, coef: torch.Tensor, nonzero: torch.Tensor) -> torch.Tensor:
        """The same subtraction when few (copy, sender, receiver) weights are nonzero (exact patching ablates one
        edge per copy): each is applied to its copy's slice alone, so no [copy, batch, pos, sender, d_model]
        difference is built (the dense einsum made exact patching of every edge ~5x slower than the forwards)."""
        b = self.ablated.size(0)
        x = x.clone()  # the split inputs may be expanded views of one stream: never write into them
        for c, s, n in nonzero.tolist():
            i, offset = self._sender_slot(s)
            rows = slice(c * b, (c + 1) * b)
            diff = self.outs[i][rows, :, offset] - self.ablated[:, :, s]
            x[rows, :, n] -= coef[c, s, n] * diff
        return x

    def _sender_slot(self, s: int) -> tuple[int, int]:
        """(index into self.outs, offset within it) of sender `s` (the embedding, then each block's heads and MLP)."""
        if s == 0:
            return 0, 0
        layer, j = divmod(s - 1, self.graph.n_heads + 1)
        return 1 + 2 * layer + (j == self.graph.n_heads), j % self.graph.n_heads if j < self.graph.n_heads else 0

    def hooks(self) -> list[tuple[str, Callable]]:
        g, H = self.graph, self.graph.n_heads
        hooks: list[tuple[str, Callable]] = [("blocks.0.hook_resid_pre", self._embed_hook)]
        for l in range(g.n_layers):
            first = 1 + l * (H + 1)
            cols = g.attn_columns(l)
            hooks.append((f"blocks.{l}.attn.hook_result", lambda x, hook, f=first: self._send(f, x)))
            for i, via in enumerate(("q", "k", "v")):
                part = slice(cols.start + i * H, cols.start + (i + 1) * H)
                hooks.append((f"blocks.{l}.hook_{via}_input", lambda x, hook, c=part: self._receive(c, x)))
            mlp = g.mlp_column(l)
            hooks.append((f"blocks.{l}.hook_mlp_in", lambda x, hook, c=slice(mlp, mlp + 1): self._receive(c, x[:, :, None])[:, :, 0]))
            hooks.append((f"blocks.{l}.hook_mlp_out", lambda x, hook, f=first + H: self._send(f, x[:, :, None])[:, :, 0]))
        last = slice(g.logits_column, g.logits_column + 1)
        hooks.append((f"blocks.{g.n_layers - 1}.hook_resid_post", lambda x, hook: self._receive(last, x[:, :, None])[:, :, 0]))
        return hooks

    def _embed_hook(self, x: torch.Tensor, hook: Any) -> torch.Tensor:
        return self._send(0, x[:, :, None])[:, :, 0]


def run_pass(model: Any, tokens: torch.Tensor, edge_pass: EdgePass) -> torch.Tensor:
    """The logits [batch, pos, vocab] of one forward with `edge_pass`'s hooks (flags already on)."""
    with model.hooks(fwd_hooks=edge_pass.hooks()):
        return model(tokens)


def sender_outputs(model: Any, graph: EdgeGraph, tokens: torch.Tensor) -> Float[torch.Tensor, "batch pos sender d_model"]:
    """Every sender's output on `tokens` (an unpatched pass; flags already on)."""
    zeros = torch.zeros(1, 1, graph.n_senders, 1)
    edge_pass = EdgePass(graph, zeros)
    with torch.no_grad():
        run_pass(model, tokens, edge_pass)
    return torch.cat(edge_pass.outs, dim=2)


def ablated_outputs(model: Any, graph: EdgeGraph, clean: Int[torch.Tensor, "batch pos"],
                    corrupted: Optional[Int[torch.Tensor, "batch pos"]], ablation: str
                    ) -> tuple[Float[torch.Tensor, "batch pos sender d_model"], Float[torch.Tensor, "batch pos sender d_model"]]:
    """(clean outputs, ablated outputs) of every sender, each [batch, pos, sender, d_model]."""
    outs = sender_outputs(model, graph, clean)
    if ablation == "resample":
        assert corrupted is not None
        return outs, sender_outputs(model, graph, corrupted)
    if ablation == "mean":
        return outs, outs.mean(dim=0, keepdim=True).expand_as(outs).clone()
    return outs, torch.zeros_like(outs)


def metric_value(metric: Metric, logits: torch.Tensor) -> torch.Tensor:
    """The metric of logits as a 0-d tensor (a tensor of several values, e.g. one per prompt, is averaged);
    a clear error for anything else."""
    value = metric(logits)
    if not isinstance(value, torch.Tensor) or value.numel() == 0 or not value.is_floating_point():
        raise ValueError(f"metric must return a float tensor (e.g. a mean logit difference), got "
                         f"{type(value).__name__}{'' if not isinstance(value, torch.Tensor) else tuple(value.shape)}")
    return value.mean()


def circuit_metric(model: Any, graph: EdgeGraph, clean: torch.Tensor, ablated: torch.Tensor, metric: Metric,
                   keep: Float[torch.Tensor, " edge"]) -> float:
    """The metric with each edge weighted by `keep` [edge] (1 kept, 0 ablated); flags already on."""
    with torch.no_grad():
        return float(metric_value(metric, run_pass(model, clean, EdgePass(graph, ablated, keep))))


def circuit_metrics(model: Any, graph: EdgeGraph, clean: torch.Tensor, ablated: torch.Tensor, metric: Metric,
                    keeps: Float[torch.Tensor, "copy edge"]) -> list[float]:
    """The metric under each row of `keeps` [copy, edge], all rows in one forward of the repeated batch."""
    k, b = keeps.size(0), clean.size(0)
    with torch.no_grad():
        logits = run_pass(model, clean.repeat(k, 1), EdgePass(graph, ablated, keeps))
    return [float(metric_value(metric, part)) for part in logits.split(b)]


def exact_scores(model: Any, graph: EdgeGraph, clean: torch.Tensor, ablated: torch.Tensor, metric: Metric,
                 chunk: int = 0) -> Float[torch.Tensor, " edge"]:
    """metric(clean) - metric(that edge alone ablated), one patched copy of the batch per edge (`chunk`
    copies per forward; 0 sizes chunks to ~64 MB of residual copies): the reference every method approximates."""
    n = graph.n_edges
    full = circuit_metric(model, graph, clean, ablated, metric, torch.ones(n))
    per_copy = clean.numel() * graph.n_senders * ablated.size(-1) * ablated.element_size()
    chunk = chunk or max(1, min(n, (64 << 20) // max(per_copy, 1)))
    values: list[float] = []
    for start in range(0, n, chunk):
        rows = torch.arange(start, min(n, start + chunk))
        keeps = torch.ones(len(rows), n)
        keeps[torch.arange(len(rows)), rows] = 0.0
        values += circuit_metrics(model, graph, clean, ablated, metric, keeps)
    return full - torch.tensor(values, dtype=torch.float64)


def patch_edges(model: Any, clean: TextOrTokens, corrupted: Optional[TextOrTokens],
                metric: Metric, ablate: Any, ablation: str = "resample") -> float:
    """The metric with the listed edges ablated and every other edge kept.

    Args:
        model: a hooked model with split inputs (`edge_graph`).
        clean: token ids [batch, pos] of the run (or texts / id rows of equal length).
        corrupted: counterfactual token ids [batch, pos] (for "resample"), or None.
        metric: logits [batch, pos, vocab] -> a 0-d tensor.
        ablate: (sender, receiver, via) triples, e.g. [("L0H0", "L1H0", "k")].
        ablation: "resample", "mean" or "zero".

    Returns:
        the metric's value (a float).
    """
    clean, corrupted = token_pair(model, clean, corrupted, ablation)
    with split_inputs(model) as graph:
        outs, ablated = ablated_outputs(model, graph, clean, corrupted, ablation)
        keep = torch.ones(graph.n_edges)
        keep[graph.edge_ids(ablate)] = 0.0
        return circuit_metric(model, graph, clean, ablated, metric, keep)
