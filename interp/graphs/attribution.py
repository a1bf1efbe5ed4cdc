"""`attribute`: the attribution graph of one prompt, every edge an exact direct effect in the frozen model.

In the replacement model (`replacement`) each target (a feature's pre-activation, a demeaned logit) is
an affine function of the sources (token embeddings, features' decoder vectors times activations,
errors). Its row of the adjacency is the gradient of the target with respect to each source's vector,
dotted with that vector. Rows are filled in **reverse mode**: one forward of `batch_size` copies of the
prompt is kept, and each backward pass injects a different target in each copy (a logit direction at
the last position, or a feature's encoder vector at its layer and position), giving `batch_size` whole
rows at once. Reverse mode fits because the sources outnumber the targets that matter (every feature,
error and token is a source; only the logits and the features influencing them need rows); forward
mode would need one pass per source.

Feature rows are visited in order of their influence on the logits, estimated from the rows computed
so far (recomputed every `update_interval` batches), so a cap (`max_feature_nodes`) keeps the features
that matter most, as circuit-tracer does.
"""
from __future__ import annotations

import copy
import time
from dataclasses import dataclass
from typing import Optional, Sequence, Union

import torch
from jaxtyping import Float, Int

from .._core.inputs import TextOrTokens
from .._core.model import HookedModel, model_name, str_tokens
from .dictionaries import TranscoderInput
from .graph import Graph
from .replacement import FrozenPrompt, FrozenRun, ReplacementModel

Target = Union[None, int, str, Sequence[Union[int, str]], torch.Tensor]


@dataclass
class LogitTargets:
    """The logit nodes: labels [(text, vocab index)], directions [n, d_vocab] in logit space (a token's is
    its one-hot minus 1/d_vocab: the demeaned logit), weights [n] (probabilities)."""

    labels: list[tuple[str, int]]
    directions: Float[torch.Tensor, "n d_vocab"]
    weights: Float[torch.Tensor, " n"]


def attribute(model: Union[HookedModel, ReplacementModel], prompt: TextOrTokens, transcoders: TranscoderInput = None, *,
              max_n_logits: int = 10, desired_logit_prob: float = 0.95, target: Target = None,
              max_feature_nodes: Optional[int] = None, batch_size: int = 256, dtype: Optional[torch.dtype] = None,
              prefix: int = 1, update_interval: int = 4) -> Graph:
    """The attribution graph of `prompt`'s next-token prediction (Ameisen et al. 2025).

    Args:
        model: a hooked model (Sprout, the walkthrough GPT), or a `ReplacementModel` (then no transcoders).
        prompt: one text, or ids [pos] / [1, pos].
        transcoders: None (the demo's shipped ones), "clt" (its shipped cross-layer transcoder), one
            `interp.Transcoder` per layer, an `interp.CrossLayerTranscoder`, or `Dictionaries`.
        max_n_logits, desired_logit_prob: the logit nodes are the most probable next tokens until their
            probabilities sum to desired_logit_prob, at most max_n_logits (each demeaned: the logit minus
            the mean logit, as circuit-tracer).
        target: instead, token ids or strings (demeaned logits), or directions in logit space, a tensor
            [d_vocab] or [n, d_vocab] (e.g. a logit difference), each weighted equally.
        max_feature_nodes: at most this many feature rows (the most influential); None: all.
        batch_size: targets per backward pass (copies of the prompt in the forward kept for them).
        dtype: compute in this dtype (copies of model and transcoders; torch.float64 for exactness tests).
        prefix: leading positions held constant (see `ReplacementModel`).
        update_interval: batches between re-rankings of the features by influence.

    Returns:
        Graph: nodes [selected features | errors | tokens | logits], adjacency [targets, sources].

    Example:
        >>> graph = interp.attribute(model, "The king said to his son")          # doctest: +SKIP
        >>> graph.edges(0.1).head()                                              # doctest: +SKIP
    """
    _check_options(max_n_logits, desired_logit_prob, max_feature_nodes, batch_size, update_interval)
    start = time.perf_counter()
    rm = _replacement(model, transcoders, dtype, prefix)
    frozen = rm.freeze(prompt)
    targets = logit_targets(rm.model, frozen.logits[-1], target, max_n_logits, desired_logit_prob)
    active, values = active_features(frozen)
    n_rows = len(active) if max_feature_nodes is None else min(max_feature_nodes, len(active))
    rows = _Rows(rm, frozen, active, values, min(batch_size, max(len(targets.labels), n_rows, 1)))
    logit_rows = rows.logit_rows(targets.directions)
    order, feature_rows = _feature_rows(rows, logit_rows, targets.weights, max_feature_nodes, update_interval)
    adjacency = _assemble(logit_rows, feature_rows, order, len(active))
    info = {"dtype": str(frozen.logits.dtype), "batch_size": rows.batch, "backward_passes": rows.passes,
            "n_active_features": len(active), "seconds": time.perf_counter() - start,
            "mode": "reverse (batched backward passes, one target per copy)"}
    model_ = rm.model
    return Graph(input_string=_text(model_, frozen.tokens), input_tokens=frozen.tokens.cpu(), active_features=active.cpu(),
                 selected_features=torch.tensor(order, dtype=torch.long), activation_values=values.cpu(),
                 adjacency_matrix=adjacency.cpu(), logit_targets=targets.labels,
                 logit_probabilities=targets.weights.cpu(), vocab_size=int(model_.cfg.d_vocab),
                 n_layers=rm.n_layers, cfg=_config(model_), scan=rm.dicts.scan, prefix=rm.prefix,
                 input_token_strings=str_tokens(model_, frozen.tokens), info=info)


def _check_options(max_n_logits, desired_logit_prob, max_feature_nodes, batch_size, update_interval) -> None:
    for name, value in (("max_n_logits", max_n_logits), ("batch_size", batch_size), ("update_interval", update_interval)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be an int >= 1, got {value!r}")
    if max_feature_nodes is not None and (isinstance(max_feature_nodes, bool) or not isinstance(max_feature_nodes, int)
                                          or max_feature_nodes < 0):
        raise ValueError(f"max_feature_nodes must be None or an int >= 0, got {max_feature_nodes!r}")
    if not isinstance(desired_logit_prob, (int, float)) or not 0 < desired_logit_prob <= 1:
        raise ValueError(f"desired_logit_prob must be in (0, 1], got {desired_logit_prob!r}")


def _replacement(model, transcoders, dtype, prefix) -> ReplacementModel:
    if isinstance(model, ReplacementModel):
        if transcoders is not None:
            raise ValueError("model is already a ReplacementModel with its transcoders: pass transcoders=None")
        if dtype is not None and dtype != model.dicts.dtype:
            raise ValueError("a ReplacementModel runs in its own dtype; build it from copies in the dtype you want")
        return model
    rm = ReplacementModel(model, transcoders, prefix=prefix)  # checks the transcoders against the original weights
    if dtype is None or dtype == rm.dicts.dtype:
        return rm
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise TypeError(f"dtype must be a floating torch.dtype such as torch.float64, got {dtype!r}")
    return ReplacementModel(copy.deepcopy(model).to(dtype), rm.dicts.to(dtype), prefix=prefix)


def logit_targets(model: HookedModel, last_logits: Float[torch.Tensor, " d_vocab"], target: Target = None,
                  max_n_logits: int = 10, desired_logit_prob: float = 0.95) -> LogitTargets:
    """The logit nodes for the last position's logits (see `attribute`'s `target`)."""
    V = last_logits.numel()
    last_logits = last_logits.detach().cpu()
    probs = torch.softmax(last_logits.double(), -1).to(last_logits.dtype)
    if isinstance(target, torch.Tensor) and target.is_floating_point():
        dirs = target[None] if target.dim() == 1 else target
        if dirs.dim() != 2 or dirs.shape[1] != V:
            raise ValueError(f"a target direction is [d_vocab={V}] or [n, {V}]; got shape {list(target.shape)}")
        n = dirs.shape[0]
        labels = [(f"direction {i}", V + i) for i in range(n)]
        return LogitTargets(labels, dirs.to(last_logits), torch.full((n,), 1.0 / n, dtype=last_logits.dtype))
    if target is None:
        p, ids = probs.sort(descending=True)
        k = int(torch.searchsorted(p.double().cumsum(0), torch.tensor([desired_logit_prob], dtype=torch.float64))) + 1
        ids = ids[:min(k, max_n_logits, V)]
    else:
        ids = _target_ids(model, target, V)
    dirs = torch.full((len(ids), V), -1.0 / V, dtype=last_logits.dtype, device=last_logits.device)
    dirs[torch.arange(len(ids)), ids] += 1.0
    texts = str_tokens(model, ids.cpu())
    return LogitTargets([(t, int(i)) for t, i in zip(texts, ids.tolist())], dirs, probs[ids])


def _target_ids(model: HookedModel, target, V: int) -> Int[torch.Tensor, " n"]:
    items = target.reshape(-1).tolist() if isinstance(target, torch.Tensor) else (
        [target] if isinstance(target, (int, str)) else list(target))
    if not items:
        raise ValueError("target is empty: give token ids, token strings or a direction [d_vocab]")
    ids = []
    for t in items:
        if isinstance(t, str):
            t = model.to_single_token(t)
        if isinstance(t, bool) or not isinstance(t, int):
            raise TypeError(f"a target token is an id (int) or a one-token string, got {t!r}")
        if not 0 <= t < V:
            raise ValueError(f"target token id {t} is outside the vocabulary (0..{V - 1})")
        ids.append(t)
    return torch.tensor(ids, dtype=torch.long)


def active_features(frozen: FrozenPrompt) -> tuple[Int[torch.Tensor, "n 3"], Float[torch.Tensor, " n"]]:
    """(layer, pos, feature) [n, 3] of every non-zero feature at positions >= prefix, and their activations [n]."""
    index, values = [], []
    for layer, acts in enumerate(frozen.acts):
        pos, feat = acts[frozen.prefix:].nonzero(as_tuple=True)
        pos = pos + frozen.prefix
        index.append(torch.stack([torch.full_like(pos, layer), pos, feat], 1))
        values.append(acts[pos, feat])
    return torch.cat(index), torch.cat(values)


class _Rows:
    """Rows of the adjacency over all sources [active features | errors | tokens], `batch` targets per pass."""

    def __init__(self, rm: ReplacementModel, frozen: FrozenPrompt, active: torch.Tensor, values: torch.Tensor,
                 batch: int, extra_hooks: Sequence = ()) -> None:
        self.rm, self.frozen, self.batch, self.passes, self.extra_hooks = rm, frozen, batch, 0, extra_hooks
        self.active, self.values = active, values
        self.errors = frozen.errors.clone()
        self.errors[:, :frozen.prefix] = 0  # the prefix's errors are constants, not nodes
        self.by_layer = [(active[:, 0] == l).nonzero(as_tuple=True)[0] for l in range(rm.n_layers)]
        self.writers = self._writers()
        # kept for every feature pass; it stops after the last block, since no feature reads the logits
        self.run: FrozenRun = rm.run(frozen, batch=batch, grad=True, extra_hooks=extra_hooks, logits=False)

    @torch.no_grad()
    def _writers(self) -> list[tuple[int, int, torch.Tensor, torch.Tensor]]:
        """(output layer, position, columns, their decoder rows times activations [n, d_model]) for every
        position where features of a layer are active: a pass contracts each position's gradient with its
        active features' vectors alone, not with every latent's."""
        d, out = self.rm.dicts, []
        for s, idx in enumerate(self.by_layer):
            pos, feat = self.active[idx, 1], self.active[idx, 2]
            for p in pos.unique().tolist():
                cols, feats = idx[pos == p], feat[pos == p]
                out += [(o, p, cols, d.decoder(s, o)[feats] * self.values[cols, None]) for o in d.writes(s)]
        return out

    @property
    def n_cols(self) -> int:
        return len(self.active) + (self.rm.n_layers + 1) * self.frozen.n_pos

    def logit_rows(self, directions: torch.Tensor) -> torch.Tensor:
        """Rows of the logit targets, directions [n, d_vocab], from a run of its own with as few copies as
        they need (the feature run has no logits)."""
        n = min(self.batch, len(directions))
        if not n:
            return torch.zeros(0, self.n_cols, dtype=self.frozen.logits.dtype)
        run = self.rm.run(self.frozen, batch=n, grad=True, extra_hooks=self.extra_hooks)
        assert run.logits is not None  # a run with logits
        out, directions = [], directions.to(run.logits)
        for i in range(0, len(directions), n):
            d = directions[i:i + n]
            inject = torch.zeros(n, d.shape[1], dtype=d.dtype, device=d.device)
            inject[:len(d)] = d
            out.append(self._pass([run.logits[:, -1]], [inject], run)[:len(d)])
        return torch.cat(out)

    def feature_rows(self, which: torch.Tensor) -> torch.Tensor:
        """Rows of the pre-activations of active features `which` (indices into active)."""
        out = []
        for i in range(0, len(which), self.batch):
            chunk = which[i:i + self.batch]
            layer, pos, feat = self.active[chunk].unbind(1)
            outputs, injects = [], []
            for l in layer.unique().tolist():
                rows = (layer == l).nonzero(as_tuple=True)[0]
                inject = torch.zeros_like(self.run.x_in[l])
                inject[rows, pos[rows]] = self.rm.dicts.encoder(l)[:, feat[rows]].T.to(inject)
                outputs.append(self.run.x_in[l])
                injects.append(inject)
            out.append(self._pass(outputs, injects, self.run)[:len(chunk)])
        return torch.cat(out) if out else torch.zeros(0, self.n_cols, dtype=self.frozen.logits.dtype)

    def _pass(self, outputs: list[torch.Tensor], injects: list[torch.Tensor], run: FrozenRun) -> torch.Tensor:
        """One backward of `run` from gradients `injects` at `outputs` (each copy's target direction, given
        as the gradient rather than a product to sum, which would be one more [batch, pos, d] per output):
        [batch, n_cols], each copy's gradient dotted with every source vector."""
        leaves, batch = [run.embed] + run.errors, run.embed.shape[0]
        grads = torch.autograd.grad(outputs, leaves, injects, retain_graph=True, allow_unused=True)
        self.passes += 1
        g_embed, g_out = grads[0], list(grads[1:])
        tokens = _dot(g_embed, self.frozen.embed, batch)  # every row on the model's device until the end
        errors = torch.cat([_dot(g, e, batch) for g, e in zip(g_out, self.errors)], dim=1)
        features = torch.zeros(batch, len(self.active), dtype=tokens.dtype, device=tokens.device)
        for o, p, cols, vectors in self.writers:
            if g_out[o] is not None:
                features[:, cols] += g_out[o][:, p] @ vectors.T.to(tokens)
        return torch.cat([features, errors, tokens], dim=1).detach().cpu()  # rows are kept on the CPU


def _dot(grad: Optional[torch.Tensor], vectors: torch.Tensor, batch: int) -> torch.Tensor:
    """[batch, pos]: each position's gradient dotted with its source vector (zeros where unused)."""
    if grad is None:
        return torch.zeros(batch, vectors.shape[0], dtype=vectors.dtype, device=vectors.device)
    return (grad * vectors).sum(-1)


def _normalised(rows: torch.Tensor, n_active: int) -> torch.Tensor:
    """|rows| scaled to sum 1 over all their columns, restricted to the feature columns (no full-size copy)."""
    total = torch.linalg.vector_norm(rows, ord=1, dim=1, keepdim=True).clamp_min(1e-30)
    return rows[:, :n_active].abs() / total


def _influence(logit_rows, feature_rows, visited, weights, n_active) -> torch.Tensor:
    """Each active feature's influence on the logits through the rows known so far: w A + w A^2 + ..."""
    current = weights.to(logit_rows) @ _normalised(logit_rows, n_active)
    total = current.clone()
    if not visited:
        return total
    A = _normalised(feature_rows, n_active)
    idx = torch.tensor(visited, dtype=torch.long)
    for _ in range(n_active):
        current = current[idx] @ A
        if not bool(current.any()):
            break
        total += current
    return total


def _feature_rows(rows: _Rows, logit_rows, weights, cap, update_interval) -> tuple[list[int], torch.Tensor]:
    n_active = len(rows.active)
    n = n_active if cap is None else min(cap, n_active)
    visited: list[int] = []
    done = torch.zeros(n_active, dtype=torch.bool)
    feature_rows = torch.zeros(n, rows.n_cols, dtype=logit_rows.dtype)
    ranking = torch.zeros(0, dtype=torch.long)
    batches = 0
    while len(visited) < n:
        if batches % update_interval == 0:
            score = _influence(logit_rows, feature_rows[:len(visited)], visited, weights, n_active)
            score[done] = -1
            ranking = score.argsort(descending=True, stable=True)
        ranking = ranking[~done[ranking]]
        chunk = ranking[:min(rows.batch, n - len(visited))]
        feature_rows[len(visited):len(visited) + len(chunk)] = rows.feature_rows(chunk)
        visited += chunk.tolist()
        done[chunk] = True
        batches += 1
    return visited, feature_rows


def _assemble(logit_rows, feature_rows, order: list[int], n_active: int) -> torch.Tensor:
    """The square adjacency [selected | errors | tokens | logits] from rows over [active | errors | tokens]."""
    n_sel, n_rest, n_logits = len(order), logit_rows.shape[1] - n_active, logit_rows.shape[0]
    N = n_sel + n_rest + n_logits
    adj = torch.zeros(N, N, dtype=logit_rows.dtype)
    sel = torch.tensor(order, dtype=torch.long)
    for rows, start in ((feature_rows, 0), (logit_rows, n_sel + n_rest)):
        adj[start:start + len(rows), :n_sel] = rows[:, sel]
        adj[start:start + len(rows), n_sel:n_sel + n_rest] = rows[:, n_active:]
    return adj


def _text(model: HookedModel, tokens: torch.Tensor) -> str:
    return "".join(str_tokens(model, tokens.cpu())) if getattr(model, "tokenizer", None) is not None else " ".join(
        f"#{int(t)}" for t in tokens)


def _config(model: HookedModel) -> dict:
    config = getattr(model, "config", None)
    if config is not None and hasattr(config, "__dataclass_fields__"):
        from dataclasses import asdict

        return {"model": model_name(model), **asdict(config)}
    return {"model": model_name(model)}
