"""The README's table of what the shipped demo models show: `python -m experiments.demo_table [--readme README.md]`.

Every number comes from an `interp` function with the settings in `experiments.common.SETTINGS` (repeat
length, random sequences, seed, held-out text, stories); run_all's index page and the tests of the
shipped demos use the same functions with the same settings, so the three agree. With `--readme` the
table between the README's `<!-- demo-table -->` markers is replaced by the one printed.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Optional

import interp
from sprout import SproutConfig

from . import readme
from .common import SETTINGS, ZORBIN, half_len, head_scores, held_out_text, load_models, positive, set_threads

MODELS = ["gpt-1", "gpt-4", "sprout-mini"]
BLOCK = "demo-table"  # the README block this table is written into (experiments.readme)

# Hand-written stories: frames no generator template produces, names the generator cannot draw
# (`sprout.material.generator_can_draw`, asserted in tests/experiments/test_demo_table.py), so a later piece of a name can
# only be predicted by copying it from the name's first occurrence.
STORIES = [
    ("Haldric and Ulfrida", ["Haldric", "Ulfrida"],
     "The lighthouse keeper was called Haldric, and his sister was Ulfrida. Every winter Haldric "
     "painted the rails while Ulfrida counted the ships. When the storm broke the glass, Ulfrida "
     "shouted for Haldric, but Haldric was asleep. In the morning Haldric apologised to Ulfrida."),
    ("Brimmelwick's shop", ["Brimmelwick", "Tazzoranth"],
     "Nobody in the valley sold better cheese than Brimmelwick. A traveller named Tazzoranth arrived "
     "one evening and asked Brimmelwick for a wheel of the blue one. Brimmelwick laughed, because "
     "Tazzoranth had no money at all. Still, Tazzoranth left with the cheese, and Brimmelwick never "
     "regretted it."),
    ("The engineers", ["Gundelric", "Plinthgar"],
     "According to the report, Gundelric designed the pump and Plinthgar built it. The inspectors "
     "praised Plinthgar for the welding; Gundelric received a medal for the drawings. Years later, "
     "Plinthgar and Gundelric opened a workshop, and the sign above the door said Gundelric and "
     "Plinthgar."),
    ("A letter", ["Yusterbell", "Korrigast"],
     "Dear Yusterbell, I am writing from the mountains where Korrigast and I have been climbing. "
     "Korrigast sends his regards and asks whether Yusterbell still keeps bees. If you see our cousin, "
     "tell her that Korrigast broke his boot. With love to Yusterbell from Korrigast and me."),
    ("The match", ["Hobnelwyn", "Dravoquist"],
     "It was the final of the chess tournament: Hobnelwyn against Dravoquist. Hobnelwyn opened with a "
     "pawn, and Dravoquist answered at once. After three hours, Dravoquist offered a draw, which "
     "Hobnelwyn refused. The crowd cheered when Hobnelwyn finally won, and Dravoquist shook hands."),
    ("The recipe", ["Ermgard", "Saffelgrund"],
     "Grandmother Ermgard kept her soup recipe in a tin. Her neighbour Saffelgrund wanted it badly. "
     "One Tuesday Saffelgrund knocked, and Ermgard let him taste the soup. Saffelgrund guessed "
     "every herb but one, so Ermgard smiled and kept the tin closed while Saffelgrund sighed."),
]

# The chapter's column, beside each row.
CHAPTER = {
    "params": "Sprout: 17,309,056 (exact here too)", "loss": "gpt-1 2.87, gpt-4 2.26", "repeat": "-",
    "induction": "an induction head in layer 3", "prev": "a previous-token head in layer 2", "ablation": "-",
    "zorbin": 'gpt-1 <1%; gpt-4 98% "or", 93% "bin"', "stories": "-", "hand": "98% vs <1%",
    "rms": "0.18 -> ~10 -> ~35", "lens": "77% / 59% (Sprout)",
}


def name_piece_probability(model, stories=STORIES) -> tuple[float, int]:
    """Mean probability of the 2nd, 3rd, ... pieces of every later occurrence of each story's names
    (`interp.induction_table`), and how many pieces were averaged."""
    probs = []
    for _, names, text in stories:
        for name in names:
            t = interp.induction_table(model, text, name)
            probs += t[(t["occurrence"] >= 2) & (t["token_index"] >= 1)]["prob"].tolist()
    if not probs:
        raise ValueError("no later occurrence of a name fits the model's context")
    return sum(probs) / len(probs), len(probs)


def _heads(model, half: int) -> dict:
    s = SETTINGS
    ind, prev = head_scores(model, "induction"), head_scores(model, "previous_token")  # as the index page's
    top = list(zip(ind["layer"][: s.top], ind["head"][: s.top]))
    abl = interp.ablate_heads(model, top, half_len=half, n_seqs=s.n_seqs, seed=s.seed)
    best, p = ind.iloc[0], prev.iloc[0]
    return dict(induction=(interp.Head(int(best.layer), int(best["head"])).label, float(best.score)),
                prev=(interp.Head(int(p.layer), int(p["head"])).label, float(p.score)),
                ablation=(float(abl["delta"].iloc[0]), float(abl["delta"].iloc[-1]), len(top)))


def measure(model, label: str, folder: Optional[Path] = None) -> dict:
    """Every number of the README's table for one model (see SETTINGS for what each is measured on); its
    held-out text is the `val.txt` in its `folder`, if any."""
    s, half = SETTINGS, half_len(model)
    text = held_out_text(model, s.held_out_chars, folder)
    rep = interp.repeat_loss(model, half_len=half, n_seqs=s.n_seqs, seed=s.seed).set_index("copy")
    zorbin = interp.induction_table(model, ZORBIN, "Zorbin Plax")
    zorbin = zorbin[zorbin["occurrence"] == 2].set_index("token_index")
    stories = interp.induction_stories(model, n_stories=s.stories, seed=s.seed)
    later = stories[(stories["occurrence"] == "later") & (stories["token_index"] >= 1)]
    rms = interp.residual_rms(model, text)
    stream = rms[rms["kind"] == "stream"].set_index("layer")["mean"]
    lens = interp.lens_dataset_summary(model, text).set_index("layer")["mean_top1_prob"]
    params = interp.param_table(SproutConfig.preset(label)).set_index("part")["count"] if label in ("gpt-1", "gpt-4") else None
    return dict(
        params=None if params is None else int(params["total"]), loss=interp.mean_loss(model, text), half=half,
        repeat=(float(rep.loc["first", "loss"]), float(rep.loc["second", "loss"]), float(rep.loc["first", "uniform"])),
        **_heads(model, half),
        zorbin=[(zorbin.loc[i, "token"], float(zorbin.loc[i, "prob"])) for i in (1, 2) if i in zorbin.index],
        stories=float((later["mean_prob"] * later["n"]).sum() / later["n"].sum()),
        hand=name_piece_probability(model)[0],
        rms=[float(stream[0]), float(stream[1]), float(stream[stream.index.max()])] if stream.index.max() > 1
        else [float(stream[0]), float(stream[1])],
        # a one-block model's second-to-last layer is the embedding, which the tied unembedding reads back
        # as the input token itself: not a prediction, so not shown
        lens=[float(lens[lens.index.max() - 1]) if lens.index.max() >= 2 else None, float(lens[lens.index.max()])],
    )


def pct(p: float) -> str:
    """A probability as a percentage: whole percents, one decimal near 0 and 1 (99.8%, not 100%)."""
    return f"{p:.1%}" if p < 0.1 or p >= 0.995 else f"{p:.0%}"


def _cells(m: dict) -> dict:
    rep_first, rep_second, uniform = m["repeat"]
    top1, joint, k = m["ablation"]
    return {
        "params": "-" if m["params"] is None else f"{m['params']:,}",
        "loss": f"{m['loss']:.2f}",
        "repeat": f"{rep_first:.2f} / {rep_second:.2f} ({pct(rep_second / rep_first)}; uniform guess {uniform:.2f})",
        "induction": f"{m['induction'][0]} ({m['induction'][1]:.2f})",
        "prev": f"{m['prev'][0]} ({m['prev'][1]:.2f})",
        "ablation": f"{top1:+.2f} (top {k} together: {joint:+.2f})",
        "zorbin": " / ".join(f'"{t.strip()}" {pct(p)}' for t, p in m["zorbin"]),
        "stories": pct(m["stories"]), "hand": pct(m["hand"]),
        "rms": " -> ".join(f"{r:.3g}" for r in m["rms"]),
        "lens": " / ".join("-" if p is None else pct(p) for p in m["lens"]),
    }


def markdown(results: dict) -> str:
    """The README's table: one column per model, then the chapter's."""
    s = SETTINGS
    half = sorted({m["half"] for m in results.values()})
    rows = {
        "params": "parameters of the course presets",
        "loss": f"held-out loss on fresh stories (nats/token; {s.held_out_chars:,} characters)",
        "repeat": f"{'/'.join(map(str, half))} random tokens, then the same again: loss on 1st / 2nd copy "
                  f"({s.n_seqs} sequences, seed {s.seed})",
        "induction": "best induction head (score on the same repeated random tokens)",
        "prev": "best previous-token head (same tokens)",
        "ablation": "loss change on the 2nd copy when the top induction head is zeroed",
        "zorbin": 'second "Zorbin Plax": p(2nd piece) / p(3rd piece)',
        "stories": f"later pieces of invented names in {s.stories} generated stories (mean p)",
        "hand": "same, in hand-written frames with names the generator cannot draw",
        "rms": "residual RMS on the held-out text: embedding -> block 1 -> last block",
        "lens": "logit lens on the held-out text, mean top-1 probability: second-to-last / last layer",
    }
    cells = {label: _cells(m) for label, m in results.items()}
    head = "| measured | " + " | ".join(results) + " | chapter |"
    lines = [head, "|" + "---|" * (len(results) + 2)]
    for key, what in rows.items():
        lines.append(f"| {what} | " + " | ".join(c[key] for c in cells.values()) + f" | {CHAPTER[key]} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m experiments.demo_table", description=__doc__.splitlines()[0])
    p.add_argument("--models", nargs="+", default=MODELS, help=f"demo names or checkpoint paths (default: {' '.join(MODELS)})")
    p.add_argument("--readme", default=None, help="rewrite the table between this file's demo-table markers")
    p.add_argument("--threads", type=positive, default=2, help="torch CPU threads")
    args = p.parse_args(argv)
    path = Path(args.readme) if args.readme else None
    try:  # a README without the markers or a bad model is one line, before three minutes of measuring
        if path is not None:
            readme.block(readme.read(path), BLOCK)
        set_threads(args.threads)
        models = load_models(args.models)
        table = markdown({label: measure(model, label, models.folder(label)) for label, model in models.items()})
        print(table)
        if path is not None:
            readme.rewrite(path, BLOCK, table)
            print(f"rewrote the table in {path}", file=sys.stderr)
    except (OSError, ValueError, MemoryError) as e:
        print(f"python -m experiments.demo_table: --readme {path}: {e}" if isinstance(e, UnicodeDecodeError)
              else f"python -m experiments.demo_table: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
