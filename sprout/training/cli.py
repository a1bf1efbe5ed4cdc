"""`sprout train`: `--recipe NAME --out DIR`, plus one flag per recipe field.

Errors are one line on stderr, exit status 1 (2 for a bad flag, as argparse does); Ctrl-C stops the run
with one line naming the last complete checkpoint, exit status 130.
"""
from __future__ import annotations

import argparse
import os
import sys
from typing import Optional, Sequence

import torch
import torch.distributed as dist

from ..files import latest_checkpoint
from .core import add_settings_flags, settings_from_flags
from .loop import NonFiniteLoss, check_device, train
from .recipes import RECIPES, Recipe, get_recipe

DESCRIPTION = """Train a model from a recipe: sprout train --recipe gpt-4 --out runs/gpt-4.

--out must be a new or empty folder (or a run of ours that has no checkpoint yet); a folder holding anything
else is refused, so nothing of yours is overwritten. --resume continues a run directory from its latest
checkpoint, refusing a different recipe, changed data or another tokenizer. A run locks its folder: a second
`sprout train` on it stops at once. --grad-clip 0 means no clipping (as in nanoGPT)."""


def parse_args(argv: Optional[Sequence[str]] = None) -> tuple[argparse.Namespace, Recipe]:
    """`--recipe NAME --out DIR` plus one flag per recipe field; unknown flags and out-of-range values are
    an error (exit status 2) before any work."""
    p = argparse.ArgumentParser(prog="sprout train", description=DESCRIPTION,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--recipe", default="gpt-4", choices=sorted(RECIPES), help="starting recipe (default gpt-4)")
    p.add_argument("--out", required=True, help="run directory: checkpoints/, train_log.csv, recipe.json")
    p.add_argument("--resume", action="store_true", help="continue from the latest checkpoint in --out")
    p.add_argument("--data-cache", default=None, help="where tokenised corpora are cached (default OUT/data)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads, >= 1 (default: torch's choice)")
    p.add_argument("--device", default="cpu", help="cpu (default), cuda or cuda:N: where the model trains")
    # one flag per recipe field, its help the field's comment in sprout.training.recipes
    add_settings_flags(p, Recipe, "recipe overrides (default: the recipe's value)")
    args = p.parse_args(argv)
    if args.threads is not None and args.threads < 1:
        p.error(f"argument --threads: must be >= 1, got {args.threads}")
    try:
        check_device(args.device)
    except ValueError as e:
        p.error(str(e))
    changes = settings_from_flags(args, Recipe)
    try:
        recipe = get_recipe(args.recipe).override(**changes)
    except ValueError as e:
        p.error(str(e))
    return args, recipe


def _last(out) -> str:
    try:
        return str(latest_checkpoint(out) or "none (no checkpoint was written yet)")
    except (OSError, ValueError):
        return "unknown"


def main(argv: Optional[Sequence[str]] = None) -> int:
    args, recipe = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    try:
        train(recipe, args.out, data_cache=args.data_cache, resume=args.resume, progress=not args.no_progress,
              device=args.device)
    except (NonFiniteLoss, ValueError) as e:
        print(f"sprout train: error: {e}", file=sys.stderr)
        return 1
    except OSError as e:  # a full disk, a read-only folder: the last complete checkpoint is intact
        last = _last(args.out)
        where = f"; the last complete checkpoint is {last} (resume from it with --resume)" if "step_" in last else ""
        print(f"sprout train: error: {e}{where}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"\nsprout train: interrupted; the last complete checkpoint is {_last(args.out)} "
              "(continue with --resume)", file=sys.stderr)
        return 130
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    if int(os.environ.get("RANK", "0")) == 0:
        print(f"done: {latest_checkpoint(args.out)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
