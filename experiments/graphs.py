"""Attribution graphs and discovered circuits, each as one self-contained HTML page (`figures.graph`).

For each model with transcoders (beside its checkpoint, else shipped for its weights): the attribution
graph (`interp.attribute`) of each prompt, pruned (`interp.prune_graph`), with its replacement and
completeness scores, feature nodes linking their feature pages (`experiments.features`). Then circuits
found by EAP-IG (`interp.discover`), drawn with the same page: on the planted induction model
(`interp.planted`, whose circuit is known) and on each model for induction on repeated random tokens.

    python -m experiments.graphs [--model gpt-4] [--prompt "TEXT" ...] [--out DIR]
"""
from __future__ import annotations

import html
import os
import re
import sys
from typing import Any, Optional

import pandas as pd
import torch

import interp
from figures.graph import graph_page, shorten
from interp.discovery.planted import induction_metric, induction_pair, planted_model
from interp.induction.circuit import repeated_pair
from interp.saes.features import feature_report

from .common import add_text_file, fit_text, folder_of, held_out_text, number, positive, standalone, text_file
from .feature_pages import dictionary_page

NAME = "graphs"
DOC = "Attribution graphs of prompts and circuits found by EAP-IG, each drawn as one offline HTML page."
SUMMARY = ("Attribution graphs (interp.attribute: MLPs replaced by the shipped transcoders, attention and norms "
           "frozen, every edge an exact direct effect), pruned as circuit-tracer prunes, and circuits found by EAP-IG "
           "(interp.discover) on a planted induction model and on repeated random tokens, all drawn by one page "
           "component (figures.graph): token positions across, layers up; click a node for its edges and its "
           "feature page; the slider prunes edges by |weight|.")
NEEDS_MODELS = True
# A repeated invented name: the second "Zorbin" should be followed by " Plax", which only copying predicts.
PROMPTS = ["A baker named Zorbin Plax baked bread. The miller said: Zorbin"]
CIRCUIT_BUDGET = 0.05  # the fraction of edges kept in a discovered circuit


def add_args(p: Any) -> None:
    p.add_argument("--prompt", nargs="+", default=None, metavar="TEXT", help="prompts to trace (default: a repeated name)")
    p.add_argument("--features", type=positive, default=48, help="at most this many feature nodes per graph")
    p.add_argument("--chars", type=positive, default=4_000, help="held-out characters the feature pages read")
    add_text_file(p)  # the feature pages read it, and without --prompt its start is the prompt traced


def file_label(label: str) -> str:
    """A label (a model's folder name, a prompt) as a file name that stays in its folder: letters, digits,
    '-' and '_' only."""
    return re.sub(r"[^A-Za-z0-9_-]+", "-", str(label)).strip("-")[:40] or "x"


def transcoders(model: Any, folder: Any) -> Optional[list]:
    """One transcoder per layer, from `folder` if it has them all, else the shipped ones; None if neither."""
    for root in ([folder] if folder is not None else []) + [None]:
        try:
            return [interp.load_transcoder(model, layer, root=root) for layer in range(int(model.cfg.n_layers))]
        except FileNotFoundError:
            continue
    return None


def graph_frames(graph: Any, pruned: Any, page_of: Optional[str] = None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The pruned graph as the page's node and edge frames (kept nodes; kept edges, source -> target).

    `page_of` is the feature pages' folder (relative to the page); a feature links its latent there."""
    n = graph.nodes
    keep = pruned.node_mask.numpy()
    n = n[keep].copy()
    n["id"] = n["node"].astype(str)
    n["layer"] = n["layer"].where(n["kind"] != "logit", graph.n_layers)
    n["label"] = [_node_label(r) for r in n.itertuples()]
    n["influence"] = pruned.cumulative_influence.numpy()[keep]
    n["url"] = [f"{page_of}/mlp-{r.layer}-transcoder.html#l{r.feature}" if page_of and r.kind == "feature" else None
                for r in n.itertuples()]
    target, source = pruned.edge_mask.nonzero(as_tuple=True)
    e = pd.DataFrame({"source": source.numpy().astype(str), "target": target.numpy().astype(str),
                      "weight": graph.adjacency_matrix[target, source].double().numpy()})
    e = e[e["source"].isin(n["id"]) & e["target"].isin(n["id"])]
    return n.reset_index(drop=True), e.reset_index(drop=True)


def _node_label(r: Any) -> str:
    if r.kind == "feature":
        return f"F{r.feature}"
    if r.kind == "error":
        return "err"
    if r.kind == "logit":
        return f"{r.token} {r.probability:.2f}"
    return str(r.token)


def attribution_page(model: Any, label: str, prompt: str, tcs: list, max_features: int) -> tuple[str, pd.DataFrame, pd.DataFrame]:
    """(the page, graph_scores, its nodes) of one prompt's attribution graph; feature nodes link
    `<label>/mlp-<layer>-transcoder.html#l<feature>` (`feature_pages`)."""
    graph = interp.attribute(model, prompt, tcs, max_feature_nodes=max_features, batch_size=max_features + 16)
    pruned = interp.prune_graph(graph)
    scores = interp.graph_scores(graph)
    nodes, edges = graph_frames(graph, pruned, page_of=file_label(label))
    shown = {f"{k} ({g})": float(v) for g, row in scores.set_index("graph").iterrows()
             for k, v in row[["replacement", "completeness"]].items()}
    rows = {-1: "tokens", graph.n_layers: "logits", **{l: f"MLP {l}" for l in range(graph.n_layers)}}
    supers = _supernodes(nodes, edges)
    page = graph_page(nodes, edges, f"{label}: attribution graph", scores=shown, subtitle=f"prompt: {prompt}",
                      n_columns=graph.n_pos, rows=rows, supernodes=supers)
    return page, scores, nodes


def feature_pages(model: Any, label: str, tcs: list, nodes: pd.DataFrame, out: Any, text: str) -> int:
    """A page per transcoder holding the graphs' features (top held-out contexts, histogram, logit effects),
    in out/<label>/mlp-<layer>-transcoder.html, beside <label>.html listing the model's pages. Returns the
    number of feature pages written."""
    folder = out.dir / file_label(label)
    folder.mkdir(parents=True, exist_ok=True)
    js = os.path.relpath(out.plotly_js(), folder).replace(os.sep, "/")
    feats = nodes[nodes["kind"] == "feature"]
    for layer, group in feats.groupby("layer"):
        rep = feature_report(model, tcs[int(layer)], text, latents=sorted(set(group["feature"].astype(int))))
        page = dictionary_page(f"MLP {int(layer)} transcoder", file_label(label), rep, js)
        (folder / f"mlp-{int(layer)}-transcoder.html").write_text(page, encoding="utf-8")
    return feats["layer"].nunique()


def _supernodes(nodes: pd.DataFrame, edges: pd.DataFrame) -> list[tuple[str, list[str]]]:
    """The last layer's features at the last position that push the top logit up, as one box ("say X"),
    when there are at least 3 of them (circuit-tracer's pages group such features by hand)."""
    logits = nodes[nodes["kind"] == "logit"]
    if not len(logits):
        return []
    top = logits.sort_values("probability", ascending=False).iloc[0]
    feats = nodes[(nodes["kind"] == "feature") & (nodes["pos"] == nodes["pos"].max())]
    feats = feats[feats["layer"] == feats["layer"].max()] if len(feats) else feats
    up = edges[(edges["target"] == top["id"]) & (edges["weight"] > 0) & edges["source"].isin(feats["id"])]
    ids = [i for i in feats["id"] if i in set(up["source"])]
    return [(f"say {shorten(top['token'], 8)} x{len(ids)}", ids)] if len(ids) >= 3 else []


def circuit_frames(circuit: Any, n_heads: int) -> tuple[pd.DataFrame, pd.DataFrame]:
    """A discovered circuit as the page's frames: embed at the bottom, heads and the MLP of each layer
    across, logits on top; the circuit's edges (score as weight, the receiver's input as label)."""
    n = circuit.nodes.copy()
    n["id"], n["label"] = n["node"], n["node"]
    n["pos"] = [int(x[x.index("H") + 1:]) if k == "head" else (n_heads if k == "mlp" else n_heads // 2)
                for x, k in zip(n["node"], n["kind"])]
    kept = circuit.kept
    e = pd.DataFrame({"source": kept["sender"], "target": kept["receiver"], "weight": kept["score"].astype(float),
                      "label": kept["via"]})
    return n, e


def circuit_page(model: Any, clean: torch.Tensor, corrupted: torch.Tensor, metric: Any, title: str,
                 subtitle: str, budget: Optional[float] = CIRCUIT_BUDGET) -> tuple[str, Any]:
    """(the page, the Circuit) of EAP-IG with resample ablation, keeping `budget` of the edges (None:
    `interp.discover`'s default, every edge scoring at least 1% of the largest)."""
    circuit = interp.discover(model, clean, corrupted, metric, method="eap-ig", budget=budget)
    nodes, edges = circuit_frames(circuit, int(model.cfg.n_heads))
    n_layers = int(model.cfg.n_layers)
    rows = {-1: "embed", n_layers: "logits", **{l: f"layer {l}" for l in range(n_layers)}}
    areas = interp.discovery.faithfulness_areas(interp.faithfulness_curve(
        model, clean, corrupted, metric, circuit.edges, baselines=())).iloc[0]
    scores = {"edges kept": len(edges), "of": len(circuit.edges), "CPR": float(areas["cpr"]), "CMD": float(areas["cmd"])}
    return graph_page(nodes, edges, title, scores=scores, subtitle=subtitle, n_columns=int(model.cfg.n_heads) + 1,
                      rows=rows), circuit


def write(out: Any, stem: str, page: str) -> None:
    path = out.dir / f"{stem}.html"
    path.write_text(page, encoding="utf-8")
    pages = getattr(out, "pages", None)
    if pages is not None:
        pages.append(path)


def run(models: Any, out: Any, args: Any) -> list[dict]:
    rows = []
    own = text_file(getattr(args, "text_file", None))  # one's own text, read before any work
    for label, model in models.items():
        tcs = transcoders(model, folder_of(models, label))
        if tcs is None:
            rows.append(number("attribution graphs", "no transcoders shipped or beside the checkpoint", None, label))
        shown = []
        for k, prompt in enumerate((args.prompt or ([own] if own else PROMPTS)) if tcs is not None else []):
            assert tcs is not None  # for mypy: the loop runs only with transcoders
            page, scores, nodes = attribution_page(model, label, fit_text(model, prompt), tcs, args.features)
            write(out, f"graph_{file_label(label)}_{k}", page)
            shown.append(nodes)
            pruned = scores.set_index("graph").loc["pruned"]
            rows += [number(f"prompt {k}: replacement score (pruned graph)", float(pruned.replacement), None, label),
                     number(f"prompt {k}: completeness score (pruned graph)", float(pruned.completeness), None, label)]
        if shown and tcs is not None:
            text = own or held_out_text(model, args.chars, folder=folder_of(models, label))
            feature_pages(model, label, tcs, pd.concat(shown), out, text)
            _model_index(label, out)
        rows.append(_induction_circuit(model, label, out))
    rows.append(_planted_circuit(out))
    return rows


def _model_index(label: str, out: Any) -> None:
    """out/<label>.html: links to the model's graph pages (the feature pages link back here)."""
    stem = file_label(label)
    links = "".join(f"<li><a href='{p.name}'>{html.escape(p.stem)}</a></li>" for p in getattr(out, "pages", [])
                    if p.stem.startswith(f"graph_{stem}_"))
    (out.dir / f"{stem}.html").write_text(f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(label)}: "
                                          f"graphs</title></head><body><h1>{html.escape(label)}: attribution graphs</h1>"
                                          f"<ul>{links}</ul></body></html>", encoding="utf-8")


def _induction_circuit(model: Any, label: str, out: Any) -> dict:
    clean, corrupted = repeated_pair(model, half_len=16, n_seqs=4)
    metric = induction_metric(clean)
    page, circuit = circuit_page(model, clean, corrupted, metric, f"{label}: induction circuit (EAP-IG)",
                                 "repeated random tokens, resample ablation (other random tokens)")
    write(out, f"circuit_{file_label(label)}_induction", page)
    return number("induction circuit: edges kept (EAP-IG)", int(circuit.edges["in_circuit"].sum()), None, label, fmt="{:d}")


def _planted_circuit(out: Any) -> dict:
    model = planted_model("induction")
    clean, corrupted = induction_pair()
    page, circuit = circuit_page(model, clean, corrupted, induction_metric(clean), "planted induction circuit (EAP-IG)",
                                 "interp.planted's induction model: L0H0 feeds L1H0's keys; L0H1 and L1H1 are distractors",
                                 budget=None)
    write(out, "circuit_planted_induction", page)
    truth = interp.planted.truth("induction")
    found = {tuple(r) for r in circuit.kept[["sender", "receiver", "via"]].itertuples(index=False)}
    return number("planted induction circuit: true edges found (EAP-IG)", f"{len(truth & found)} of {len(truth)}")


def main(argv: Optional[list[str]] = None) -> int:
    return standalone(sys.modules[__name__], argv)


if __name__ == "__main__":
    raise SystemExit(main())
