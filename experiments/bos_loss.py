"""What a BOS token does to the shipped demos' held-out loss: `python -m experiments.bos_loss [--readme docs/guide/transformerlens.md]`.

The demos were trained on stories separated by blank lines, never on `<|endoftext|>`, so
`model.cfg.default_prepend_bos` is False; this measures whether `prepend_bos=True` (GPT-2's BOS,
`<|endoftext|>`, first) would help. Both rows score the same tokens, with and without the BOS in front:
- "story starts": each held-out story's first n_ctx - 1 tokens, where a document begins;
- "windows": the held-out text (`experiments.common.held_out_text`, as the demo table's loss) cut into
  consecutive windows of n_ctx - 1 tokens, as `interp.mean_loss` cuts it.
In each, token 1 is left out (only the BOS run predicts it). With `--readme` the table between the
README's `<!-- bos-table -->` markers is replaced by the one printed.
"""
from __future__ import annotations

import argparse
import sys

import pandas as pd
import torch

import interp
from sprout.tokenizer import encode

from . import readme
from .common import folder_of, held_out_text, load_models, positive, set_threads

MODELS = ["gpt-1", "gpt-4", "sprout-mini"]
BLOCK = "bos-table"  # the block this table is written into (its file: experiments.readme.HOMES)


@torch.inference_mode()
def _nll(model, rows: list[list[int]], bos: bool) -> tuple[float, int]:
    """Summed next-token loss over tokens 2.. of each row (with the BOS in front or not), and their count."""
    total, n = 0.0, 0
    first = [model.tokenizer.bos_token_id] if bos else []
    for row in rows:
        ids = torch.tensor([first + row], device=model.cfg.device)
        per_token = model(ids, return_type="loss", loss_per_token=True)[0]  # [pos - 1]
        part = per_token[1:] if bos else per_token  # both: the predictions of tokens 2..len(row)
        total += part.double().sum().item()
        n += part.numel()
    return total, n


def bos_losses(model, text: str) -> pd.DataFrame:
    """Mean loss (nats/token) on the same tokens without and with `<|endoftext|>` first.

    Returns:
        Two rows, `where` "story starts" and "windows", with `without_bos`, `with_bos`, `change`
        (with - without) and `tokens` (predictions averaged).
    """
    if getattr(model.tokenizer, "bos_token_id", None) is None:
        raise ValueError("this model's tokenizer has no <|endoftext|> to use as BOS")
    size = int(model.cfg.n_ctx) - 1
    stories = [encode(model.tokenizer, s)[:size] for s in text.split("\n\n") if s.strip()]
    ids = encode(model.tokenizer, text)
    windows = interp.data.slices(ids, size)
    out = []
    for where, rows in (("story starts", stories), ("windows", windows)):
        rows = [r for r in rows if len(r) > 1]
        (a, n), (b, _) = _nll(model, rows, bos=False), _nll(model, rows, bos=True)
        out.append(dict(where=where, without_bos=a / n, with_bos=b / n, change=(b - a) / n, tokens=n))
    return pd.DataFrame(out)


def table(models: dict) -> str:
    """The README's Markdown table: one row per demo and place."""
    lines = ["| demo | where | loss without BOS | with BOS first | change | tokens |", "|---|---|---|---|---|---|"]
    for name, model in models.items():
        for r in bos_losses(model, held_out_text(model, folder=folder_of(models, name))).itertuples():
            lines.append(f"| {name} | {r.where} | {r.without_bos:.3f} | {r.with_bos:.3f} | {r.change:+.3f} | {r.tokens:,} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m experiments.bos_loss", description=__doc__.splitlines()[0])
    p.add_argument("--readme", default=None, help="rewrite the table between this file's bos-table markers")
    p.add_argument("--threads", type=positive, default=2, help="torch CPU threads")
    args = p.parse_args(argv)
    set_threads(args.threads)
    out = table(load_models(MODELS))
    print(out)
    if args.readme:
        readme.rewrite(args.readme, BLOCK, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
