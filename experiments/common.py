"""What every experiment script shares: arguments, loading models, texts, and writing results.

An experiment is a module with `run(models, out, args) -> list[dict]` (the headline numbers) and
`main(argv)`. `Output` writes its figures as standalone HTML next to one shared plotly.min.js, PNGs
when kaleido and a Chromium are available, and its tables as CSV and numbers as JSON.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import shutil
import sys
from dataclasses import dataclass, field
from html import escape as html_escape
from pathlib import Path
from typing import Optional, Union

import pandas as pd
import plotly.graph_objects as go
import torch

import interp
import sprout
from figures.style import RESPONSIVE, responsive
from interp.cli import positive
from sprout.files import demo_dir, demo_names, file_in, read_bounded, replace_file
from sprout.tokenizer import encode

from . import EXPERIMENTS

# The shipped demo models run by default (those present; gpt-1 and gpt-4 are always asked for, so a
# missing one is an error that lists what is shipped).
DEMOS = ["gpt-1", "gpt-4", "sprout-mini"]
DEFAULT_MODELS = DEMOS[:2]


def default_models() -> list[str]:
    shipped = set(demo_names())
    return DEFAULT_MODELS + [d for d in DEMOS[2:] if d in shipped]


RESULTS = Path("results")


@dataclass(frozen=True)
class Settings:
    """What the headline numbers are measured on, shared by every experiment, the README's demo table
    (`experiments.demo_table`) and the tests of the shipped demos."""

    half_len: int = 32  # repeated random tokens: each sequence is half_len random ids, then the same again
    n_seqs: int = 16  # how many such sequences
    seed: int = 0  # their seed, and the generated stories'
    top: int = 3  # top induction heads ablated (one at a time and together)
    held_out_chars: int = 20_000  # generated held-out stories (interp.held_out_stories) for loss, RMS, lens
    stories: int = 24  # generated stories for the names' later pieces (interp.induction_stories)


SETTINGS = Settings()


def chapter_model(label: str) -> bool:
    """Whether model `label` is one the chapter measured (a shipped demo), so its numbers may stand beside the
    chapter's; any other model (one's own run) gets no chapter column."""
    return label in set(demo_names())


def half_len(model) -> int:
    """SETTINGS.half_len, or half the context for a model whose context is shorter than two halves."""
    return min(SETTINGS.half_len, int(model.cfg.n_ctx) // 2)

def head_scores(model, kind: str, n_seqs: int = SETTINGS.n_seqs):
    """`interp.head_scores` at the shared settings: every experiment that names a model's top head of a
    kind (head_detection's numbers, attention_maps' figures, the demo table) reads it from this one call."""
    return interp.head_scores(model, kind, half_len=half_len(model), n_seqs=n_seqs, seed=SETTINGS.seed)


# The chapter's demo text: an invented name comes back, so only copying can predict it the second time.
ZORBIN = ("Once there was a baker named Zorbin Plax. He baked bread for the whole town. One day a "
          "girl asked who made it, and the miller said: Zorbin Plax")
# A short text for the logit lens and the attention maps (it also repeats a name).
LENS_TEXT = ("Mira Tolk found a red kite in the garden. She gave the kite to her friend Dob. "
             "Later that day, Mira Tolk and Dob flew the red kite over the hill.")


# ----------------------------------------------------------------------------- arguments and models

def parser(name: str, doc: str, text: Optional[str] = None) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=f"python -m experiments.{name}", description=doc)
    p.add_argument("--model", "--models", dest="models", nargs="+", default=None, metavar="MODEL",
                   help=f"demo names or checkpoint paths (default: {' '.join(DEMOS)}, those shipped)")
    if text is not None:
        p.add_argument("--text", default=text, help="the text to analyse")
    p.add_argument("--out", default=None, help=f"output folder (default: results/{name})")
    p.add_argument("--threads", type=positive, default=2, help="torch CPU threads")
    return p


def add_text_file(p: argparse.ArgumentParser) -> None:
    """`--text-file FILE`: one's own text (UTF-8) for the contexts an experiment reads."""
    p.add_argument("--text-file", default=None, metavar="FILE",
                   help="your own UTF-8 text to read the contexts from (default: generated held-out stories)")


def text_file(path: Optional[str]) -> Optional[str]:
    """The text of `--text-file` (None when not given); a missing, non-UTF-8 or empty file is a ValueError naming it."""
    if path is None:
        return None
    try:
        text = read_bounded(path, "text file", limit=64 << 20).decode("utf-8")
    except FileNotFoundError:
        raise ValueError(f"--text-file {path}: no such file") from None
    except UnicodeDecodeError as e:
        raise ValueError(f"--text-file {path}: not UTF-8 text ({e.reason} at byte {e.start})") from None
    if not text.strip():
        raise ValueError(f"--text-file {path}: the file holds no text")
    return text


def model_label(spec: str) -> str:
    """'gpt-4' for a demo name, the folder name for a checkpoint path (of the real folder for '.', '..' or
    a path ending in one; the run's name for a checkpoint inside a `sprout train` run, RUN/checkpoints/step_N).
    A label names files under `--out`, so it is one plain path component: letters,
    digits and `._+-` (anything else becomes '-'), never starting with '.' (no '..', no hidden files)."""
    p = Path(spec)
    if p.suffix in (".safetensors", ".pt", ".pth", ".bin"):
        p = p.parent
    name = p.name if p.name not in ("", ".", "..") and p.parts[-1:] != ("..",) else Path(os.path.abspath(p)).name
    if name.startswith("step_") and p.parent.name == "checkpoints":  # RUN/checkpoints/step_N: the run's name
        name = p.parent.parent.name or Path(os.path.abspath(p)).parent.parent.name
    label = re.sub(r"[^A-Za-z0-9._+-]+", "-", name).lstrip(".-")
    return label or "model"


class Models(dict):
    """{label: model}, as `load_models` loaded them, and the folder each came from (`folder(label)`):
    what an experiment needs to find the files beside a model (val.txt, a tuned lens, a run's snapshots)."""

    def __init__(self, models: dict, folders: Optional[dict] = None):
        super().__init__(models)
        self.folders = {label: None for label in models} | dict(folders or {})

    def folder(self, label: str) -> Optional[Path]:
        """The folder model `label` was loaded from (a demo's or a checkpoint's), None if it has none."""
        return self.folders.get(label)


def load_models(specs) -> Models:
    """{label: model} for demo names or paths, loaded once, in eval mode, on the CPU, with each one's folder.

    Nothing is set on the models or on torch: the thread count is the caller's (`set_threads`)."""
    models, folders = {}, {}
    for spec in specs or default_models():
        label = model_label(spec)
        if label in models:
            raise ValueError(f"two models are called {label!r}; rename one of the checkpoint folders")
        models[label], folders[label] = sprout.load(spec), model_dir(spec)
    return Models(models, folders)


def set_threads(threads: int) -> None:
    """torch's CPU threads for this process: a script's `--threads`, set by its main, never by a library."""
    torch.set_num_threads(max(1, int(threads)))


def folder_of(models: dict, label: str) -> Optional[Path]:
    """The folder of model `label` in `models` (a `Models`; a plain dict knows none)."""
    return models.folder(label) if isinstance(models, Models) else None


def model_dir(spec: Union[str, os.PathLike]) -> Optional[Path]:
    """The folder a model spec names (a demo name, a checkpoint folder or a weights file in one), if it exists
    (a loaded model does not know its folder: `folder_of(models, label)`)."""
    p = Path(spec)
    if p.is_file():
        return p.parent
    if p.is_dir():
        return p
    d = demo_dir() / str(spec)
    return d if d.is_dir() else None


def held_out_text(model, n_chars: int = SETTINGS.held_out_chars, folder: Optional[Path] = None) -> str:
    """Text the model did not train on: a `val.txt` in its `folder` (`Models.folder`), else
    `interp.held_out_stories` (generated stories whose names are drawn at random, so no model has seen them)."""
    d = folder
    for name in ("val.txt", "held_out.txt"):
        if d is not None and os.path.lexists(d / name):
            return read_bounded(file_in(d, name, "held-out text"), "held-out text", 1 << 30).decode("utf-8")[:n_chars]
    return interp.held_out_stories(n_chars)


def fit_text(model, text: str, max_tokens: Optional[int] = None) -> str:
    """The longest prefix of `text` (cut at a word) that fits the model's context (and max_tokens)."""
    limit = min(int(model.cfg.n_ctx), max_tokens or 10**9)
    n_tokens = lambda t: len(encode(model.tokenizer, t))
    if n_tokens(text) <= limit:
        return text
    words = text.split(" ")
    lo, hi = 1, len(words)
    while lo < hi:  # binary search on the number of words
        mid = (lo + hi + 1) // 2
        if n_tokens(" ".join(words[:mid])) <= limit:
            lo = mid
        else:
            hi = mid - 1
    return " ".join(words[:lo])


# ----------------------------------------------------------------------------- output

def figure_div(fig: go.Figure, div_id: Optional[str] = None) -> str:
    """A figure as a page's <div>: as wide as its container (plotly autosize, `figures.style.responsive`)
    but never wider than it was designed, and its designed height."""
    width, height = fig.layout.width, fig.layout.height
    div = responsive(fig).to_html(full_html=False, include_plotlyjs=False, div_id=div_id, config=RESPONSIVE,
                                  default_width="100%", default_height=f"{int(height)}px" if height else "100%")
    return f"<div style='max-width:{int(width)}px'>{div}</div>" if width else div


def standalone_html(fig: go.Figure, title: str, plotly_js: str) -> str:
    """A whole page holding one figure, titled (the browser's tab shows `title`)."""
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>{html_escape(title)}</title>"
            f'<script src="{plotly_js}"></script></head><body>{figure_div(fig)}</body></html>')


def kaleido_ready() -> bool:
    """PNG export needs the kaleido package and a Chromium for it to drive."""
    if importlib.util.find_spec("kaleido") is None:
        return False
    return any(shutil.which(b) for b in ("chromium", "chromium-browser", "google-chrome", "chrome"))


@dataclass
class Figure:
    experiment: str
    stem: str
    caption: str
    fig: object
    html: Path


@dataclass
class Output:
    """Where one experiment writes (`dir`), and the folder holding the one plotly.min.js (`js_dir`:
    `dir` itself for a lone experiment, the common root under run_all)."""

    dir: Path
    experiment: str
    js_dir: Optional[Path] = None
    figures: list = field(default_factory=list)
    extra: dict = field(default_factory=dict)  # figures kept for the README only, not written or indexed
    links: list = field(default_factory=list)  # (path inside dir, text): pages the index links (feature pages)
    pages: list = field(default_factory=list)  # standalone HTML pages (not plotly figures) the index links

    def __post_init__(self):
        self.dir = Path(self.dir)
        self.js_dir = self.dir if self.js_dir is None else Path(self.js_dir)
        self.dir.mkdir(parents=True, exist_ok=True)

    def plotly_js(self) -> Path:
        """Write plotly.min.js into the root once; every HTML file below it references that copy."""
        path = self.js_dir / "plotly.min.js"
        if not path.is_file():
            from plotly.offline import get_plotlyjs

            replace_file(path, get_plotlyjs().encode("utf-8"))
        return path

    def figure(self, fig, stem: str, caption: str) -> Path:
        """Write `<stem>.html` (and `<stem>.png` when kaleido can) and remember it for the index."""
        html = self.dir / f"{stem}.html"
        js = os.path.relpath(self.plotly_js(), self.dir).replace(os.sep, "/")
        replace_file(html, standalone_html(fig, caption, js).encode("utf-8"))
        if kaleido_ready():
            try:
                fig.write_image(self.dir / f"{stem}.png", scale=2)
            except Exception:  # a kaleido without a working browser: HTML is the real output
                pass
        self.figures.append(Figure(self.experiment, stem, caption, fig, html))
        return html

    def table(self, df: pd.DataFrame, stem: str) -> Path:
        path = self.dir / f"{stem}.csv"
        df.to_csv(path, index=False)
        return path

    def numbers(self, rows: list[dict]) -> list[dict]:
        """The headline numbers as numbers.json: quantity, model, measured, chapter, note."""
        with open(self.dir / "numbers.json", "w", encoding="utf-8") as f:
            json.dump(rows, f, indent=2, default=float)
        return rows


def number(quantity: str, measured, chapter=None, model: str = "", fmt: str = "{:.3g}", note: str = "") -> dict:
    """One headline number, measured beside the chapter's (None when the chapter gives none)."""
    shown = "n/a" if measured is None else (fmt.format(measured) if isinstance(measured, (int, float)) else str(measured))
    return dict(quantity=quantity, model=model, measured=measured, shown=shown,
                chapter=chapter, note=note)


MARKER = ".run_all"  # in a folder an experiment made, which experiments may write into again


def claim_out(out: Path, create: bool = True) -> Path:
    """Make `out` ours to write into: absent, empty, marked by an earlier experiment or run_all, or an
    experiment's folder inside a marked run_all folder; never a user's folder. Every script's `--out`
    goes through here (run_all's and each `python -m experiments.<name>`'s).

    With `create=False` only check (nothing is made before the models have loaded).

    Raises:
        FileExistsError: `out` is a file, or a non-empty folder without our marker (the message says
            what is in it).
    """
    out = Path(out)
    if os.path.lexists(out) and not out.is_dir():
        raise FileExistsError(f"--out {out} is a file, not a folder: choose a folder for the results")
    if out.is_dir() and not _ours(out) and any(out.iterdir()):
        found = sorted(os.listdir(out))
        raise FileExistsError(f"--out {out} is not empty and was not written by run_all or an experiment (no {MARKER} in it; "
                              f"it holds {', '.join(found[:8])}{' ...' if len(found) > 8 else ''}): choose a new or "
                              "empty folder, so that nothing of yours is overwritten")
    if not create:
        return out
    out.mkdir(parents=True, exist_ok=True)
    if not (out / MARKER).is_file():
        (out / MARKER).write_text("written by python -m experiments, which may write into this folder again\n")
    return out


def _ours(out: Path) -> bool:
    return (out / MARKER).is_file() or (out.name in EXPERIMENTS and (out.parent / MARKER).is_file())


def output_for(args, name: str) -> Output:
    return Output(Path(args.out) if args.out else RESULTS / name, name)


def args_for(module, argv=()) -> argparse.Namespace:
    """An experiment's arguments with its defaults (what run_all passes it)."""
    p = parser(module.NAME, module.DOC, getattr(module, "TEXT", None))
    if hasattr(module, "add_args"):
        module.add_args(p)
    return p.parse_args(list(argv))


def standalone(module, argv=None) -> int:
    """`python -m experiments.<name>`: parse, load, run, write numbers.json, print the numbers."""
    args = args_for(module, sys.argv[1:] if argv is None else argv)
    where = Path(args.out) if args.out else RESULTS / module.NAME
    needs = getattr(module, "NEEDS_MODELS", True)
    try:  # a bad --out, model or text is one line, not a traceback; --out is checked before any work
        claim_out(where, create=False)
        set_threads(args.threads)
        models = load_models(args.models) if (args.models or needs) else Models({})
        out = Output(claim_out(where), module.NAME)
        rows = out.numbers(module.run(models, out, args))
    except (OSError, ValueError, MemoryError) as e:
        print(f"python -m experiments.{module.NAME}: {e}", file=sys.stderr)
        return 2
    print(f"wrote {len(out.figures)} figure(s) and numbers.json to {out.dir}")
    print(format_numbers(rows))
    return 0


def format_numbers(rows: list[dict]) -> str:
    lines = []
    for r in rows:
        chapter = "" if r["chapter"] is None else f"   (chapter: {r['chapter']})"
        lines.append(f"  {r['model'] or '-':<14} {r['quantity']:<56} {r['shown']}{chapter}")
    return "\n".join(lines)
