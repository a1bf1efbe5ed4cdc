"""The dictionaries' command line, `python -m interp.saes.training MODEL (--hook NAME | --layer L) --out DIR`
(or under torchrun): train an SAE at a hook, or a transcoder for a block's MLP, on a text file or the demos'
own training text, and save it.

Every field of `TrainSettings` is a flag (`--d-sae`, `--grad-clip`, ...), generated from the settings class
with the field's comment as its help and its range checked as it is parsed, as `sprout train`'s flags are
from its recipe (`sprout.training.core.add_settings_flags`). A bad flag, model, text or --out is one line naming it, before
any training.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any, Optional, Sequence

import torch.distributed as dist

from sprout.files import load
from sprout.training.core import add_settings_flags, settings_from_flags

from ..._core.arguments import positive, whole_number
from ..._core.distributed import world_and_rank
from ...data import model_text
from ..files import is_ours
from ..sae import SAE
from ..settings import TrainSettings
from .train import train_sae, train_transcoder

PROG = "python -m interp.saes.training"
# the run's own arguments are train_sae's; the rest of TrainSettings are flags of their own
_RUN = ("checkpoint", "checkpoint_every", "resume", "stop_at")


def parser() -> argparse.ArgumentParser:
    """The command's parser: the run's arguments, then one flag per `TrainSettings` field."""
    ap = argparse.ArgumentParser(prog=PROG, description="train an SAE (--hook) or a transcoder (--layer) for a "
                                 "model and save it in --out (cfg.json + sae_weights.safetensors)")
    ap.add_argument("model", help="a checkpoint path or demo name")
    where = ap.add_mutually_exclusive_group(required=True)
    where.add_argument("--hook", action="append", help="SAE at this hook (repeat: one SAE per hook, one forward)")
    where.add_argument("--layer", action="append", type=whole_number(0),
                       help="transcoder for this block's MLP (repeat: one per block)")
    ap.add_argument("--out", required=True, help="folder for the dictionary; with several, one subfolder each")
    ap.add_argument("--text-file", default=None, help="a UTF-8 text file to train on (default: the demos' own text)")
    ap.add_argument("--train-chars", type=positive, default=400_000,
                    help="without --text-file: this many characters of the demos' training corpus")
    ap.add_argument("--checkpoint", default=None, help="folder for the run's checkpoint (to resume)")
    ap.add_argument("--checkpoint-every", type=positive, default=None, help="steps between checkpoints")
    ap.add_argument("--resume", action="store_true", help="continue the run in --checkpoint")
    ap.add_argument("--stop-at", type=whole_number(0), default=None, help="stop after this many steps")
    ap.add_argument("--no-progress", action="store_true", help="no progress bar")
    add_settings_flags(ap, TrainSettings, "training settings (default: TrainSettings' own, or train_sae's)", ranges=True)
    return ap


def _targets(out: Path, names: list) -> list[Path]:
    """Where each dictionary goes: --out itself for one, a subfolder per hook or layer for several; a folder
    holding anything but a dictionary of ours is refused now, not after training."""
    paths = [out] if len(names) == 1 else [out / (f"layer_{n}" if isinstance(n, int) else str(n)) for n in names]
    for p in paths:
        if p.exists() and (not p.is_dir() or (any(p.iterdir()) and not is_ours(p))):
            raise ValueError(f"--out {p} holds something that is not a dictionary of ours: choose a new folder")
    return paths


def _text(args: argparse.Namespace) -> str:
    if args.text_file is None:
        return model_text(args.train_chars)
    try:
        return Path(args.text_file).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise ValueError(f"--text-file {args.text_file}: cannot read it as UTF-8 text ({e})") from None


def run(args: argparse.Namespace) -> list[Path]:
    """Train and save as `args` say; returns the folders written (rank 0; none on the other ranks)."""
    names = args.hook or args.layer
    targets = _targets(Path(args.out), names)
    model, text = load(args.model), _text(args)
    run_args: dict[str, Any] = {k: getattr(args, k) for k in _RUN}
    settings = settings_from_flags(args, TrainSettings)
    many = len(names) > 1
    if args.hook:
        out = train_sae(model, names if many else names[0], data=text, progress=not args.no_progress, **run_args,
                        **settings)
    else:
        out = train_transcoder(model, text, names if many else names[0], progress=not args.no_progress,
                               **run_args, **settings)
    dicts: list[SAE] = [out[n] for n in names] if isinstance(out, dict) else [out]
    if world_and_rank()[1] != 0:
        return []
    return [d.save(p) for d, p in zip(dicts, targets)]


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Parse `argv`, train, save; errors are one line on stderr with exit status 1 (2 for a bad flag)."""
    args = parser().parse_args(argv)
    try:
        for path in run(args):
            print(f"saved {path}")
    except (OSError, ValueError, TypeError) as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 1
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    return 0
