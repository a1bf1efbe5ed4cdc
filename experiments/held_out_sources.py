"""Where the shipped transcoders recover the loss: CE recovered against mean ablation on each held-out source.

    python -m experiments.held_out_sources [--readme docs/features.md] [--demo NAME] [--chars 16000]
    python -m experiments.held_out_sources --demo NAME --spread LAYER [--noskip]

The shipping run measures every dictionary on one mix of held-out text, an equal share of each source's
(`experiments.ship.demo_texts`), while the sources are neither equally common in the training text nor
equally hard to reconstruct. For every English demo with shipped transcoders, this measures each of them
(with and without a skip) on each source's held-out text alone, its first `--chars` characters:
CE loss recovered against mean ablation with its standard error over windows (`interp.sae_metrics(...,
baselines=True)`, the baselines fitted on the training text as the shipping run fits them), beside each
source's share of the held-out text (each source's last 5% is held out, so its share of the training text
too), on a mix of them all in those shares, and the shipped record (the equal-share mix). `--spread` measures
one transcoder on disjoint slices of that mix: how much the estimate moves between texts against the
standard error each slice reports.
"""
from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd
import torch

import interp
import sprout
from sprout.training.english import is_english

from . import ship
from .common import positive
from .readme import md_table, rewrite_or_print
from .ship_targets import BaselineFits
from .shipped_dictionaries import KINDS, with_se

BLOCK = "held-out-sources"
CHARS = 16_000  # Britannica's held-out text is 16,585 characters: every source measured on as many
SPREAD_CHARS = 20_000  # --spread's slices: as long as the shipping run's held-out text


def english_texts(name: str) -> dict:
    """The English demo `name`'s texts as its dictionaries' shipping run reads them (`experiments.ship.demo_texts`,
    each source's held-out text in "held_sources"), built from its corpus once.

    Raises:
        SystemExit: `name` has no recipe.json or was not trained on the English corpus.
    """
    recipe = ship.demo_recipe(name)
    if recipe is None or not is_english(recipe.data):
        raise SystemExit(f"{name}: not trained on the English corpus (its recipe.json), so it has no held-out "
                         "sources to split by")
    return ship.demo_texts(name, ship.SHIP_PLANS.get(name, ship.ShipPlan()))


def training_shares(vals: dict[str, str], chars: int, part: int = 0, parts: int = 1) -> str:
    """About `chars` held-out characters, each source's share its share of the held-out (and training) text,
    from the start of the `part`-th of `parts` equal stretches of each source (disjoint slices for parts > 1).

    Raises:
        ValueError: `chars` is more than a `parts`-th of the text, so slices would overlap.
    """
    total = sum(map(len, vals.values()))
    share = {name: round(chars * len(t) / total) for name, t in vals.items()}
    if any(share[name] > len(t) // parts for name, t in vals.items()):  # each slice within its own stretch
        raise ValueError(f"{parts} disjoint slices of {chars:,} characters need about {chars * parts:,}; the held-out "
                         f"text has {total:,}")
    return "\n\n".join(t[part * len(t) // parts:][:share[name]] for name, t in vals.items())


def ce_mean_with_se(model, tc, text: str, fits: BaselineFits) -> str:
    """CE recovered against mean ablation on `text`, "value ± s.e."."""
    m = interp.sae_metrics(model, tc, text, baselines=True, baseline_fit=fits.of(tc)).iloc[0]
    return with_se(m.ce_loss_recovered_mean, m.ce_loss_recovered_mean_se)


def spread(name: str, layer: int, skip: bool = True, parts: int = 6, chars: int = SPREAD_CHARS) -> pd.DataFrame:
    """One row per disjoint slice of `chars` held-out characters in training shares: the shipped transcoder's CE
    recovered against mean ablation and its standard error over windows (how far that error is below the spread
    between texts)."""
    model, texts = sprout.load(name).eval(), english_texts(name)
    vals = texts["held_sources"]
    tc = interp.load_transcoder(model, layer, skip=skip)
    fit = ship.baseline_fits(model, texts).of(tc)  # as the shipping run fits them
    rows = []
    for part in range(parts):
        m = interp.sae_metrics(model, tc, training_shares(vals, chars, part, parts), baselines=True, baseline_fit=fit).iloc[0]
        rows.append({"slice": part, "ce_loss_recovered_mean": m.ce_loss_recovered_mean, "se": m.ce_loss_recovered_mean_se})
    return pd.DataFrame(rows)


def demo_rows(name: str, chars: int = CHARS, layers=None) -> list[dict]:
    """One row per shipped transcoder of `name` (those of `layers`, default all): CE recovered (mean ablation)
    ± s.e. on each source's first `chars` held-out characters, on `chars` characters of them all in their
    training shares, and the shipped record's (equal shares)."""
    model, texts = sprout.load(name).eval(), english_texts(name)
    vals = texts["held_sources"]
    total = sum(map(len, vals.values()))
    fits = ship.baseline_fits(model, texts)
    rows = []
    for (layer, skip), tc in ship.shipped_dictionaries(model, ("transcoders",), layers).items():
        row = {"demo": name, "dictionary": KINDS["skip" if skip else "noskip"][1], "block": layer}
        for source, text in vals.items():
            row[f"{source} ({len(text) / total:.0%})"] = ce_mean_with_se(model, tc, text[:chars], fits)
        row["training shares"] = ce_mean_with_se(model, tc, training_shares(vals, chars), fits)
        held = tc.info["held_out"]
        row["shipped (equal shares)"] = with_se(held["ce_loss_recovered_mean"], held.get("ce_loss_recovered_mean_se"))
        rows.append(row)
    return rows


def markdown(frames: dict[str, pd.DataFrame], chars: int) -> str:
    head = (f"Generated by `python -m experiments.held_out_sources --readme docs/features.md`: each shipped transcoder's "
            f"CE recovered against mean ablation ± its standard error over windows, on the first {chars:,} characters of "
            "each source's held-out text alone (in brackets: the source's share of the held-out text, as of the "
            f"training text), on {chars:,} characters of them all in those shares, and as the shipping run "
            "recorded it on its mix of equal shares.")
    return head + "".join(f"\n\n{name}:\n\n" + md_table(frame.drop(columns="demo")) for name, frame in frames.items())


def english_demos() -> list[str]:
    """The demos with a dictionary plan whose weights were trained on the English corpus."""
    return [n for n in ship.SHIP_PLANS if (r := ship.demo_recipe(n)) is not None and is_english(r.data)]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m experiments.held_out_sources", description=__doc__.splitlines()[0])
    p.add_argument("--readme", type=Path, default=None, help=f"write the {BLOCK!r} block of this file (docs/features.md)")
    p.add_argument("--demo", default=None, help="one demo only (printed; not with --readme, whose block has them all)")
    p.add_argument("--chars", type=positive, default=None,
                   help=f"held-out characters of each source (default {CHARS:,}); with --spread, of each slice "
                        f"(default {SPREAD_CHARS:,})")
    p.add_argument("--threads", type=positive, default=None, help="torch CPU threads (default torch's)")
    p.add_argument("--spread", type=int, default=None, metavar="LAYER",
                   help="with --demo: that MLP's transcoder (with a skip; --noskip without) on 6 disjoint slices of "
                        "held-out text in training shares, each estimate beside its standard error (printed)")
    p.add_argument("--noskip", action="store_true", help="with --spread: the transcoder without a skip")
    args = p.parse_args(argv)
    if args.readme and args.demo:
        raise SystemExit("--readme writes every demo's table: leave out --demo")
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    if args.noskip and args.spread is None:
        raise SystemExit("--noskip picks the transcoder --spread measures: give --spread LAYER")
    if args.spread is not None:
        if not args.demo or args.readme:
            raise SystemExit("--spread measures one demo's transcoder: give --demo NAME, not --readme")
        table = spread(args.demo, args.spread, skip=not args.noskip, chars=args.chars or SPREAD_CHARS)
        print(table.to_string(index=False, float_format="%.3f"))
        print(f"standard deviation of the estimates {table.ce_loss_recovered_mean.std():.3f}; "
              f"median standard error {table.se.median():.3f}")
        return 0
    names = [args.demo] if args.demo else english_demos()
    chars = args.chars or CHARS
    frames = {n: pd.DataFrame(demo_rows(n, chars)) for n in names}
    return rewrite_or_print(args.readme, BLOCK, markdown(frames, chars))


if __name__ == "__main__":
    raise SystemExit(main())
