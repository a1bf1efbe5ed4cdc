"""The attribution graph: an adjacency [targets, sources] over four kinds of nodes, with circuit-tracer's
field names, tidy node and edge tables, and a file format (safetensors + JSON).

Nodes are ordered as circuit-tracer orders them: the selected features (in the order attribution
visited them), then one error node per (layer, position), layer-major (index layer * n_pos + pos), then
one token node per position, then the logit targets. `adjacency_matrix[t, s]` is the direct effect of
source s on target t: how much of t's value (a feature's pre-activation, a demeaned logit) s puts there
through the frozen linear model. Rows of error and token nodes are zero (they have no inputs).
"""
from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, Union

import pandas as pd
import torch
from jaxtyping import Float, Int
from safetensors.torch import load_file, save_file

FORMAT = "sprout-attribution-graph"
VERSION = 1
TENSORS = ("input_tokens", "active_features", "selected_features", "activation_values", "adjacency_matrix",
           "logit_probabilities")
KINDS = ("feature", "error", "token", "logit")


@dataclass
class Graph:
    """An attribution graph of one prompt (what `interp.attribute` returns).

    Attributes:
        input_string: the prompt as text.
        input_tokens: [n_pos] its ids.
        active_features: [n_active, 3] (layer, pos, feature) of every active feature past the prefix.
        selected_features: [n_features] indices into active_features of the features that are nodes, in
            node order (attribution visited them by influence; a cap leaves the rest out).
        activation_values: [n_active] the activations of active_features.
        adjacency_matrix: [n_nodes, n_nodes] direct effects, rows = targets, columns = sources.
        logit_targets: [(token string, vocab index)] per logit node (a direction that is no token has a
            virtual index >= vocab_size, as circuit-tracer's custom targets).
        logit_probabilities: [n_logits] each logit target's probability (its weight in pruning and scores).
        vocab_size, n_layers: the model's.
        cfg: the model's config (a dict), scan: the transcoder set's name.
        prefix: leading positions held constant (no feature or error nodes there).
        input_token_strings: each input token as text (labels).
        info: how it was made (dtype, batch size, passes, seconds).
    """

    input_string: str
    input_tokens: Int[torch.Tensor, " n_pos"]
    active_features: Int[torch.Tensor, "n_active 3"]
    selected_features: Int[torch.Tensor, " n_features"]
    activation_values: Float[torch.Tensor, " n_active"]
    adjacency_matrix: Float[torch.Tensor, "n_nodes n_nodes"]
    logit_targets: list[tuple[str, int]]
    logit_probabilities: Float[torch.Tensor, " n_logits"]
    vocab_size: int
    n_layers: int
    cfg: dict = field(default_factory=dict)
    scan: Optional[str] = None
    prefix: int = 1
    input_token_strings: list[str] = field(default_factory=list)
    info: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        n = self.n_features + self.n_layers * self.n_pos + self.n_pos + self.n_logits
        if tuple(self.adjacency_matrix.shape) != (n, n):
            raise ValueError(f"adjacency_matrix has shape {list(self.adjacency_matrix.shape)}; with {self.n_features} "
                             f"features, {self.n_layers} x {self.n_pos} errors, {self.n_pos} tokens and {self.n_logits} "
                             f"logits it must be [{n}, {n}]")
        if len(self.logit_probabilities) != self.n_logits:
            raise ValueError(f"{len(self.logit_probabilities)} logit_probabilities for {self.n_logits} logit_targets")
        if len(self.activation_values) != len(self.active_features):
            raise ValueError(f"{len(self.activation_values)} activation_values for {len(self.active_features)} "
                             "active_features")

    # --- sizes and node ranges --------------------------------------------------------------------

    @property
    def n_pos(self) -> int:
        return int(self.input_tokens.numel())

    @property
    def n_features(self) -> int:
        return int(self.selected_features.numel())

    @property
    def n_logits(self) -> int:
        return len(self.logit_targets)

    @property
    def n_nodes(self) -> int:
        return int(self.adjacency_matrix.shape[0])

    @property
    def logit_tokens(self) -> Int[torch.Tensor, " n_logits"]:
        """The logit targets' vocabulary indices [n_logits] (virtual ones >= vocab_size for directions)."""
        return torch.tensor([i for _, i in self.logit_targets], dtype=torch.long)

    def slices(self) -> dict[str, slice]:
        """The node index range of each kind: {"feature", "error", "token", "logit"}."""
        f, e = self.n_features, self.n_layers * self.n_pos
        return {"feature": slice(0, f), "error": slice(f, f + e), "token": slice(f + e, f + e + self.n_pos),
                "logit": slice(f + e + self.n_pos, self.n_nodes)}

    def error_node(self, layer: int, pos: int) -> int:
        return self.n_features + layer * self.n_pos + pos

    def token_node(self, pos: int) -> int:
        return self.n_features + self.n_layers * self.n_pos + pos

    # --- tables -----------------------------------------------------------------------------------

    @property
    def nodes(self) -> pd.DataFrame:
        """One row per node, in node order: node (its index), kind ("feature", "error", "token", "logit"),
        layer (features and errors: their block; tokens -1; logits n_layers), pos, feature (-1 unless a
        feature), activation (features; NaN otherwise), token (the input token at pos; a logit's token),
        probability (logits; NaN otherwise)."""
        toks = self.input_token_strings or [f"#{int(t)}" for t in self.input_tokens]
        feats = self.active_features[self.selected_features]
        rows: dict[str, list[Any]] = {k: [] for k in ("kind", "layer", "pos", "feature", "activation", "token", "probability")}

        def add(kind, layer, pos, feature, activation, token, probability):
            for key, value in zip(rows, (kind, layer, pos, feature, activation, token, probability)):
                rows[key].append(value)

        acts = self.activation_values[self.selected_features].tolist()
        for (layer, pos, feat), act in zip(feats.tolist(), acts):
            add("feature", layer, pos, feat, act, toks[pos], float("nan"))
        for layer in range(self.n_layers):
            for pos in range(self.n_pos):
                add("error", layer, pos, -1, float("nan"), toks[pos], float("nan"))
        for pos in range(self.n_pos):
            add("token", -1, pos, -1, float("nan"), toks[pos], float("nan"))
        for (text, _), p in zip(self.logit_targets, self.logit_probabilities.tolist()):
            add("logit", self.n_layers, self.n_pos - 1, -1, float("nan"), text, p)
        frame = pd.DataFrame(rows)
        frame.insert(0, "node", range(len(frame)))
        return frame.astype({"layer": int, "pos": int, "feature": int})

    def edges(self, threshold: float = 0.0) -> pd.DataFrame:
        """Every edge with |weight| > threshold: source, target (node indices), weight (the signed direct
        effect), source_kind, target_kind; sorted by |weight|, largest first."""
        if not isinstance(threshold, (int, float)) or threshold < 0:
            raise ValueError(f"threshold must be a number >= 0, got {threshold!r}")
        adj = self.adjacency_matrix
        target, source = (adj.abs() > threshold).nonzero(as_tuple=True)
        weight = adj[target, source]
        order = weight.abs().argsort(descending=True)
        target, source, weight = target[order], source[order], weight[order]
        kinds = self._kind_of_nodes()
        return pd.DataFrame({"source": source.tolist(), "target": target.tolist(), "weight": weight.tolist(),
                             "source_kind": [kinds[i] for i in source.tolist()],
                             "target_kind": [kinds[i] for i in target.tolist()]})

    def _kind_of_nodes(self) -> list[str]:
        out: list[str] = []
        for kind, s in self.slices().items():
            out += [kind] * (s.stop - s.start)
        return out

    # --- files ------------------------------------------------------------------------------------

    def save(self, folder: Union[str, Path]) -> Path:
        """Write `graph.safetensors` (the tensors) and `graph.json` (the rest) into `folder`, each atomically
        (a temporary file renamed into place). Returns the folder."""
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        tensors = {name: getattr(self, name).detach().cpu().contiguous() for name in TENSORS}
        meta = {"format": FORMAT, "version": VERSION, "input_string": self.input_string,
                "logit_targets": [[t, i] for t, i in self.logit_targets], "vocab_size": self.vocab_size,
                "n_layers": self.n_layers, "cfg": self.cfg, "scan": self.scan, "prefix": self.prefix,
                "input_token_strings": self.input_token_strings, "info": self.info}
        _atomic(folder / "graph.safetensors", lambda p: save_file(tensors, str(p)))
        _atomic(folder / "graph.json", lambda p: p.write_text(json.dumps(meta, indent=1, default=str)))
        return folder

    @classmethod
    def load(cls, folder: Union[str, Path]) -> "Graph":
        """A graph written by `save`; a missing file, another format, or a missing or inconsistent field is
        a ValueError (FileNotFoundError for a missing file) naming it."""
        folder = Path(folder)
        for name in ("graph.json", "graph.safetensors"):
            if not (folder / name).is_file():
                raise FileNotFoundError(f"{folder / name} does not exist: a saved graph is a folder holding "
                                        "graph.json and graph.safetensors (Graph.save)")
        try:
            meta = json.loads((folder / "graph.json").read_text())
        except json.JSONDecodeError as e:
            raise ValueError(f"{folder / 'graph.json'} is not valid JSON ({e})") from e
        if not isinstance(meta, dict) or meta.get("format") != FORMAT:
            raise ValueError(f"{folder / 'graph.json'} is not a {FORMAT} file (format field "
                             f"{meta.get('format') if isinstance(meta, dict) else None!r})")
        if meta.get("version") != VERSION:
            raise ValueError(f"{folder / 'graph.json'} has version {meta.get('version')!r}; this reader knows {VERSION}")
        tensors = load_file(str(folder / "graph.safetensors"))
        missing = [n for n in TENSORS if n not in tensors] + [
            n for n in ("input_string", "logit_targets", "vocab_size", "n_layers") if n not in meta]
        if missing:
            raise ValueError(f"the saved graph in {folder} lacks the field(s) {missing}")
        try:
            return cls(input_string=meta["input_string"], logit_targets=[(str(t), int(i)) for t, i in meta["logit_targets"]],
                       vocab_size=int(meta["vocab_size"]), n_layers=int(meta["n_layers"]), cfg=meta.get("cfg") or {},
                       scan=meta.get("scan"), prefix=int(meta.get("prefix", 1)),
                       input_token_strings=list(meta.get("input_token_strings") or []), info=meta.get("info") or {},
                       **{n: tensors[n] for n in TENSORS})
        except ValueError as e:
            raise ValueError(f"the saved graph in {folder} is inconsistent: {e}") from e


def _atomic(path: Path, write) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        write(Path(tmp))
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
