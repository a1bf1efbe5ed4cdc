"""Analyses printed as compact tables for a shell: `sprout lens`, `sprout heads`, `sprout rms`.

Each command is a `main(argv) -> int`; the `sprout` console script (`sprout_cli`) imports them. A bad
argument, model or file is one line naming it (as `sprout export-hf` does), never a traceback.
"""
from __future__ import annotations

import argparse
import functools
import os
from pathlib import Path
from typing import Callable, Optional, Sequence, Union

import pandas as pd
import torch

import sprout
from sprout.files import read_bounded

from ._core.arguments import positive, whole_number
from ._core.specs import head_label
from .data import held_out_stories
from .heads import SCORE_KINDS, head_scores
from .lens import load_tuned_lens, logit_lens, tuned_lens
from .measures import residual_rms

__all__ = ["Main", "heads_main", "heads_table", "lens_main", "lens_table", "one_line", "positive", "read_text_file",
           "rms_main", "rms_table", "whole_number"]

# a command's entry point: argv (None: sys.argv[1:]) -> exit status
Main = Callable[[Optional[Sequence[str]]], int]


def _model(args):
    torch.set_num_threads(args.threads)
    return sprout.load(args.model).eval()


def _common(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    p.add_argument("--model", default="gpt-4", help="demo name or checkpoint path (default: gpt-4)")
    p.add_argument("--threads", type=positive, default=2, help="torch CPU threads (>= 1)")
    return p


def one_line(prog: str) -> Callable[[Main], Main]:
    """Wrap a command's main so that an error it reports (a missing or bad model, file or text) leaves as
    one `prog: message` on stderr and exit status 1, as `sprout export-hf` does, not as a traceback."""
    def wrap(main: Main) -> Main:
        @functools.wraps(main)
        def run(argv: Optional[Sequence[str]] = None) -> int:
            try:
                return main(argv)
            except (OSError, ValueError, MemoryError) as e:
                raise SystemExit(f"{prog}: {e}") from None
        return run
    return wrap


def read_text_file(path: Union[str, os.PathLike]) -> str:
    """A UTF-8 text file given on the command line (a regular file: a pipe or device would block or never end)."""
    data = read_bounded(path, "text file", limit=1 << 30)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"{path} is not UTF-8 text (byte 0x{data[e.start]:02x} at offset {e.start})") from None


def _tok(s, width: int) -> str:
    """A token for a fixed-width cell: whitespace made visible, cut to `width`."""
    s = str(s).replace(" ", "·").replace("\n", "⏎").replace("\t", "⇥")
    return s if len(s) <= width else s[: width - 1] + "…"


def _window_table(win, layers, first_pos: int) -> list[str]:
    head = f"{'pos':>4} {'token':<10}" + "".join(f" {('emb' if l == 0 else head_label(l)):<14}" for l in layers)
    lines = [head, "-" * len(head)]
    for pos, g in win.groupby("pos", sort=True):
        g = g.set_index("layer")
        cells = []
        for l in layers:
            r = g.loc[l]
            top, p = r["top_tokens"][0], r["top_probs"][0]
            mark = "*" if isinstance(r["next_token"], str) and top == r["next_token"] else " "
            cells.append(f" {_tok(top, 8):<8}{100 * p:4.0f}%{mark}")
        lines.append(f"{first_pos + pos:>4} {_tok(g['token'].iloc[0], 10):<10}" + "".join(cells))
    return lines


def lens_table(lens: pd.DataFrame) -> str:
    """One line per position: the input token, then the top-1 token and its probability per layer.

    A '*' marks a top-1 that is the actual next token. A `logit_lens` frame of several windows (a text
    longer than the context) gets one block per window, each headed by the token positions it covers.
    """
    if "seq" not in lens.columns:
        lens = lens.assign(seq=0)
    layers = sorted(lens["layer"].unique())
    seqs = sorted(lens["seq"].unique())
    lines, first_pos = [], 0
    for i, s in enumerate(seqs):
        win = lens[lens["seq"] == s]
        n = int(win["pos"].max()) + 1
        if len(seqs) > 1:
            lines.append(f"{'' if i == 0 else chr(10)}window {i + 1} of {len(seqs)}: tokens {first_pos}..{first_pos + n - 1}"
                         + (" (the model sees each window on its own)" if i == 0 else ""))
        lines += _window_table(win, layers, first_pos)
        first_pos += n
    lines.append("top-1 token and its probability after each block (emb = the embedding); * = it is the next token")
    return "\n".join(lines)


@one_line("sprout lens")
def lens_main(argv: Optional[Sequence[str]] = None) -> int:
    """`sprout lens "TEXT" --model gpt-4`: the logit lens of a text as a table.

    A text longer than the model's context is cut into consecutive windows of the context's length, and
    every window is shown.
    """
    p = _common(argparse.ArgumentParser(prog="sprout lens", description=lens_main.__doc__))
    p.add_argument("text", help="the text to read")
    p.add_argument("--tuned", action="store_true",
                   help="read through the model's tuned lens (the one beside its checkpoint, or the demo's)")
    args = p.parse_args(argv)
    model = _model(args)
    if not args.tuned:
        print(lens_table(logit_lens(model, args.text, k=1)))
        return 0
    try:
        lens = load_tuned_lens(model, args.model if Path(args.model).exists() else None)  # else a demo's
    except (FileNotFoundError, ValueError) as e:
        raise SystemExit(f"sprout lens --tuned: {e}")
    print(lens_table(tuned_lens(model, args.text, lens, k=1)).replace("after each block", "after each block (tuned lens)"))
    return 0


def heads_table(scores: pd.DataFrame, top: int) -> str:
    lines = [f"{'rank':>4} {'head':<7} {'score':>6}", "-" * 19]
    for i, r in enumerate(scores.head(top).itertuples(index=False), 1):
        lines.append(f"{i:>4} {head_label(r.layer, r.head):<8} {r.score:6.3f}")
    return "\n".join(lines)


@one_line("sprout heads")
def heads_main(argv: Optional[Sequence[str]] = None) -> int:
    """`sprout heads --model gpt-4 --kind induction`: the top heads of one kind."""
    p = _common(argparse.ArgumentParser(prog="sprout heads", description=heads_main.__doc__))
    p.add_argument("--kind", default="induction", choices=list(SCORE_KINDS))
    p.add_argument("--top", type=positive, default=10, help="how many heads to list (>= 1)")
    p.add_argument("--text", default=None, help="score on this text instead of repeated random tokens")
    args = p.parse_args(argv)
    model = _model(args)
    half = min(32, int(model.cfg.n_ctx) // 2)
    n_seqs = 16
    scores = head_scores(model, args.kind, args.text, half_len=half, n_seqs=n_seqs)
    where = "the text" if args.text else f"{n_seqs} random sequences of {half} tokens, each repeated"
    print(f"{args.kind} score (mean attention on the target token), on {where}")
    print(heads_table(scores, args.top))
    return 0


def rms_table(df: pd.DataFrame) -> str:
    lines = [f"{'site':<28} {'depth':>5} {'mean':>8} {'q05':>8} {'q50':>8} {'q95':>8} {'growth':>7}", "-" * 79]
    for r in df[df["kind"] == "stream"].itertuples(index=False):
        growth = "" if r.growth != r.growth else f"{r.growth:6.2f}x"  # NaN for the embedding
        lines.append(f"{r.site:<28} {r.layer:>5g} {r.mean:8.3g} {r.q05:8.3g} {r.q50:8.3g} {r.q95:8.3g} {growth:>7}")
    return "\n".join(lines)


@one_line("sprout rms")
def rms_main(argv: Optional[Sequence[str]] = None) -> int:
    """`sprout rms --model gpt-4`: the residual stream's RMS per layer on held-out text."""
    p = _common(argparse.ArgumentParser(prog="sprout rms", description=rms_main.__doc__))
    p.add_argument("--chars", type=positive, default=20_000, help="characters of held-out text (generated stories)")
    p.add_argument("--text-file", default=None, help="read this text file instead of generated stories")
    args = p.parse_args(argv)
    text = read_text_file(args.text_file) if args.text_file else held_out_stories(args.chars)  # before the model
    model = _model(args)
    df = residual_rms(model, text)
    print(f"RMS of the residual stream per token over {int(df['n_tokens'].iloc[0]):,} held-out tokens "
          "(depth x.5 = after block x+1's attention; growth = this block's factor)")
    print(rms_table(df))
    return 0
