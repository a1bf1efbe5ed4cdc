"""Where the parameters live: the chapter's count, part by part, for each preset and loaded model."""
from __future__ import annotations

import sys

import pandas as pd

import figures
import interp
from sprout import SproutConfig

from .common import number, standalone

NAME = "param_counts"
DOC = "Parameter breakdown per preset (embedding, attention, feed-forward, norms)."
SUMMARY = ("How many parameters each part of the model holds, computed from the config alone: in the tiny "
           "gpt-1 the (tied) embedding is most of the model, in Sprout it is under a fifth.")
NEEDS_MODELS = False
# A GPT-2-small-sized Sprout: the chapter's example of a huge vocabulary taking a large share again.
GPT2_SMALL = SproutConfig(vocab_size=50257, context=1024, n_layer=12, n_head=12, d_model=768, d_ff=2048)


def configs(models) -> dict:
    out = {name: SproutConfig.preset(name) for name in ("gpt-1", "gpt-4", "sprout")}
    out["gpt-2-small size"] = GPT2_SMALL
    for label, m in models.items():
        if isinstance(getattr(m, "config", None), SproutConfig):
            out[f"{label} (demo)" if label in out else label] = m.config
    return out


def run(models, out, args) -> list[dict]:
    table = pd.concat([interp.param_table(cfg, name) for name, cfg in configs(models).items()], ignore_index=True)
    out.table(table, "param_table")
    out.figure(figures.param_breakdown(table), "param_breakdown",
               "Parameters per preset, stacked by part; the embedding doubles as the output layer (tied).")
    part = table.set_index(["config", "part"])["count"]
    share = table.set_index(["config", "part"])["share"]
    sprout = SproutConfig.preset("sprout")
    blocks = lambda t: t[t.per_block.notna()]["count"].sum()
    doubled = interp.param_table(SproutConfig.preset("sprout", d_model=768, d_ff=2048))
    return [
        number("Sprout parameters", int(part["sprout", "total"]), "17,309,056", fmt="{:,}"),
        number("Sprout parameters without weight tying", int(part["sprout", "total"] + sprout.vocab_size * sprout.d_model),
               "20.45M", fmt="{:,}"),
        number("embedding share, gpt-1 preset", float(share["gpt-1", "embedding"]), "80%", fmt="{:.0%}"),
        number("embedding share, Sprout", float(share["sprout", "embedding"]), "18%", fmt="{:.0%}"),
        number("block parameters when d_model and d_ff double", float(blocks(doubled) / blocks(table[table.config == "sprout"])),
               "about fourfold", fmt="{:.2f}x"),
    ]


def main(argv=None) -> int:
    return standalone(sys.modules[__name__], argv)


if __name__ == "__main__":
    raise SystemExit(main())
