"""The demo finding: gpt-4's attribution graph of copying the next piece of a repeated invented name, its
sentences checked by interventions on held-out prompts other than the one shown.

The shown prompt is `experiments.graphs.PROMPTS[0]` ("... Zorbin Plax ... Zorbin"; its page is drawn by
`python -m experiments.graphs`). The held-out prompts put names the corpus generator cannot draw
(`sprout.material.unseen_name`) in the frames below, written for this experiment, cut after each later
piece of the second occurrence in turn. For each: `interp.graphs.name_copy` (the graph of the correct
next piece's logit, its groups' shares, the heads carrying the copy) and `interp.graphs.copy_interventions`
(each supernode ablated, three regimes, beside random features of the same activation). A sentence is
written only where its numbers hold; else the block says what was measured instead.

    python -m experiments.graph_finding [--model gpt-4] [--prompts 24] [--out results/graph_finding]

Writes results/graph_finding/{prompts,groups,heads,interventions}.csv, the `graph-finding` block of
docs/results/graph-finding.md and the README's `graph-finding-summary` block. About 3 minutes on two
CPU cores (154 s measured); not in run_all, which it would slow by that much (`python -m experiments.ship NAME --only
readme` reruns it with the other generated blocks).
"""
from __future__ import annotations

import argparse
import random
import time
from pathlib import Path
from typing import Any, Optional

import pandas as pd
import torch

import sprout
from interp.graphs import SUPERNODES, copy_interventions, name_copy
from sprout.material import generator_can_draw, unseen_name

from .graphs import PROMPTS
from .readme import home, md_table, rewrite

BLOCK, SUMMARY_BLOCK = "graph-finding", "graph-finding-summary"
DOC = home(BLOCK, Path("."))  # docs/results/graph-finding.md
SHOWN = PROMPTS[0]
# Hand-written frames, none of them the generator's: {n} is the name; the prompt is cut inside the second {n}.
FRAMES = [
    "Yesterday {n} walked to the harbour, and everyone on the pier waved at {n}",
    "The letter was signed by {n}. A week later the reply was addressed to {n}",
    "Our new neighbour is called {n}. The children already shout hello to {n}",
    "Entry 12: the lighthouse keeper, {n}, logged a storm. In the morning {n}",
    "Please welcome our speaker, {n}! Questions for {n}",
    "The prize went to {n} this year; the judges said that {n}",
]
N_PROMPTS = 24
MAX_FEATURES = 256  # feature rows per graph: the most influential (the rest fall into the constant)
N_RANDOM = 20  # random groups per ablation: their 5th percentile is the bar to beat
HEAD_FRACTION = 0.15  # a head "carries" the copy when it holds at least this share of the earlier piece's edges
REGIME = "free"  # the regime the headline sentences speak of: the real model, nothing held


def held_out_prompts(model: Any, n: int = N_PROMPTS, seed: int = 0) -> list[dict]:
    """`n` prompts: FRAMES in turn, each with a new name the generator cannot draw, cut after the name's
    1st, 2nd, ... piece in turn (only later pieces are predicted). Rows: text (the whole frame), name, cut
    (pieces kept), tokens (the prompt's ids), target (the next piece's id)."""
    rng = random.Random(f"graph-finding-{seed}")
    out: list[dict] = []
    while len(out) < n:
        i = len(out)
        name = unseen_name(rng)
        assert not generator_can_draw(name) and name not in SHOWN  # held out: not the shown prompt's, not the corpus's
        text = FRAMES[i % len(FRAMES)].format(n=name)
        head = text[:text.rindex(name) - 1]  # before the second occurrence's space
        ids, before = model.to_tokens(text)[0], model.to_tokens(head)[0]
        if not torch.equal(ids[:len(before)], before):
            continue
        pieces = len(ids) - len(before)
        if pieces < 2:
            continue
        cut = 1 + (i // len(FRAMES)) % (pieces - 1)
        out.append({"text": text, "name": name, "cut": cut, "tokens": ids[:len(before) + cut],
                    "target": int(ids[len(before) + cut])})
    return out


def measure(model: Any, prompts: list[dict], max_features: int = MAX_FEATURES,
            n_random: int = N_RANDOM) -> dict[str, pd.DataFrame]:
    """Every prompt's finding and ablations, stacked: {"prompts", "groups", "heads", "interventions"},
    each with a `prompt` column (its index)."""
    rows, groups, heads, ivs = [], [], [], []
    for k, p in enumerate(prompts):
        found = name_copy(model, p["tokens"], max_feature_nodes=max_features, batch_size=max_features + 16)
        if found.site.target != p["target"]:
            raise ValueError(f"prompt {k} ({p['text']!r}): the earlier match predicts another token than the name's")
        rows.append({"prompt": k, "name": p["name"], "cut": p["cut"], "text": model.to_string(p["tokens"]),
                     "probability": found.probability, "top1": found.top1, "value": found.value,
                     "match_length": found.site.length})
        groups.append(found.groups.drop(columns="nodes").assign(prompt=k))
        heads.append(found.heads.assign(prompt=k))
        ivs.append(copy_interventions(model, found, n_random=n_random).assign(prompt=k))
    return {"prompts": pd.DataFrame(rows), "groups": pd.concat(groups, ignore_index=True),
            "heads": pd.concat(heads, ignore_index=True), "interventions": pd.concat(ivs, ignore_index=True)}


def ablation_table(ivs: pd.DataFrame, n_prompts: int) -> pd.DataFrame:
    """Per supernode and regime: prompts (where it has features), median measured / predicted change,
    lowered (prompts where the logit fell), beats_random (where it fell beyond the random groups' 5th percentile)."""
    g = ivs.groupby(["supernode", "regime"], sort=False)
    return pd.DataFrame({"prompts": g.size(), "of": n_prompts, "median_n_nodes": g["n_nodes"].median(),
                         "median_measured": g["measured"].median(), "median_predicted_direct": g["predicted_direct"].median(),
                         "median_predicted_total": g["predicted_total"].median(),
                         "lowered": g["measured"].apply(lambda m: int((m < 0).sum())),
                         "beats_random": g["beats_random"].sum().astype(int)}).reset_index()


def carrying_heads(heads: pd.DataFrame, into: str = "logit") -> pd.DataFrame:
    """Per (layer, head): in how many prompts it holds at least HEAD_FRACTION of the earlier piece's edges
    into `into`, and its median fraction; the named heads first."""
    h = heads[heads["into"] == into]
    g = h.groupby(["layer", "head"])
    out = pd.DataFrame({"prompts": g["fraction"].apply(lambda f: int((f >= HEAD_FRACTION).sum())),
                        "median_fraction": g["fraction"].median()}).reset_index()
    out["name"] = [f"L{r.layer}H{r.head}" for r in out.itertuples()]
    return out.sort_values(["prompts", "median_fraction"], ascending=False, ignore_index=True)


def majority(n: int, of: int) -> bool:
    return 2 * n > of


def sentences(found: dict[str, pd.DataFrame]) -> dict[str, str]:
    """The block's sentences, keyed: "accuracy", "shares", "heads", and one per supernode ("ablate: NAME");
    each states what holds, or says that it does not."""
    p = found["prompts"]
    M = len(p)
    out = {"accuracy": f"On {int(p['top1'].sum())} of {M} held-out prompts gpt-4 puts the correct next piece first "
                       f"(mean probability {p['probability'].mean():.0%})"}
    out["shares"] = _shares_sentence(found["groups"], M)
    out["heads"] = _heads_sentence(found["heads"], M)
    table = ablation_table(found["interventions"], M)
    for name in SUPERNODES:
        out[f"ablate: {name}"] = _ablation_sentence(table, name, M)
    return out


TOKEN = "the earlier next piece's token"


def _shares_sentence(groups: pd.DataFrame, M: int) -> str:
    parts = groups[groups["group"] != "constant"]
    med = parts.groupby("group")["share"].median().sort_values(ascending=False)
    wide = parts.pivot(index="prompt", columns="group", values="share")
    n_top = int((wide.idxmax(axis=1) == TOKEN).sum())
    rest = ", ".join(f"{g} {med[g]:.0%}" for g in med.index[:4] if g != TOKEN)
    if med.index[0] == TOKEN and majority(n_top, M):
        return (f"The largest direct part of the next piece's logit is the earlier occurrence's copy of that piece (its "
                f"token embedding, moved there by attention): a median {med[TOKEN]:.0%} of the logit, the largest part on "
                f"{n_top} of {M} prompts; next come {rest} (medians)")
    return (f"The earlier occurrence's copy of the piece (its token embedding) is not the largest direct part of the "
            f"logit on most prompts (the largest on {n_top} of {M}; median {med[TOKEN]:.0%}); the largest median parts "
            f"are {', '.join(f'{g} {med[g]:.0%}' for g in med.index[:3])}")


def _heads_sentence(heads: pd.DataFrame, M: int) -> str:
    table = carrying_heads(heads)
    named = table[[majority(n, M) for n in table["prompts"]]].sort_values(["layer", "median_fraction"],
                                                                          ascending=[True, False])
    if named.empty:
        return "No head carries the earlier piece's edges into the logit on most prompts"
    heads = ", ".join(f"{r.name} (median {r.median_fraction:.0%}, on {r.prompts})" for r in named.itertuples())
    return (f"Head loadings put those edges, from the earlier piece's position into the logit, through {heads} "
            f"of {M} prompts (at least {HEAD_FRACTION:.0%} of the edges each)")


def _ablation_sentence(table: pd.DataFrame, name: str, M: int) -> str:
    rows = table[(table["supernode"] == name)].set_index("regime")
    if REGIME not in rows.index:
        return f"No prompt has {name}"
    r = rows.loc[REGIME]
    frozen = rows.loc["frozen attention and norms"]
    if majority(int(r["lowered"]), M) and majority(int(r["beats_random"]), M):
        return (f"Ablating the {name} (median {r['median_n_nodes']:.0f} features) lowers the next piece's logit on "
                f"{int(r['lowered'])} of {M} prompts, by a median of {-r['median_measured']:.2f} in the free model "
                f"({-frozen['median_measured']:.2f} with attention and norms frozen; the graph predicts "
                f"{-r['median_predicted_total']:.2f}), beating random features of the same activation on "
                f"{int(r['beats_random'])}")
    return (f"Ablating the {name} does not reliably lower the next piece's logit: in the free model it falls on "
            f"{int(r['lowered'])} and beats random features of the same activation on {int(r['beats_random'])} of {M} "
            f"prompts ({int(r['prompts'])} have such features; median change {r['median_measured']:+.2f}, the graph's "
            f"prediction {r['median_predicted_total']:+.2f})")


def markdown(found: dict[str, pd.DataFrame], shown: Any) -> str:
    """The docs block: the shown prompt's groups, the sentences, the ablation and head tables."""
    said = sentences(found)
    lines = [f"Shown prompt: `{SHOWN}` (next piece {shown.graph.logit_targets[0][0]!r}, probability "
             f"{shown.probability:.0%}). Its groups' shares of the logit:", "",
             md_table(shown.groups.drop(columns="nodes")), "",
             f"On {len(found['prompts'])} held-out prompts ({len(FRAMES)} frames, names the generator cannot draw; the "
             f"shown prompt excluded), {MAX_FEATURES} feature rows per graph, {N_RANDOM} random groups per ablation:", ""]
    lines += [f"- {s}." for s in said.values()]
    med = found["groups"].groupby("group", sort=False)["share"].median().rename("median share").reset_index()
    lines += ["", md_table(med), "", md_table(ablation_table(found["interventions"], len(found["prompts"]))), "",
              md_table(carrying_heads(found["heads"]).head(6))]
    return "\n".join(lines)


def summary(found: dict[str, pd.DataFrame]) -> str:
    """The README's sentences: accuracy, shares and the copy features' ablation."""
    said = sentences(found)
    keys = ("accuracy", "shares", f"ablate: {SUPERNODES[0]}")
    return " ".join(f"{said[k]}." for k in keys)


def main(argv: Optional[list[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="python -m experiments.graph_finding", description=__doc__.splitlines()[0])
    p.add_argument("--model", default="gpt-4")
    p.add_argument("--prompts", type=int, default=N_PROMPTS, help="held-out prompts")
    p.add_argument("--out", default="results/graph_finding")
    p.add_argument("--doc", "--readme", dest="doc", default=str(DOC),
                   help="the Markdown file holding the block (--readme: as experiments.ship passes it); the README "
                        "beside its docs/ folder gets the summary block")
    p.add_argument("--no-write", action="store_true", help="print the block, write no Markdown")
    args = p.parse_args(argv)
    torch.manual_seed(0)
    start = time.perf_counter()
    model = sprout.load(args.model).eval()
    found = measure(model, held_out_prompts(model, args.prompts))
    shown = name_copy(model, SHOWN, max_feature_nodes=MAX_FEATURES, batch_size=MAX_FEATURES + 16)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for key, frame in found.items():
        frame.to_csv(out / f"{key}.csv", index=False)
    text = markdown(found, shown)
    print(text, "\n\nREADME:", summary(found), f"\n\n{time.perf_counter() - start:.0f} s")
    if not args.no_write:
        doc = Path(args.doc)
        rewrite(doc, BLOCK, text)
        rewrite(home(SUMMARY_BLOCK, doc.resolve().parents[2]), SUMMARY_BLOCK, summary(found))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
