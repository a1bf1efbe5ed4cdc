"""Training curves, and induction heads forming during training (Olsson et al. 2022's phase change)."""
from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Optional

import numpy as np
import pandas as pd

import figures
import interp
from sprout.training.recipes import Recipe
from sprout.training.ship import earlier_stage

from .common import SETTINGS, folder_of, half_len, held_out_text, number, positive, standalone
from .stamps import read_shipped_table

NAME = "training_dynamics"
DOC = "Loss curves from train_log.csv and the induction score of every head at each saved snapshot."
SUMMARY = ("Training and held-out loss against tokens seen, and every head's induction score at the "
           "snapshots saved during training, with the loss on repeated text. Whether the snapshots resolve "
           "how sudden the change is (a snapshot inside it) is stated beside it, by interp.phase_change's criterion.")
CHAPTER_LOSS = {"gpt-1": "2.87", "gpt-4": "2.26"}
STEP = re.compile(r"^step_(\d+)$")


def add_args(p):
    p.add_argument("--runs", nargs="*", default=[], help="training run folders (train_log.csv, checkpoints/step_*)")
    p.add_argument("--max-snapshots", type=positive, default=10, help="snapshots scored per run (log-spaced subset)")
    p.add_argument("--chars", type=positive, default=SETTINGS.held_out_chars, help="characters of held-out text for the loss")


def run_dirs(models, extra) -> dict[str, Path]:
    """{label: folder with a train_log.csv}: given run folders, then each model's own folder (or the run it
    came from, for a checkpoint inside `checkpoints/`)."""
    found = {Path(r).name: Path(r) for r in extra}
    for label in models:
        d = folder_of(models, label)
        for cand in [d, d and d.parent.parent, Path("runs") / label]:
            if cand is not None and (cand / "train_log.csv").is_file() and label not in found:
                found[label] = cand
    return found


def _recipe(folder: Path) -> Optional[Recipe]:
    path = folder / "recipe.json"
    return Recipe.from_dict(json.loads(path.read_text())) if path.is_file() else None


def stage_chain(folder: Path, limit: int = 16) -> list[tuple[Path, Optional[Recipe], pd.DataFrame]]:
    """The run in `folder` and the runs it was trained from (its recipe's `init`, followed back while
    their train_log.csv is there), earliest first: (folder, recipe, log) each."""
    chain: list = []
    d: Optional[Path] = folder
    while d is not None and (d / "train_log.csv").is_file() and len(chain) < limit:
        recipe = _recipe(d)
        chain.insert(0, (d, recipe, pd.read_csv(d / "train_log.csv")))
        d = earlier_stage(d, recipe.init) if recipe is not None else None
    return chain


def stage_logs(label: str, folder: Path) -> tuple[pd.DataFrame, pd.DataFrame]:
    """A run's log with the logs of the stages it was trained from before it, on one axis of tokens seen,
    and the stretches to mark on it (columns `model`, `stage`, `start`, `end`, in tokens): each stage of
    a run trained in stages, each stage's pure induction curriculum (no text trained: the held-out loss on
    text rises there, by 7-8 nats in the demos), and an earlier stage whose log is not here."""
    chain = stage_chain(folder)
    logs, stages, offset = [], [], 0.0
    first_recipe = chain[0][1] if chain else None
    if first_recipe is not None and first_recipe.init:  # an earlier stage that is not here
        stages.append(dict(model=label, stage=f"continues {first_recipe.init} (its log is not here)", start=0.0, end=0.0))
    for k, (d, recipe, log) in enumerate(chain):
        tokens = log["tokens"].astype(float)
        end = offset + (float(tokens.iloc[-1]) if len(log) else 0.0)
        if len(chain) > 1:
            stages.append(dict(model=label, stage=f"stage {k + 1}: {d.name}", start=offset, end=end))
        if recipe is not None and recipe.curriculum_steps and len(log):
            per_step = float(tokens.iloc[-1]) / max(int(log["step"].iloc[-1]), 1)
            stages.append(dict(model=label, stage="pure induction curriculum (no text trained)", start=offset,
                               end=offset + min(recipe.curriculum_steps * per_step, end - offset)))
        logs.append(log.assign(tokens=tokens + offset, stage=k + 1))
        offset = end
    table = pd.concat(logs, ignore_index=True) if logs else pd.DataFrame()
    return table, pd.DataFrame(stages, columns=["model", "stage", "start", "end"])


def snapshot_dirs(run: Path) -> list[tuple[int, Path]]:
    snaps = []
    for parent in (run / "checkpoints", run / "snapshots"):
        if parent.is_dir():
            snaps += [(int(m.group(1)), d) for d in parent.iterdir() if (m := STEP.match(d.name)) and d.is_dir()]
    return sorted(snaps)


def induction_snapshots(run: Path, log: pd.DataFrame, limit: int, model) -> Optional[pd.DataFrame]:
    """Induction score per head at each snapshot: a shipped induction_snapshots.csv (refused unless stamped
    with `model`'s weights, `experiments.stamps`), else scored here."""
    if (run / "induction_snapshots.csv").exists():
        return read_shipped_table(run, "induction_snapshots.csv", model)
    snaps = snapshot_dirs(run)
    if len(snaps) < 2:
        return None
    if len(snaps) > limit:  # keep the first and last, evenly spaced in between
        keep = np.unique(np.linspace(0, len(snaps) - 1, limit).round().astype(int))
        snaps = [snaps[i] for i in keep]
    import sprout

    per_step = (log["tokens"] / log["step"].clip(lower=1)).iloc[-1]
    tokens_at = dict(zip(log["step"], log["tokens"]))
    val = log.dropna(subset=["val_loss"])
    frames = []
    for step, d in snaps:
        snapshot = sprout.load(d)
        df = interp.head_scores(snapshot, "induction", half_len=half_len(snapshot), n_seqs=4, seed=SETTINGS.seed)
        # held-out loss is logged every eval_every steps: interpolate to the snapshot's step
        loss = float(np.interp(step, val["step"], val["val_loss"])) if len(val) else np.nan
        frames.append(df.assign(step=step, tokens=tokens_at.get(step, step * per_step), val_loss=loss))
    return pd.concat(frames, ignore_index=True)


def run(models, out, args) -> list[dict]:
    rows, logs, snaps, stages = [], [], [], []
    for label, model in models.items():
        text = held_out_text(model, args.chars, folder_of(models, label))
        rows.append(number("held-out loss on fresh stories (nats/token), measured here",
                           interp.mean_loss(model, text), CHAPTER_LOSS.get(label), label, fmt="{:.2f}"))
    runs = run_dirs(models, args.runs)
    for label in list(models) + [l for l in runs if l not in models]:
        if label not in runs:
            rows.append(number("final held-out loss in train_log.csv (nats/token)", "no train_log.csv found", None, label))
            continue
        log = pd.read_csv(runs[label] / "train_log.csv")
        chained, marks = stage_logs(label, runs[label])  # earlier stages before it, on one axis of tokens
        logs.append(chained.assign(model=label))
        stages.append(marks)
        val = log.dropna(subset=["val_loss"])
        if len(val):
            # the training run's own held-out split, not the stories every other number uses: kept out of
            # the headline table (no chapter value), which shows the held-out loss measured above
            rows.append(number("final held-out loss in train_log.csv (nats/token)", float(val["val_loss"].iloc[-1]),
                               None, label, fmt="{:.2f}", note="the training run's own validation split"))
        # a shipped demo has its train_log.csv but not its snapshots: look in its training run too
        s = next((s for d in (runs[label], Path("runs") / label) if d.is_dir()
                  and (s := induction_snapshots(d, log, args.max_snapshots, models[label])) is not None), None)
        if s is not None:
            snaps.append(s.assign(model=label))
            best = s.groupby("tokens")["score"].max()
            formed = best[best >= 0.3]
            rows.append(number("training tokens when a head first reaches induction score 0.3",
                               float(formed.index[0]) if len(formed) else "not reached", None, label, fmt="{:,.0f}"))
            if len(best) >= 2:
                table = pd.DataFrame({"tokens": best.index, "measure": "best induction score", "value": best.to_numpy()})
                rows.append(number("where the best induction score changes (snapshots)",
                                   interp.phase_change(table, "best induction score")["text"], None, label))
    if logs:
        table = pd.concat(logs, ignore_index=True)
        out.table(table, "train_logs")
        out.figure(figures.loss_curves(table, stages=pd.concat(stages, ignore_index=True)), "loss_curves",
                   "Training loss (thin), held-out loss (thick) and loss on repeated random tokens (dotted) "
                   "against tokens seen, every stage of a run trained in stages on one axis; shaded: each run's "
                   "pure induction curriculum, where the held-out loss on text rises (no text is trained).")
    if snaps:
        table = pd.concat(snaps, ignore_index=True)
        for label, g in table.groupby("model", sort=False):
            # one file per model: copied into sprout/demo/<name>/ as induction_snapshots.csv, it lets
            # this figure be drawn from a demo model without its snapshots
            out.table(g.drop(columns="model"), f"induction_snapshots_{label}")
            out.figure(figures.induction_over_training(g.drop(columns="model"), title=f"Induction heads forming, {label}"),
                       f"induction_over_training_{label}",
                       f"{label}: each head's induction score at each training snapshot (the phase change).")
    return rows


def main(argv=None) -> int:
    return standalone(sys.modules[__name__], argv)


if __name__ == "__main__":
    raise SystemExit(main())
