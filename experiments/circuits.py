"""Which heads feed the induction head, through which input, and how much: the circuit, measured causally."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pandas as pd
import torch

import figures
import interp

from . import readme
from .common import ZORBIN, held_out_text, number, positive, standalone
from .stamps import read_shipped_table
from .training_dynamics import run_dirs, snapshot_dirs

NAME = "circuits"
DOC = "Composition scores, path patching into each induction head, direct logit attribution and the circuit graph."
SUMMARY = ("For every induction head, each earlier head is noised on the path into its queries, keys or values "
           "alone (path patching), scored by weight composition against random matrices, and ablated; the heads "
           "that carry a real share form the circuit graph. Direct logit attribution splits the logit of a copied "
           "name into the writes of every head and MLP.")


def add_args(p):
    p.add_argument("--n-seqs", type=positive, default=2, help="sequences of repeated random tokens and of stories")
    p.add_argument("--story-len", type=positive, default=64, help="tokens per story (from the start)")
    p.add_argument("--max-snapshots", type=positive, default=6, help="snapshots measured per training run")
    p.add_argument("--readme", default=None, metavar="docs/guide/circuits.md",
                   help="rewrite the block between <!-- circuit:MODEL --> and <!-- /circuit:MODEL --> with each model's circuit")


def _pairs(model, n: int, story_len: int):
    repeated = interp.induction.circuit.repeated_pair(model, half_len=min(24, int(model.cfg.n_ctx) // 2), n_seqs=n)
    stories = interp.induction.circuit.story_pair(model, n_stories=n, max_len=story_len)
    return repeated, stories


def _name_position(model, ids: torch.Tensor) -> int:
    """The position that predicts the second token of the name at its second occurrence in ZORBIN."""
    name = model.to_tokens(" Zorbin")[0]
    hits = (ids[:-1] == name[0]).nonzero().flatten()
    return int(hits[-1]) + len(name) - 1 if len(hits) else len(ids) - 2


def _dla(model, label, out) -> None:
    ids = model.to_tokens(ZORBIN)[0][: int(model.cfg.n_ctx)]
    frame = interp.logit_attribution(model, ids)
    out.table(frame, f"dla_{label}")
    out.figure(figures.dla_bars(frame, pos=min(_name_position(model, ids), int(frame["pos"].max())),
                                title=f"Direct logit attribution, {label}"), f"dla_{label}",
               f"{label}: which heads and MLPs write the logit of the name's next token at its second occurrence.")


def _circuit(model, label, out, args) -> list[dict]:
    repeated, stories = _pairs(model, args.n_seqs, args.story_len)
    frame, summary = interp.induction_circuit(model, data=repeated, stories=stories)
    out.table(frame, f"circuit_{label}")
    spread = circuit_spread(model, n_seqs=args.n_seqs, story_len=args.story_len)
    out.table(spread, f"circuit_spread_{label}")
    sentences = interp.spread_sentences(spread)
    (out.dir / f"circuit_{label}.txt").write_text(summary + "\n\n" + sentences + "\n", encoding="utf-8")
    print(f"{label}:\n{sentences}")
    if args.readme:
        write_readme(Path(args.readme), label, summary)
        write_readme(Path(args.readme), f"spread:{label}", sentences)
    if frame.empty:
        return [number("induction circuit", summary, None, label)]
    out.figure(figures.path_patching_matrix(frame, title=f"Path patching into the induction heads, {label}"),
               f"path_patching_{label}", f"{label}: each earlier head's share through each input of each induction head.")
    out.figure(figures.circuit_graph(frame, title=f"Induction circuit, {label}"), f"circuit_graph_{label}",
               f"{label}: the heads that feed each induction head, edge width = path-patching share.")
    rows = []
    for (receiver, via), g in frame[frame["feeds"]].groupby(["receiver", "via"]):
        names = ", ".join(f"{r.sender} ({r.share_repeated:.2f})" for r in g.sort_values("share_repeated", ascending=False).itertuples())
        rows.append(number(f"{receiver}'s {figures.circuits.VIA_NAMES[via]} fed by (share)", names, None, label))
    return rows + _spread_numbers(spread, label)


def circuit_spread(model, n_seqs: int, story_len: int):
    """The spread the page and the README state: two seeds at four lengths (2x16 ... 2x64) and two sets of
    stories, for the best induction head; the greedy sets draw from the 9 earlier heads with the largest own
    shares (every earlier head of a 4-layer, 3-head model)."""
    return interp.circuit_spread(model, seeds=(0, 1), half_lens=(16, 32, 48, 64), story_seeds=(1000, 2000),
                                 n_seqs=n_seqs, n_stories=n_seqs, story_len=story_len, max_receivers=1,
                                 max_candidates=SPREAD_CANDIDATES)


SPREAD_CANDIDATES = 9


def _spread_numbers(spread: pd.DataFrame, label: str) -> list[dict]:
    if spread.empty:
        return []
    rows = []
    ranges = interp.spread_ranges(spread)
    n = int(ranges["settings"].iloc[0])
    for (receiver, via), g in ranges.groupby(["receiver", "via"], sort=False):
        always = ", ".join(g[g["in_joint_set"] == n]["sender"]) or "none"
        rows.append(number(f"{receiver}'s {figures.circuits.VIA_NAMES[via]}: joint set at all {n} settings (its share)",
                           f"{always} ({g['joint_min'].iloc[0]:.2f}-{g['joint_max'].iloc[0]:.2f})", None, label))
    return rows


def write_readme(path: Path, label: str, summary: str) -> None:
    """The README block `circuit:{label}` (experiments.readme) becomes the summary, as a code block."""
    readme.rewrite(path, f"circuit:{label}", f"```text\n{summary}\n```")


def _composition(model, label, out) -> list[dict]:
    comp = interp.composition_scores(model, "k")
    out.table(comp, f"composition_k_{label}")
    out.figure(figures.composition_heatmap(comp, title=f"K-composition, {label}"), f"composition_{label}",
               f"{label}: how much each head's output is read by a later head's keys, against random matrices.")
    best = comp.sort_values("score").iloc[-1]
    return [number("strongest K-composition (x random baseline)", f"{best.sender} -> {best.receiver} ({best.ratio:.1f}x)",
                   None, label)]


def _attribution(model, label, out) -> list[dict]:
    clean, corrupted = interp.induction.circuit.repeated_pair(model, half_len=min(16, int(model.cfg.n_ctx) // 2), n_seqs=2)
    metric = interp.induction.circuit.induction_metric(clean)
    frame = interp.attribution_patch(model, clean, corrupted, metric, site="z", by="head", exact=True)
    out.table(frame, f"attribution_{label}")
    out.figure(figures.attribution_scatter(frame, title=f"Attribution patching vs exact, {label}"),
               f"attribution_{label}", f"{label}: every head's z patched, gradient estimate against the exact patch.")
    return [number("attribution patching vs exact, Pearson r (heads' z)", interp.attribution_summary(frame)["correlation"],
                   None, label, fmt="{:.3f}")]


def _phase(models, out, args) -> list[dict]:
    rows = []
    for label, run in run_dirs(models, []).items():
        snaps = snapshot_dirs(run)
        if len(snaps) >= 2:
            table, note = measure_phase(run, snaps, args.max_snapshots), "measured on each saved snapshot"
        elif (run / SHIPPED_PHASE).is_file():
            table = read_shipped_table(run, SHIPPED_PHASE, models[label])
            note = f"from {SHIPPED_PHASE}: {PHASE_SOURCE}"
        else:
            continue
        out.table(table, f"phase_{label}")
        pair = str(table["heads"].iloc[0]) if "heads" in table else "best heads per snapshot"
        out.figure(figures.phase_change(table, title=f"The phase change, {label} ({pair})"), f"phase_{label}",
                   f"{label}: the previous-token score, induction score and K-composition of the circuit {pair}, and the "
                   f"in-context score, against training tokens ({note}).")
        rows.append(number("snapshots measured for the phase change", int(table["tokens"].nunique()), None, label, fmt="{:d}"))
        rows += _phase_numbers(table, label)
    return rows


def _phase_numbers(table: pd.DataFrame, label: str) -> list[dict]:
    """Where each of the circuit's measures changes most, and whether the snapshots resolve it
    (`interp.phase_change`'s criterion), and the in-context score's sign after the induction change."""
    rows = []
    for measure in table["measure"].unique():
        if measure.startswith("control") or measure.endswith("percentile"):
            continue
        if (table["measure"] == measure).sum() < 2:  # e.g. K-composition where a snapshot's best heads are in one layer
            rows.append(number(f"{measure}: change", "measured at fewer than two snapshots: no change to locate", None, label))
            continue
        change = interp.phase_change(table, measure)
        rows.append(number(f"{measure}: change", change["text"], None, label))
    change = interp.phase_change(table, "induction score")
    icl = table[(table["measure"] == "in-context score (late - early loss)") & (table["tokens"] > (change["end_tokens"] or 0))]
    if len(icl):
        rows.append(number("in-context score after the induction change (positions 112-127 minus 8-23)",
                           f"{icl['value'].min():+.2f} to {icl['value'].max():+.2f} nats; negative at "
                           f"{int((icl['value'] < 0).sum())} of {len(icl)} snapshots", None, label))
    controls = table[table["measure"].str.startswith("control") & table["measure"].str.endswith("(x random)")]
    if len(controls):
        last = controls[controls["tokens"] == controls["tokens"].max()]
        rows.append(number("control pairs' K-composition at the last snapshot (x random)",
                           f"{last['value'].min():.2f}-{last['value'].max():.2f}", None, label))
    return rows


SHIPPED_PHASE = "phase_snapshots.csv"
PHASE_SOURCE = ("the log-spaced snapshots of the training run the shipped weights came from "
                "(`python -m experiments.ship NAME --only phase --run RUN`)")


def measure_phase(run: Path, snaps: list, limit: int) -> pd.DataFrame:
    """`interp.phase_measures` on up to `limit` evenly spaced snapshots of a run, all following the
    circuit (`interp.phase_heads`) of its last snapshot, with its control pairs (`interp.control_pairs`):
    columns `tokens`, `step`, `measure`, `value`, `heads`."""
    import sprout

    keep = np.unique(np.linspace(0, len(snaps) - 1, min(limit, len(snaps))).round().astype(int))
    log = pd.read_csv(run / "train_log.csv")
    per_step = (log["tokens"] / log["step"].clip(lower=1)).iloc[-1] if len(log) else 1
    try:
        heads = interp.phase_heads(sprout.load(snaps[-1][1]))
    except ValueError:  # its best induction head is in the first layer: follow each snapshot's best heads
        heads = None
    controls = interp.control_pairs(sprout.load(snaps[-1][1]), heads) if heads else None
    measures, steps = {}, {}
    for step, d in (snaps[i] for i in keep):
        model = sprout.load(d)
        tokens = int(round(step * per_step))
        measures[tokens], steps[tokens] = interp.phase_measures(model, _held_out(model), heads=heads, controls=controls), step
    table = interp.phase_table(measures)
    table.insert(1, "step", table["tokens"].map(steps))
    table["heads"] = " -> ".join(heads) if heads else "best heads per snapshot"
    return table


def _held_out(model, n_windows: int = 32):
    """Held-out ids [n, 129] for the in-context score, or None when the context or the text is too short."""
    from sprout.tokenizer import encode

    n = interp.induction.phase.LATE.stop + 1
    if int(model.cfg.n_ctx) < n - 1 or getattr(model, "tokenizer", None) is None:
        return None
    ids = torch.tensor(encode(model.tokenizer, held_out_text(model, 40_000)))
    if len(ids) < n:
        return None
    return torch.stack(interp.data.slices(ids, n, drop_last=True)[:n_windows])


def run(models, out, args) -> list[dict]:
    rows = []
    for label, model in models.items():
        if int(model.cfg.n_layers) < 2:
            rows.append(number("induction circuit", "one layer: no head can feed another", None, label))
            continue
        if hasattr(model, "W_U") and model.cfg.normalization_type == "RMS":
            _dla(model, label, out)
        rows += _circuit(model, label, out, args)
        if hasattr(model, "W_Q"):
            rows += _composition(model, label, out)
        rows += _attribution(model, label, out)
    return rows + _phase(models, out, args)


def main(argv=None) -> int:
    return standalone(sys.modules[__name__], argv)


if __name__ == "__main__":
    raise SystemExit(main())
