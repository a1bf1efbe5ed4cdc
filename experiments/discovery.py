"""Circuits found on the demos: induction on repeated random tokens and copying the later pieces of invented names.

For each model, task, seed and length: EAP-IG's score for every edge (`interp.edge_scores`), exact
patching of every edge where the graph has at most EXACT_LIMIT edges (both demos: gpt-4's 309, sprout-mini's
1,997; larger graphs only with --exact-all), MIB's faithfulness curve of each ranking beside a random one (`interp.faithfulness_curve`)
with its CPR and CMD, how far EAP-IG agrees with exact patching, the heads its top edges touch, the
heads `interp.induction_circuit` names (path patching of the induction heads' inputs), and the Jaccard
overlap of those top-edge heads with the attribution graphs' (`interp.attribute`, `interp.head_loadings`:
the heads carrying the most |share| of the edges into the next token's logit, on GRAPH_PROMPTS prompts). The generated
Markdown block states only what holds in every setting run, and says which seeds and lengths those were.

    python -m experiments.discovery            # the full sweep: seeds 0 1 2, two lengths per task
    python -m experiments.discovery --quick    # one seed, one length (a smoke run; writes no docs block)

Writes results/discovery/{settings.csv, curves.csv} and the `discovery` block of docs/results/discovery.md
(`python -m experiments.ship NAME --only readme` runs it with the other generated blocks after a retraining).
Not in run_all: the full sweep takes minutes per model on a CPU.
"""
from __future__ import annotations

import argparse
import math
import random
from pathlib import Path
from typing import Any, Callable, Optional

import numpy as np
import pandas as pd
import torch

import interp
import sprout
from interp.discovery import edge_graph, edge_scores, faithfulness_areas, faithfulness_curve
from interp.discovery.planted import induction_metric
from interp.induction.circuit import repeated_pair
from interp.induction.stories import story_names
from sprout.files import demo_names
from sprout.material import generate_story
from sprout.tokenizer import raw

from .readme import home, md_table, rewrite

MODELS = ["gpt-4", "sprout-mini"]
SEEDS = (0, 1, 2)
LENGTHS: dict[str, tuple[int, ...]] = {"induction": (16, 32), "names": (64, 96)}  # half length of [A A]; tokens of each story
N_SEQS = 4  # sequences (or stories) per batch
EXACT_LIMIT = 2500  # exact patching of every edge only for graphs up to this many edges (unless --exact-all)
TOP = 0.05  # "top edges": this fraction of the graph by |score|
GRAPH_PROMPTS, GRAPH_LEN = 2, 24  # attribution graphs: the first sequences of seed 0's shortest task, cut to this many tokens
BLOCK, SUMMARY_BLOCK = "discovery", "discovery-summary"  # the page's block; the README's sentences
DOC = home(BLOCK, Path("."))  # docs/results/discovery.md
Task = tuple[torch.Tensor, torch.Tensor, Callable[[torch.Tensor], torch.Tensor]]


def induction_task(model: Any, half: int, seed: int) -> Task:
    """Clean [A A] and corrupted [B B] repeated random tokens [N_SEQS, 2 half]; the metric is the mean
    log p of the right next token over the clean tokens' induction positions."""
    clean, corrupted = repeated_pair(model, half_len=half, n_seqs=N_SEQS, seed=1000 * seed)
    return clean, corrupted, induction_metric(clean)


def _story(model: Any, length: int, rng: random.Random) -> Optional[tuple[list[int], torch.Tensor]]:
    """One generated story cut to `length` tokens and bool [length]: positions whose next token is a later
    piece (not the first) of a name's second or later occurrence; None if too short or without one."""
    story = generate_story(rng)
    enc = raw(model.tokenizer).encode(story, add_special_tokens=False)
    ids, offsets = enc.ids, enc.offsets
    if len(ids) < length:
        return None
    where = torch.zeros(length, dtype=torch.bool)
    for spans in story_names(story).values():
        for start, end in spans[1:]:
            pieces = [p for p in range(length) if offsets[p][0] < end and offsets[p][1] > start]
            for p in pieces[1:]:
                where[p - 1] = True
    return (ids[:length], where) if where.any() else None


def _stories(model: Any, length: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    rows: list[list[int]] = []
    masks = []
    for i in range(200 * N_SEQS):
        got = _story(model, length, random.Random(f"discovery-{seed}-{length}-{i}"))
        if got is not None:
            rows.append(got[0])
            masks.append(got[1])
        if len(rows) == N_SEQS:
            return torch.tensor(rows), torch.stack(masks)
    raise ValueError(f"fewer than {N_SEQS} generated stories of {length} tokens hold a repeated name")


def names_task(model: Any, length: int, seed: int) -> Task:
    """Clean stories [N_SEQS, length] whose invented names come back, corrupted other stories (other
    names); the metric is the mean log p of the later pieces of names at their later occurrences, which
    only copying can predict."""
    if getattr(model, "tokenizer", None) is None:
        raise ValueError("the names task needs a model with a tokenizer")
    clean, where = _stories(model, length, seed)
    corrupted, _ = _stories(model, length, seed + 10_000)
    nxt = torch.zeros_like(clean)
    nxt[:, :-1] = clean[:, 1:]

    def metric(logits: torch.Tensor) -> torch.Tensor:
        logp = logits.float().log_softmax(-1).gather(-1, nxt[..., None].to(logits.device))[..., 0]
        mask = where.to(logits.device)
        return (logp * mask).sum() / mask.sum()
    return clean.to(model.cfg.device), corrupted.to(model.cfg.device), metric


TASKS = {"induction": induction_task, "names": names_task}
TASK_WORDS = {"induction": "induction on repeated random tokens", "names": "the later pieces of invented names"}


def top_heads(scores: pd.DataFrame, top: float = TOP) -> list[str]:
    """The heads (senders or receivers) of the top `top` fraction of edges by |score|, sorted."""
    n = max(1, math.ceil(top * len(scores)))
    best = scores.reindex(scores["score"].abs().sort_values(ascending=False).index).head(n)
    heads = set(best["sender"]) | set(best["receiver"])
    return sorted(h for h in heads if h.startswith("L"))


def agreement(scores: np.ndarray, exact: np.ndarray, top: float = TOP) -> tuple[float, float]:
    """(Pearson r with exact, the share of exact's top `top` edges by |score| also in the method's top)."""
    n = max(1, math.ceil(top * len(exact)))
    best = set(np.argsort(-np.abs(exact))[:n].tolist())
    ours = set(np.argsort(-np.abs(scores))[:n].tolist())
    return float(np.corrcoef(scores, exact)[0, 1]), len(best & ours) / n


def one_setting(model: Any, task: Task, exact: bool, steps: int) -> tuple[dict, pd.DataFrame, pd.DataFrame]:
    """The row of numbers, the faithfulness curve and the edge scores (EAP-IG, exact if asked, stacked)
    of one (model, task, seed, length)."""
    clean, corrupted, metric = task
    frames = [edge_scores(model, clean, corrupted, metric, method="eap-ig", steps=steps)]
    if exact:
        frames.append(edge_scores(model, clean, corrupted, metric, method="exact"))
    scores = pd.concat(frames, ignore_index=True)
    curve = faithfulness_curve(model, clean, corrupted, metric, scores, baselines=("random",))
    areas = faithfulness_areas(curve).set_index("method")
    ig = frames[0]
    row: dict[str, Any] = {"n_edges": len(ig), "metric_clean": float(metric(model(clean)).item()),
                           "metric_corrupted": float(metric(model(corrupted)).item()), "top_heads": " ".join(top_heads(ig)),
                           "top_edge": "{} -> {} ({})".format(*ig.loc[ig["score"].abs().idxmax(), ["sender", "receiver", "via"]])}
    for name in areas.index:
        row[f"cpr_{name}"], row[f"cmd_{name}"] = float(areas.loc[name, "cpr"]), float(areas.loc[name, "cmd"])
    if exact:
        row["pearson_exact"], row["top_found"] = agreement(ig["score"].to_numpy(), frames[1]["score"].to_numpy())
    return row, curve, scores


def circuit_heads(model: Any) -> str:
    """The heads `interp.induction_circuit` names: its induction heads and the heads feeding them."""
    frame, _ = interp.induction_circuit(model, stories=False)
    if frame.empty:
        return ""
    return " ".join(sorted(set(frame["receiver"]) | set(frame.loc[frame["feeds"].astype(bool), "sender"])))


def graph_head_loads(model: Any, tokens: torch.Tensor, transcoders: Any = None) -> pd.Series:
    """Total |head-loading share| per head ("L{layer}H{head}") of the edges into the logit node of
    `interp.attribute`'s graph of tokens[:-1] with target the actual next token tokens[-1] (the bypass left out).

    Args:
        model: the model (or a ReplacementModel, then no transcoders); transcoders as in `interp.attribute`.
        tokens: ids [pos + 1]: the prompt and its next token.
    """
    graph = interp.attribute(model, tokens[:-1], transcoders, target=[int(tokens[-1])])
    logit = graph.slices()["logit"].start
    loads: dict[str, float] = {}
    for layer in range(graph.n_layers):
        frame = interp.head_loadings(model, graph, logit, layer, transcoders)
        per = frame.loc[frame["head"] >= 0, ["head", "share"]].abs().groupby("head")["share"].sum()
        loads.update({f"L{layer}H{h}": float(per.get(h, 0.0)) for h in range(graph_heads_count(model))})
    return pd.Series(loads)


def graph_heads_count(model: Any) -> int:
    """Heads per block of a model or a ReplacementModel."""
    return int(getattr(model, "model", model).cfg.n_heads)


def top_loaded(loads: pd.Series, k: int) -> list[str]:
    """The `k` heads with the largest loads (ties by name), sorted by name."""
    order = sorted(loads.index, key=lambda h: (-loads[h], h))
    return sorted(order[:max(0, k)])


def jaccard(a: set, b: set) -> float:
    """|a & b| / |a | b| (1.0 for two empty sets)."""
    return len(a & b) / len(a | b) if a | b else 1.0


def graph_overlaps(loads: list[pd.Series], eap_heads: list[str]) -> dict[str, Any]:
    """Per graph prompt i: its top-k heads by load (k = len(eap_heads)) and their Jaccard with `eap_heads`."""
    out: dict[str, Any] = {}
    for i, load in enumerate(loads):
        top = top_loaded(load, len(eap_heads))
        out[f"graph_heads_p{i}"] = " ".join(top)
        out[f"jaccard_graph_p{i}"] = jaccard(set(top), set(eap_heads))
    return out


def task_graph_loads(model: Any, task: str, length: int) -> list[pd.Series]:
    """`graph_head_loads` of the graph prompts of `task` (seed 0 at `length`: its first GRAPH_PROMPTS
    sequences, cut to GRAPH_LEN tokens and the next); [] when the model has no shipped transcoders."""
    with torch.no_grad():
        clean = TASKS[task](model, length, 0)[0]
    try:
        return [graph_head_loads(model, clean[i, :GRAPH_LEN + 1].cpu()) for i in range(GRAPH_PROMPTS)]
    except (FileNotFoundError, ValueError) as e:
        print(f"no attribution graphs for {task}: {e}", flush=True)
        return []


def sweep(models: dict[str, Any], seeds: tuple[int, ...], lengths: dict[str, tuple[int, ...]],
          exact_all: bool, steps: int) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(one row per model, task, seed and length; every curve stacked) over the whole grid."""
    rows, curves = [], []
    for label, model in models.items():
        exact = exact_all or edge_graph(model).n_edges <= EXACT_LIMIT
        heads = circuit_heads(model)
        for task, make in TASKS.items():
            loads = task_graph_loads(model, task, min(lengths[task]))
            for seed in seeds:
                for length in lengths[task]:
                    with torch.no_grad():
                        data = make(model, length, seed)
                    row, curve, _ = one_setting(model, data, exact, steps)
                    key = dict(model=label, task=task, seed=seed, length=length)
                    graphs = graph_overlaps(loads, row["top_heads"].split())
                    rows.append({**key, **row, "induction_circuit_heads": heads, **graphs})
                    curves.append(curve.assign(**key))
                    print(label, task, seed, length, {k: v for k, v in row.items() if k.startswith("cpr")}, flush=True)
    return pd.DataFrame(rows), pd.concat(curves, ignore_index=True)


def claims(table: pd.DataFrame) -> list[str]:
    """Sentences each true in every row of `table` (one model and task), else left out."""
    out = []
    if (table["cpr_eap-ig-inputs"] > table["cpr_random"]).all() and (table["cmd_eap-ig-inputs"] < table["cmd_random"]).all():
        out.append("EAP-IG's ranking beats a random one on both CPR (higher) and CMD (lower)")
    ig, rand = table["cpr_eap-ig-inputs"], table["cpr_random"]
    out.append(f"EAP-IG's CPR is {ig.min():.2f} to {ig.max():.2f}, a random ranking's {rand.min():.2f} to {rand.max():.2f}")
    if "cpr_exact" in table and (table["cpr_eap-ig-inputs"] >= table["cpr_exact"] - 0.05).all():
        out.append("EAP-IG's CPR is within 0.05 of exact patching's")
    elif "cpr_exact" in table and (table["cpr_exact"] > table["cpr_eap-ig-inputs"]).all():
        out.append(f"exact patching's ranking has the higher CPR ({table['cpr_exact'].min():.2f} to "
                   f"{table['cpr_exact'].max():.2f}): EAP-IG falls short of the exact ranking")
    if "top_found" in table and table["top_found"].min() > 0:
        out.append(f"EAP-IG finds at least {table['top_found'].min():.0%} of exact patching's top {TOP:.0%} of edges "
                   f"(Pearson r of the scores at least {table['pearson_exact'].min():.2f})")
    if table["top_edge"].nunique() == 1:
        out.append(f"EAP-IG's top edge is {table['top_edge'].iloc[0]}")
    common = set.intersection(*(set(h.split()) for h in table["top_heads"]))
    if common:
        out.append(f"the heads of EAP-IG's top {TOP:.0%} of edges always include {', '.join(sorted(common))}")
    out += graph_claims(table)
    named = set(table["induction_circuit_heads"].iloc[0].split())
    if named and all(named <= set(h.split()) for h in table["top_heads"]):
        out.append(f"every head `induction_circuit` names ({', '.join(sorted(named))}) is among them")
    return out


def graph_claims(table: pd.DataFrame) -> list[str]:
    """The sentence on the attribution graphs' heads, only if every prompt overlaps in every row."""
    cols = [c for c in table.columns if c.startswith("jaccard_graph_p")]
    if not cols or not (table[cols] > 0).all().all():
        return []
    j = table[cols].to_numpy()
    return [f"the attribution graphs' top heads by total |head-loading share| of the edges into the next token's logit "
            f"(prompts: sequences 0 to {len(cols) - 1} of seed 0's shortest length, first {GRAPH_LEN} tokens) overlap "
            f"EAP-IG's top-edge heads (as many) in every setting, Jaccard {j.min():.2f} to {j.max():.2f}"]


def markdown(rows: pd.DataFrame) -> str:
    """The generated block: per model and task, the sentences that hold over every seed and length run."""
    lines = []
    for (label, task), table in rows.groupby(["model", "task"], sort=False):
        seeds = ", ".join(str(s) for s in sorted(table["seed"].unique()))
        lengths = ", ".join(str(n) for n in sorted(table["length"].unique()))
        said = claims(table)
        what = f"{TASK_WORDS[task]} ({'length = half' if task == 'induction' else 'length = story tokens'})"
        lines.append(f"- **{label}, {what}** ({table['n_edges'].iloc[0]} edges; holds over seeds {seeds} "
                     f"and lengths {lengths}): " + ("; ".join(said) + "." if said else "no sentence holds in every setting."))
    cols = ["model", "task", "seed", "length"] + [c for c in rows.columns if c.startswith(("cpr_", "cmd_"))] + \
        [c for c in rows.columns if c == "top_found" or c.startswith("jaccard_graph_p")]
    return "\n".join(lines + ["", md_table(rows[cols])])


def summary(rows: pd.DataFrame) -> str:
    """The README's sentences over every setting run (model, task, seed, length): each says in how many of
    them what it states holds."""
    n, ig, rand = len(rows), rows["cpr_eap-ig-inputs"], rows["cpr_random"]
    tasks = ", ".join(TASK_WORDS[t] for t in rows["task"].unique())
    seeds = ", ".join(str(s) for s in sorted(rows["seed"].unique()))
    where = (f"{n} settings ({', '.join(rows['model'].unique())}; {tasks}; seeds {seeds}, "
             f"{rows.groupby('task')['length'].nunique().max()} lengths per task)")
    beats = int(((ig > rand) & (rows["cmd_eap-ig-inputs"] < rows["cmd_random"])).sum())
    out = [f"Over {where}, EAP-IG's ranking of every edge (5 steps, resample ablation) beats a random ranking on both "
           f"CPR and CMD in {beats} of {n} (CPR {ig.min():.2f} to {ig.max():.2f}, random {rand.min():.2f} to {rand.max():.2f})"]
    if "cpr_exact" in rows and rows["cpr_exact"].notna().all():
        ex = rows["cpr_exact"]
        edges = ", ".join(f"{m} {e}" for m, e in rows.groupby("model", sort=False)["n_edges"].first().items())
        out.append(f"exact patching of every edge ({edges} edges) ranks them with CPR {ex.min():.2f} to {ex.max():.2f}, "
                   f"and EAP-IG's CPR is within 0.05 of it or above in {int((ig >= ex - 0.05).sum())} of {n}")
    named = [set(str(h).split()) <= set(str(t).split()) for h, t in zip(rows["induction_circuit_heads"], rows["top_heads"])]
    out.append(f"every head `induction_circuit` names is among the heads of EAP-IG's top {TOP:.0%} of edges in "
               f"{sum(named)} of {n}")
    return "; ".join(out) + "."


def write(doc: Path, rows: pd.DataFrame) -> None:
    """The page's block and, in the README of the checkout holding the page (docs/results/ two levels down),
    the summary block."""
    rewrite(doc, BLOCK, markdown(rows))
    rewrite(home(SUMMARY_BLOCK, Path(doc).resolve().parents[2]), SUMMARY_BLOCK, summary(rows))


def main(argv: Optional[list[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="python -m experiments.discovery", description=__doc__.splitlines()[0])
    p.add_argument("--model", "--models", dest="models", nargs="+", default=None, help=f"default: {' '.join(MODELS)}")
    p.add_argument("--quick", action="store_true", help="one seed and one length per task; no docs block")
    p.add_argument("--exact-all", action="store_true", help=f"exact patching even above {EXACT_LIMIT} edges")
    p.add_argument("--steps", type=int, default=5, help="EAP-IG's steps")
    p.add_argument("--device", default="cpu")
    p.add_argument("--out", default="results/discovery")
    p.add_argument("--from-csv", nargs="+", default=None, metavar="CSV",
                   help="write the block from settings.csv files of earlier runs (stacked) instead of running")
    p.add_argument("--doc", "--readme", dest="doc", default=str(DOC),
                   help="the Markdown file holding the generated block (--readme: as experiments.ship passes it)")
    args = p.parse_args(argv)
    if args.from_csv:
        rows = pd.concat([pd.read_csv(f) for f in args.from_csv], ignore_index=True)
        heads = ["top_heads", "induction_circuit_heads"] + [c for c in rows if c.startswith("graph_heads_p")]  # "" -> NaN
        filled = {c: rows[c].astype(object).where(rows[c].notna(), "").astype(str) for c in heads}
        write(Path(args.doc), rows.assign(**filled))
        return 0
    torch.manual_seed(0)
    names = args.models or [m for m in MODELS if m in demo_names()]
    models = {m: sprout.load(m).to(args.device).eval() for m in names}
    seeds = SEEDS[:1] if args.quick else SEEDS
    lengths = {k: v[:1] for k, v in LENGTHS.items()} if args.quick else LENGTHS
    rows, curves = sweep(models, seeds, lengths, args.exact_all, args.steps)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows.to_csv(out / "settings.csv", index=False)
    curves.to_csv(out / "curves.csv", index=False)
    print(markdown(rows), "\n\nREADME:", summary(rows))
    if not args.quick:
        write(Path(args.doc), rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
