"""Compact tables for probing from a shell: `sprout lens`, `sprout heads`, `sprout rms`."""
from __future__ import annotations

import argparse

import interp

from .common import held_out_text, load_models


def _model(args):
    (model,) = load_models([args.model], args.threads).values()
    return model


def _common(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    p.add_argument("--model", default="gpt-4", help="demo name or checkpoint path (default: gpt-4)")
    p.add_argument("--threads", type=int, default=2, help="torch CPU threads")
    return p


def _tok(s, width: int) -> str:
    """A token for a fixed-width cell: whitespace made visible, cut to `width`."""
    s = str(s).replace(" ", "·").replace("\n", "⏎").replace("\t", "⇥")
    return s if len(s) <= width else s[: width - 1] + "…"


def lens_table(lens) -> str:
    """One line per position: the input token, then the top-1 token and its probability per layer.

    A '*' marks a top-1 that is the actual next token.
    """
    seq0 = lens[lens["seq"] == lens["seq"].iloc[0]] if "seq" in lens.columns else lens
    layers = sorted(seq0["layer"].unique())
    head = f"{'pos':>3} {'token':<10}" + "".join(f" {('emb' if l == 0 else f'L{l:g}'):<14}" for l in layers)
    lines = [head, "-" * len(head)]
    for pos, g in seq0.groupby("pos", sort=True):
        g = g.set_index("layer")
        cells = []
        for l in layers:
            r = g.loc[l]
            top, p = r["top_tokens"][0], r["top_probs"][0]
            mark = "*" if isinstance(r["next_token"], str) and top == r["next_token"] else " "
            cells.append(f" {_tok(top, 8):<8}{100 * p:4.0f}%{mark}")
        lines.append(f"{pos:>3} {_tok(g['token'].iloc[0], 10):<10}" + "".join(cells))
    lines.append("top-1 token and its probability after each block (emb = the embedding); * = it is the next token")
    return "\n".join(lines)


def lens_main(argv=None) -> int:
    """`sprout lens "TEXT" --model gpt-4`: the logit lens of a text as a table."""
    p = _common(argparse.ArgumentParser(prog="sprout lens", description=lens_main.__doc__))
    p.add_argument("text", help="the text to read")
    args = p.parse_args(argv)
    print(lens_table(interp.logit_lens(_model(args), args.text, k=1)))
    return 0


def heads_table(scores, top: int) -> str:
    lines = [f"{'rank':>4} {'head':<7} {'score':>6}", "-" * 19]
    for i, r in enumerate(scores.head(top).itertuples(index=False), 1):
        lines.append(f"{i:>4} L{r.layer}H{r.head:<5} {r.score:6.3f}")
    return "\n".join(lines)


def heads_main(argv=None) -> int:
    """`sprout heads --model gpt-4 --kind induction`: the top heads of one kind."""
    p = _common(argparse.ArgumentParser(prog="sprout heads", description=heads_main.__doc__))
    p.add_argument("--kind", default="induction", choices=list(interp.KINDS))
    p.add_argument("--top", type=int, default=10, help="how many heads to list")
    p.add_argument("--text", default=None, help="score on this text instead of repeated random tokens")
    args = p.parse_args(argv)
    model = _model(args)
    half = min(32, int(model.cfg.n_ctx) // 2)
    scores = interp.head_scores(model, args.kind, args.text, half_len=half)
    where = "the text" if args.text else f"16 random sequences of {half} tokens, each repeated"
    print(f"{args.kind} score (mean attention on the target token), on {where}")
    print(heads_table(scores, args.top))
    return 0


def rms_table(df) -> str:
    lines = [f"{'site':<28} {'depth':>5} {'mean':>8} {'q05':>8} {'q50':>8} {'q95':>8} {'growth':>7}", "-" * 79]
    for r in df[df["kind"] == "stream"].itertuples(index=False):
        growth = "" if r.growth != r.growth else f"{r.growth:6.2f}x"  # NaN for the embedding
        lines.append(f"{r.site:<28} {r.layer:>5g} {r.mean:8.3g} {r.q05:8.3g} {r.q50:8.3g} {r.q95:8.3g} {growth:>7}")
    return "\n".join(lines)


def rms_main(argv=None) -> int:
    """`sprout rms --model gpt-4`: the residual stream's RMS per layer on held-out text."""
    p = _common(argparse.ArgumentParser(prog="sprout rms", description=rms_main.__doc__))
    p.add_argument("--chars", type=int, default=20_000, help="characters of held-out text")
    args = p.parse_args(argv)
    model = _model(args)
    df = interp.residual_rms(model, held_out_text(model, args.chars))
    print(f"RMS of the residual stream per token over {int(df['n_tokens'].iloc[0]):,} held-out tokens "
          "(depth x.5 = after block x+1's attention; growth = this block's factor)")
    print(rms_table(df))
    return 0
