"""Every experiment, one command: `python -m experiments.run_all [--models gpt-1 gpt-4] [--out results]`.

Writes `OUT/<experiment>/` for each experiment (figures as HTML, tables as CSV, numbers.json), one
`OUT/plotly.min.js` they all share, `OUT/numbers.csv` with every headline number, and `OUT/index.html`
showing every figure with a sentence on what it shows and the measured numbers beside the chapter's.
"""
from __future__ import annotations

import argparse
import importlib
import sys
import time
from pathlib import Path

import pandas as pd
from tqdm import tqdm

import sprout

from . import EXPERIMENTS
from .common import DEMOS, MARKER, Output, args_for, claim_out, figure_div, format_numbers, load_models, positive, set_threads  # noqa: F401 (MARKER)
from .pages import markup, render


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="python -m experiments.run_all", description=__doc__.splitlines()[0])
    p.add_argument("--models", "--model", dest="models", nargs="+", default=None,
                   help=f"demo names or checkpoint paths (default: {' '.join(DEMOS)}, those shipped)")
    p.add_argument("--out", default="results", help="output folder (default: results)")
    p.add_argument("--only", nargs="+", choices=EXPERIMENTS, default=None, help="run only these experiments")
    p.add_argument("--threads", type=positive, default=2, help="torch CPU threads")
    p.add_argument("--docs", default=None, metavar="DIR",
                   help="also write the README's key figures as PNG to DIR (Chromium screenshots)")
    return p.parse_args(argv)


# The README's figures: (experiment, figure stem, PNG name); {m} is the deepest model shown.
DOC_FIGURES = [
    ("logit_lens", "lens_{m}_short", "logit_lens.png"),
    ("tuned_lens", "side_by_side_{m}_short", "tuned_lens.png"),
    ("tuned_lens", "curves_{m}", "tuned_lens_curves.png"),
    ("residual_growth", "residual_rms", "residual_rms.png"),
    ("head_detection", "scores_{m}", "head_scores.png"),
    ("attention_maps", "induction_{m}", "induction_head.png"),
    ("induction_demo", "induction_table", "induction_table.png"),
    ("training_dynamics", "loss_curves", "loss_curves.png"),
    ("training_dynamics", "induction_over_training_{m}", "induction_over_training.png"),
    ("circuits", "phase_{m}", "phase_change.png"),
    ("param_counts", "param_breakdown", "param_breakdown.png"),
]


def write_docs(done: dict, models: dict, docs: Path) -> list[Path]:
    """Screenshots of the key figures for the README: the lens of the deepest model, the rest of gpt-4
    (the chapter's induction model) when it is shown."""
    from .png import screenshot

    deepest = max(models, key=lambda m: int(models[m].cfg.n_layers)) if models else ""
    heads = "gpt-4" if "gpt-4" in models else deepest
    written = []
    for exp, stem, png in DOC_FIGURES:
        figs = {**{f.stem: f.fig for f in done[exp][1].figures}, **done[exp][1].extra} if exp in done else {}
        fig = figs.get(stem.format(m=deepest if exp == "logit_lens" else heads))
        if fig is not None:
            written.append(screenshot(fig, Path(docs) / png))
    return written


def run_all(models: dict, out: Path, only=None, progress: bool = True, options: dict | None = None) -> dict:
    """Run the experiments on loaded models into `out`; returns {experiment: (module, Output, rows)}.

    `options` maps an experiment to extra command-line arguments, e.g. {"residual_growth": ["--chars", "4000"]}.
    """
    out = claim_out(Path(out))
    done = {}
    names = [n for n in EXPERIMENTS if only is None or n in only]
    bar = tqdm(names, desc="experiments", unit="exp", disable=not progress, file=sys.stderr)
    for name in bar:
        bar.set_postfix_str(name)
        module = importlib.import_module(f"experiments.{name}")
        o = Output(out / name, name, js_dir=out)
        args = args_for(module, (options or {}).get(name, ()))
        start = time.perf_counter()
        done[name] = (module, o, o.numbers(module.run(models, o, args)))
        o.seconds = time.perf_counter() - start
    rows = [dict(experiment=n, **{k: v for k, v in r.items() if k != "measured"}, measured=r["measured"])
            for n, (_, _, rs) in done.items() for r in rs]
    pd.DataFrame(rows).to_csv(out / "numbers.csv", index=False)
    write_index(done, models, out)
    return done


INDEX_CSS = """
body{font-family:system-ui,sans-serif;margin:2em auto;max-width:1500px;padding:0 1em;color:#222}
h1{margin-bottom:0} h2{margin-top:2.2em;border-bottom:1px solid #ddd}
p.what{max-width:60em} figure{margin:1.5em 0;overflow-x:auto} figcaption{color:#555;margin:.3em 0}
table{border-collapse:collapse;margin:.8em 0;max-width:100%}
td,th{border-bottom:1px solid #eee;padding:.25em .8em;text-align:left;vertical-align:top}
td.q{max-width:34em} td.num{font-family:monospace;text-align:left;max-width:48em} nav a{margin-right:1em}
"""


def write_index(done: dict, models: dict, out: Path) -> Path:
    """index.html: the headline numbers, then each experiment's sentence, numbers and figures
    (experiments/templates/index.html.j2)."""
    sections, k = [], 0
    for name, (module, o, rows) in done.items():
        figures = []
        for f in o.figures:
            div = figure_div(f.fig, div_id=f"fig{k}")
            figures.append(dict(div=markup(div), caption=f.caption, file=f.html.name))
            k += 1
        sections.append(dict(name=name, summary=module.SUMMARY, rows=rows, figures=figures, links=o.links,
                             pages=[dict(href=p.name, text=p.stem.replace('_', ' ')) for p in o.pages]))
    headline = [r for _, _, rows in done.values() for r in rows if r["chapter"] is not None]
    page = render("index.html.j2", title="sprout-interp results", css=markup(INDEX_CSS), js="plotly.min.js",
                  models=list(models), generated=time.strftime("%Y-%m-%d %H:%M"), headline=headline, sections=sections)
    path = out / "index.html"
    path.write_text(page, encoding="utf-8")
    return path


def main(argv=None) -> int:
    args = parse_args(argv)
    sprout.keep_freed_memory()  # many large caches in one process (README: Benchmarks)
    start = time.time()
    try:  # a bad --out or model name is one line, not a traceback
        claim_out(Path(args.out), create=False)
        set_threads(args.threads)
        models = load_models(args.models)
    except (OSError, ValueError, MemoryError) as e:
        print(f"run_all: {e}", file=sys.stderr)
        return 2
    done = run_all(models, Path(args.out), args.only)
    n_fig = sum(len(o.figures) for _, o, _ in done.values())
    print(f"{len(done)} experiments, {n_fig} figures in {time.time() - start:.0f} s -> {Path(args.out) / 'index.html'}")
    print("seconds per experiment: " + ", ".join(f"{n} {o.seconds:.0f}" for n, (_, o, _) in done.items()))
    if args.docs:
        print("README figures: " + ", ".join(str(p) for p in write_docs(done, models, Path(args.docs))))
    print(format_numbers([r for _, _, rows in done.values() for r in rows]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
