"""The frontier of a demo's dictionaries: held-out EV and CE recovered against L0, beside their baselines.

    python -m experiments.frontier gpt-4 --k 8 12 16 24 [--parts resid transcoders] [--layers 3] [--out DIR]
        [--steps N] [--expansion X] [--transcoder-expansion X]

Trains the demo's dictionaries (its `experiments.ship` recipe) once per k, measures each on the held-out
text the shipping run uses with `interp.sae_metrics(..., baselines=True)` (the baselines fitted on the
training text, at each dictionary's own L0 on each token), and writes `frontier_<name>.csv` (one row per
dictionary and method) and `frontier_<name>.html` (and .png when kaleido can): what to show, issue 38
says, where a target cannot be met. `--steps` and the expansions change the recipe for a trial (does more
training or a wider dictionary close a gap at the same L0?). Nothing is shipped.
"""
from __future__ import annotations

import argparse
import time
from dataclasses import replace
from pathlib import Path

import pandas as pd
import torch

import interp
import sprout
from figures.features import frontier_figure
from interp.cli import positive

from . import ship
from .ship_targets import BASELINE_FIT_CHARS, BaselineFits, held_out_metrics

METHODS = {"sae": ("pca",), "transcoder": ("regression", "top_neurons")}


def rows_of(k: int, sae, held: dict) -> list[dict]:
    """One row per method (the dictionary and its baselines) of one measured dictionary."""
    kind = "transcoder" if isinstance(sae, interp.Transcoder) else "sae"
    name = sae.hook_name if kind == "sae" else f"MLP {sae.layer} transcoder{'' if sae.skip else ' (no skip)'}"
    out = [dict(k=k, dictionary=name, kind=kind, method="dictionary", l0=held["l0"], explained_variance=held["explained_variance"],
                ce_loss_recovered_mean=held["ce_loss_recovered_mean"])]
    for b in METHODS[kind]:
        out.append(dict(k=k, dictionary=name, kind=kind, method=b, l0=held[f"{b}_l0"],
                        explained_variance=held[f"{b}_explained_variance"],
                        ce_loss_recovered_mean=held[f"{b}_ce_loss_recovered_mean"]))
    return out


def frontier(name: str, model, ks: list, parts=ship.PARTS, layers=None, recipe=None) -> pd.DataFrame:
    """Rows `k`, `dictionary`, `kind`, `method` ("dictionary", "pca", "regression", "top_neurons"), `l0`,
    `explained_variance`, `ce_loss_recovered_mean` on held-out text, for every dictionary trained at each k."""
    r = recipe or ship.SHIP_PLANS.get(name, ship.ShipPlan())
    texts = ship.demo_texts(name, r)
    fits = BaselineFits(model, ship.train_text(texts, BASELINE_FIT_CHARS)[0])
    rows: list = []
    for k in ks:
        t0 = time.perf_counter()
        for sae in ship.train_dictionaries(model, replace(r, k=k), texts, parts, layers).values():
            rows += rows_of(k, sae, held_out_metrics(model, sae, texts["held"], fits))
        print(f"{name}: k {k} in {time.perf_counter() - t0:.0f} s")
    return pd.DataFrame(rows)


def trial_plan(args) -> "ship.ShipPlan":
    """The demo's shipping recipe with the command line's trial settings."""
    r = ship.SHIP_PLANS.get(args.name, ship.ShipPlan())
    if args.steps:
        r = r.with_steps(args.steps)
    widths = {f: v for f, v in (("expansion", args.expansion), ("transcoder_expansion", args.transcoder_expansion)) if v}
    return replace(r, **widths)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m experiments.frontier", description=__doc__.splitlines()[0])
    p.add_argument("name", help="a shipped demo with a dictionary recipe")
    p.add_argument("--k", nargs="+", type=int, required=True, help="the k values to train at")
    p.add_argument("--parts", nargs="+", choices=ship.PARTS, default=list(ship.PARTS))
    p.add_argument("--layers", nargs="+", type=int, default=None, help="only these blocks' dictionaries")
    p.add_argument("--out", type=Path, default=Path("results/frontier"))
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--steps", type=positive, default=None, help="every dictionary's steps (the recipe's otherwise)")
    p.add_argument("--expansion", type=float, default=None, help="residual SAEs' d_sae / d_model")
    p.add_argument("--transcoder-expansion", type=float, default=None, help="transcoders' d_sae / d_model")
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    model = sprout.load(args.name).eval()
    table = frontier(args.name, model, args.k, args.parts, args.layers, trial_plan(args))
    args.out.mkdir(parents=True, exist_ok=True)
    table.to_csv(args.out / f"frontier_{args.name}.csv", index=False)
    fig = frontier_figure(table, f"{args.name}: held-out EV and CE recovered against L0")
    fig.write_html(args.out / f"frontier_{args.name}.html")
    try:
        fig.write_image(args.out / f"frontier_{args.name}.png", scale=2)
    except Exception:  # no kaleido: the HTML is the output
        pass
    print(table.to_string(index=False))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
