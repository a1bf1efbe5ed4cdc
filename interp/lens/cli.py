"""The tuned lens' command line, `python -m interp.lens.train MODEL --out DIR` (or under torchrun):
train a lens on the demos' own training text, measure it on held-out stories, save it.

Its recipe flags (`--steps`, `--lr`, `--grad-clip`, ...) are generated from `TunedLensSettings`, each checked
as it is parsed (`sprout.training.core.add_settings_flags`). A bad --out or model is one line naming it,
checked before the model loads and the lens trains.
"""
from __future__ import annotations

import argparse
import time
from typing import Callable, Optional

import torch
import torch.distributed as dist

from sprout import keep_freed_memory
from sprout.files import load
from sprout.training.core import add_settings_flags, settings_from_flags

from .._core.arguments import positive
from .._core.distributed import world_and_rank
from ..data import held_out_stories, model_text
from .settings import TunedLensSettings
from .tuned import TunedLens, check_save_target


def main(argv: Optional[list[str]], train: Callable[..., TunedLens]) -> None:
    """Parse `argv`, check --out, load the model, train with `train` (`train_tuned_lens`) and save."""
    ap = argparse.ArgumentParser(prog="python -m interp.lens.train",
                                 description="train a tuned lens for a model and save it beside nothing else")
    ap.add_argument("model", help="a checkpoint path or demo name")
    ap.add_argument("--train-chars", type=positive, default=400_000)
    ap.add_argument("--held-out-chars", type=positive, default=60_000)
    ap.add_argument("--out", required=True, help="directory for tuned_lens.safetensors + tuned_lens.json")
    # the recipe's flags, generated from its settings (stop_at: the API's, a saved lens cannot resume)
    add_settings_flags(ap, TunedLensSettings, "training settings (default: the tuned-lens package's)", skip=("stop_at",),
                       ranges=True)
    args = ap.parse_args(argv)
    keep_freed_memory()  # an application's choice (docs/reference/benchmarks.md); the library never makes it
    try:  # --out before the model loads and the lens trains; a bad --out or model is one line
        check_save_target(args.out)
        model = load(args.model)
    except (OSError, ValueError, MemoryError) as e:
        raise SystemExit(f"python -m interp.lens.train: {e}") from None
    t0 = time.perf_counter()
    lens = train(model, model_text(args.train_chars), **settings_from_flags(args, TunedLensSettings),
                 held_out=held_out_stories(args.held_out_chars),
                 data_name=f"the first {args.train_chars} chars of the demos' training corpus "
                           "(sprout.material.generate_corpus, seed 0); held out: interp.held_out_stories")
    if world_and_rank()[1] == 0:
        print(f"{args.model}: {time.perf_counter() - t0:.0f} s in all (data, {lens.step} steps, held-out KL), "
              f"{torch.get_num_threads()} threads; held-out KL per layer {lens.info['held_out_kl']}")
        print(f"saved {lens.save(args.out)}")
    if dist.is_initialized():
        dist.destroy_process_group()
