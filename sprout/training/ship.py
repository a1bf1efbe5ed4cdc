"""Ship a finished training run as a demo model: `python -m sprout.training.ship runs/gpt-4 gpt-4`.

Writes `sprout/demo/<name>/` = the run's latest checkpoint (config.json, model.safetensors,
tokenizer.json, via `sprout.files.checkpoint.save`) plus its recipe.json and train_log.csv, so that
`sprout.load("<name>")` works on a fresh clone. A run trained in stages (its recipe's `init` names the run
it continued) takes the earlier stages' recipe.json and train_log.csv along, in `stages/<run name>/`, so
its training curves span every stage.
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Optional, Union

from ..files import demo_dir, latest_checkpoint, load, replace_file, save
from .recipes import Recipe

MAX_BYTES = 15 * 2**20  # what one demo may add to the repository
STAGE_FILES = ("recipe.json", "train_log.csv")  # what an earlier stage leaves in stages/<run>/


def ship(run_dir: Union[str, os.PathLike], name: str) -> Path:
    run_dir = Path(run_dir)
    last = latest_checkpoint(run_dir)
    if last is None:
        raise ValueError(f"{run_dir} holds no checkpoint to ship")
    target = save(load(last), demo_dir() / name)
    recipe = Recipe.from_dict(json.loads((run_dir / "recipe.json").read_text()))  # fills newer fields
    replace_file(target / "recipe.json", recipe.to_json().encode())  # each file whole, old or new
    replace_file(target / "train_log.csv", (run_dir / "train_log.csv").read_bytes())
    stages = ship_stages(run_dir, target)
    drop_stale_stages(target, stages)
    shipped = [f for f in target.iterdir() if f.is_file()] + [f for d in stages for f in d.iterdir() if f.is_file()]
    size = sum(f.stat().st_size for f in shipped)  # saes/ and lens files are the dictionaries' pipeline's, with its own limit
    if size > MAX_BYTES:
        raise ValueError(f"{target} is {size / 2**20:.1f} MB, over the {MAX_BYTES / 2**20:.0f} MB limit for a demo")
    print(f"shipped {last} as {target} ({size / 2**20:.1f} MB)")
    return target


def earlier_stage(folder: Path, init: str) -> Optional[Path]:
    """The folder of the run that `folder`'s run continued (its recipe's `init`): the path as written,
    else a run of that name beside `folder` or among the stages shipped inside it; None if none holds a
    train_log.csv (the earlier run is not here)."""
    if not init:
        return None
    name = Path(init).name
    for cand in (Path(init), folder.parent / name, folder / "stages" / name):
        if (cand / "train_log.csv").is_file():
            return cand
    return None


def ship_stages(run_dir: Path, target: Path, limit: int = 16) -> list[Path]:
    """Copy the recipe.json and train_log.csv of every run `run_dir` continued into `target/stages/<name>/`
    (earliest last); returns the folders written."""
    written: list[Path] = []
    d = run_dir
    for _ in range(limit):
        recipe_path = d / "recipe.json"
        init = Recipe.from_dict(json.loads(recipe_path.read_text())).init if recipe_path.is_file() else ""
        earlier = earlier_stage(d, init)
        if earlier is None or earlier.resolve() == d.resolve():
            break
        stage_dir = target / "stages" / earlier.name
        stage_dir.mkdir(parents=True, exist_ok=True)
        for f in STAGE_FILES:
            if (earlier / f).is_file():
                replace_file(stage_dir / f, (earlier / f).read_bytes())
        written.append(stage_dir)
        d = earlier
    return written


def drop_stale_stages(target: Path, kept: list[Path]) -> None:
    """Remove the `stages/<run>/` folders of an earlier ship that the new weights did not continue, when they
    hold only what `ship_stages` writes (a folder with anything else is left, and named)."""
    root = target / "stages"
    if not root.is_dir():
        return
    keep = {d.resolve() for d in kept}
    for d in sorted(root.iterdir()):
        if d.resolve() in keep:
            continue
        if d.is_dir() and not d.is_symlink() and all(f.is_file() and f.name in STAGE_FILES for f in d.iterdir()):
            for f in d.iterdir():
                f.unlink()
            d.rmdir()
        else:
            print(f"left {d}: not a stage folder written by ship_stages", file=sys.stderr)


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit("usage: python -m sprout.training.ship RUN_DIR NAME")
    ship(sys.argv[1], sys.argv[2])
