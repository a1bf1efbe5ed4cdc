"""Ship a finished training run as a demo model: `python -m sprout.training.ship runs/gpt-4 gpt-4`.

Writes `sprout/demo/<name>/` = the run's latest checkpoint (config.json, model.safetensors,
tokenizer.json, via `sprout.files.checkpoint.save`) plus its recipe.json and train_log.csv, so that
`sprout.load("<name>")` works on a fresh clone.
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Union

from ..files import demo_dir, latest_checkpoint, load, replace_file, save
from .recipes import Recipe

MAX_BYTES = 15 * 2**20  # what one demo may add to the repository


def ship(run_dir: Union[str, os.PathLike], name: str) -> Path:
    run_dir = Path(run_dir)
    last = latest_checkpoint(run_dir)
    if last is None:
        raise ValueError(f"{run_dir} holds no checkpoint to ship")
    target = save(load(last), demo_dir() / name)
    recipe = Recipe.from_dict(json.loads((run_dir / "recipe.json").read_text()))  # fills newer fields
    replace_file(target / "recipe.json", recipe.to_json().encode())  # each file whole, old or new
    replace_file(target / "train_log.csv", (run_dir / "train_log.csv").read_bytes())
    size = sum(f.stat().st_size for f in target.iterdir())
    if size > MAX_BYTES:
        raise ValueError(f"{target} is {size / 2**20:.1f} MB, over the {MAX_BYTES / 2**20:.0f} MB limit for a demo")
    print(f"shipped {last} as {target} ({size / 2**20:.1f} MB)")
    return target


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit("usage: python -m sprout.training.ship RUN_DIR NAME")
    ship(sys.argv[1], sys.argv[2])
