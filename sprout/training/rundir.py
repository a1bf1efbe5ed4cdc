"""The run directory: what `sprout train --out DIR` writes, and the rules that keep a user's files safe.

    OUT/run.json                  the marker that makes OUT a run directory: the data stamp and tokenizer
    OUT/run.lock                  an exclusive OS lock (filelock's: flock, or Windows' msvcrt) held for the whole run; holds the PID
    OUT/recipe.json               the recipe
    OUT/train_log.csv             one row per evaluation
    OUT/checkpoints/step_XXXXXXXX/  config.json, model.safetensors, tokenizer.json (sprout.files.checkpoint.save)
                                  trainer.pt (optimizer, step, every RNG state; weights_only-safe)
    OUT/data/                     the tokenised-data cache, unless --data-cache says elsewhere

A new run starts only in an absent or empty folder, or in a run directory without checkpoints; `--resume`
continues only a run directory. The lock is the kernel's, so a killed process (even by SIGKILL) never
leaves a stale one. Checkpoints are complete or absent (written under a temporary name, then renamed),
and pruning deletes only the files a checkpoint is made of.
"""
from __future__ import annotations

import csv
import io
import json
import os
import random
import shutil
import warnings
from pathlib import Path
from typing import Optional, Union

import numpy as np
import torch
from filelock import FileLock, Timeout
from tokenizers import Tokenizer

from ..files import is_temp_sibling, latest_checkpoint, load_tokenizer, read_json_file, regular_file, replace_file, write_bytes
from .recipes import Recipe

MARKER, LOCK, RECIPE, LOG = "run.json", "run.lock", "recipe.json", "train_log.csv"
FORMAT = "sprout-run"
OURS = {MARKER, LOCK, RECIPE, LOG, "checkpoints", "data", MARKER + ".tmp", LOG + ".tmp"}  # *.tmp: older versions'
CHECKPOINT_FILES = ("config.json", "model.safetensors", "tokenizer.json", "trainer.pt")
LOG_COLUMNS = ["step", "tokens", "lr", "train_loss", "val_loss", "rep_first", "rep_second", "elapsed_s"]
KEEP_LAST = 2  # non-snapshot checkpoints kept
SHOWN = 8  # entries named in a refusal


class RunDirError(ValueError):
    """--out is not a place a run may write, or --resume has nothing of ours to continue."""


class RunLocked(RunDirError):
    """Another process holds the run directory's lock."""


def _ours(entries: set[str]) -> set[str]:
    """`entries` without what a write killed half way left (`replace_file`'s temporary run.json or log)."""
    return {e for e in entries if not (is_temp_sibling(e, MARKER) or is_temp_sibling(e, LOG))}


def _listing(folder: Path, names) -> str:
    names = sorted(n + ("/" if (folder / n).is_dir() else "") for n in names)
    return ", ".join(names[:SHOWN]) + (f" and {len(names) - SHOWN} more" if len(names) > SHOWN else "")


class RunDir:
    """One run directory. `open()` checks it, creates it and takes its lock; `close()` releases the lock.

    Args:
        path: the `--out` folder.
    """

    def __init__(self, path: Union[str, os.PathLike]) -> None:
        if str(path).strip() == "":
            raise RunDirError("--out is empty: name a folder for the run (e.g. runs/gpt-4)")
        self.path = Path(path)
        self._lock: Optional[FileLock] = None

    # --- paths
    @property
    def recipe_path(self) -> Path:
        return self.path / RECIPE

    @property
    def log_path(self) -> Path:
        return self.path / LOG

    @property
    def checkpoints(self) -> Path:
        return self.path / "checkpoints"

    def latest(self) -> Optional[Path]:
        return latest_checkpoint(self.path)

    # --- what the folder is
    def marker(self) -> Optional[dict]:
        """run.json's contents if it is ours, else None."""
        try:
            marker = read_json_file(self.path / MARKER)
        except (OSError, ValueError):
            return None
        return marker if isinstance(marker, dict) and marker.get("format") == FORMAT else None

    def _is_legacy_run(self) -> bool:
        # A run written before run.json existed: only our names, a recipe and a checkpoint with trainer.pt.
        last = self.latest()
        return (_ours(set(os.listdir(self.path))) <= OURS and self.recipe_path.is_file() and last is not None
                and (last / "trainer.pt").is_file())

    def is_run(self) -> bool:
        return self.path.is_dir() and (self.marker() is not None or self._is_legacy_run())

    def _check_folder(self) -> None:
        if os.path.lexists(self.path) and not self.path.is_dir():
            raise RunDirError(f"--out {self.path} is a file, not a folder: choose a folder for the run")

    def check_new(self) -> None:
        """Refuse a folder that holds anything but an unfinished run of ours (nothing is written)."""
        self._check_folder()
        if not self.path.exists():
            return
        entries = set(os.listdir(self.path))
        if _ours(entries) <= {LOCK, MARKER + ".tmp"}:  # empty, or a run killed as it began
            return
        if not self.is_run():
            raise RunDirError(f"--out {self.path} is not empty and is not a sprout run directory (it holds "
                              f"{_listing(self.path, entries)}); nothing was written: choose a new or empty folder")
        if self.latest() is not None:
            raise RunDirError(f"{self.path} already holds checkpoints: pass --resume to continue, or use a new --out")

    def check_resume(self) -> Path:
        """The checkpoint to continue from; refuse anything that is not a run directory with one."""
        self._check_folder()
        if not self.path.is_dir():
            raise RunDirError(f"--resume: {self.path} does not exist: there is no run to continue")
        if not self.is_run():
            raise RunDirError(f"--resume: {self.path} is not a sprout run directory (no {MARKER} of ours, holds "
                              f"{_listing(self.path, os.listdir(self.path)) or 'nothing'}); nothing was written")
        last = self.latest()
        if last is None:
            raise RunDirError(f"--resume: {self.path} holds no complete checkpoint to resume from")
        return last

    # --- the lock
    def lock(self) -> None:
        """Take the run's exclusive lock, or fail at once naming the process that holds it."""
        lock = FileLock(self.path / LOCK, timeout=0, mode=0o644, thread_local=False, preserve_lock_file=True,
                        on_acquired=_write_pid)
        try:
            lock.acquire()
        except Timeout:
            holder = _read_pid(self.path / LOCK)
            raise RunLocked(f"{self.path} is in use: another sprout train (PID {holder}) is running there and holds "
                            f"{self.path / LOCK}; wait for it to end, or use another --out") from None
        self._lock = lock

    def open(self, resume: bool) -> None:
        """Check the folder for a new run or a resume, create it, and lock it for the whole run."""
        self.check_resume() if resume else self.check_new()
        self.path.mkdir(parents=True, exist_ok=True)
        self.lock()
        try:  # again, under the lock: another process may have started here meanwhile
            self.check_resume() if resume else self.check_new()
            entries = set(os.listdir(self.path))
            for stale in entries - _ours(entries):
                os.remove(self.path / stale)  # a killed run's half-written run.json or log
            if not resume:
                self.write_marker(None, None)
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        if self._lock is not None:
            self._lock.release()
            self._lock = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # --- what the run was made from
    def write_marker(self, stamp: Optional[dict], tokenizer: Optional[dict]) -> None:
        marker = {"format": FORMAT, "version": 1, "data": stamp, "tokenizer": tokenizer}
        replace_file(self.path / MARKER, (json.dumps(marker, indent=2) + "\n").encode())

    def read_recipe(self) -> Recipe:
        try:
            return Recipe.from_dict(read_json_file(self.recipe_path, "recipe"))
        except FileNotFoundError:
            raise RunDirError(f"--resume: {self.recipe_path} is missing: the run's recipe is unknown") from None
        except (OSError, ValueError, RecursionError, TypeError) as e:
            raise RunDirError(f"--resume: {self.recipe_path} is unreadable or not a recipe ({e})") from None


# --- checkpoints -------------------------------------------------------------------------------------

def step_dir(root: Path, step: int) -> Path:
    return root / f"step_{step:08d}"


def remove_checkpoint(folder: Path) -> None:
    """Delete a checkpoint's own files, then the folder if that emptied it; anything else stays."""
    for name in CHECKPOINT_FILES:
        path = folder / name
        if path.is_file() and not path.is_symlink():
            os.remove(path)
    try:
        os.rmdir(folder)
    except OSError:
        warnings.warn(f"kept {folder}: it holds files a checkpoint is not made of "
                      f"({_listing(folder, os.listdir(folder))})", stacklevel=2)


def prune(root: Path, keep: set[int]) -> None:
    """Delete all but the last KEEP_LAST checkpoints whose steps are not in `keep`."""
    steps = sorted(int(d.name[5:]) for d in root.glob("step_*") if d.name[5:].isdigit())
    ordinary = [s for s in steps if s not in keep]
    for s in ordinary[:-KEEP_LAST]:
        remove_checkpoint(step_dir(root, s))


def write_trainer_state(path: Path, state: dict) -> None:
    write_bytes(path, lambda f: torch.save(state, f))


def publish(tmp: Path, final: Path) -> None:
    """Rename a complete checkpoint into place, replacing only a checkpoint of ours at that step."""
    if final.exists():
        strange = set(os.listdir(final)) - set(CHECKPOINT_FILES)
        if strange:
            raise RunDirError(f"refusing to replace {final}: it holds {_listing(final, strange)}, which a "
                              "checkpoint is not made of; move them away and --resume")
        remove_checkpoint(final)
    os.rename(tmp, final)


def clear_partial(tmp: Path) -> None:
    shutil.rmtree(tmp, ignore_errors=True)  # `.step_XXXXXXXX.partial`: a name only we write


def read_trainer_state(step: Path) -> dict:
    path = step / "trainer.pt"
    if not path.is_file():
        raise RunDirError(f"cannot resume from {step}: {path} is missing (the optimizer and RNG state)")
    try:
        return torch.load(regular_file(path, "trainer state"), map_location="cpu", weights_only=True)
    except Exception as e:  # torch raises RuntimeError, pickle errors, EOFError... for a damaged file
        raise RunDirError(f"cannot resume from {step}: {path} is unreadable (truncated or corrupt?): "
                          f"{str(e).splitlines()[0] if str(e) else type(e).__name__}") from None


def checkpoint_tokenizer(step: Path) -> Optional[Tokenizer]:
    path = step / "tokenizer.json"
    return load_tokenizer(path) if path.is_file() else None


# --- the log -----------------------------------------------------------------------------------------

def read_log(path: Path, upto: Optional[int] = None) -> list[dict]:
    if not path.is_file():
        return []
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    return [r for r in rows if upto is None or int(r["step"]) <= upto]


def write_log(path: Path, rows: list[dict]) -> None:
    text = io.StringIO(newline="")
    w = csv.DictWriter(text, LOG_COLUMNS)
    w.writeheader()
    w.writerows(rows)
    replace_file(path, text.getvalue().encode())


def rng_state(batch_gen: torch.Generator) -> dict:
    """Every random state a run draws from (torch, its batch generator, Python, numpy), for a checkpoint."""
    np_state = np.random.get_state()
    assert isinstance(np_state, tuple)  # numpy's legacy form, the default
    return {
        "torch": torch.get_rng_state(),
        "batch": batch_gen.get_state(),
        "python": random.getstate(),
        # numpy's state holds an ndarray, which weights_only refuses; keep it as a tensor
        "numpy": [np_state[0], torch.from_numpy(np_state[1].astype(np.int64)), *np_state[2:]],
    }


def set_rng_state(state: dict, batch_gen: torch.Generator) -> None:
    """Restore what `rng_state` saved, so a resumed run draws what the uninterrupted one would have."""
    torch.set_rng_state(state["torch"])
    batch_gen.set_state(state["batch"])
    random.setstate(state["python"])
    name, keys, *rest = state["numpy"]
    np.random.set_state((name, keys.numpy().astype(np.uint32), *rest))


def _write_pid(fd: int) -> None:
    """Put this process's PID in the lock file just locked (what a refused second run names)."""
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)


def _read_pid(path: Path) -> str:
    try:
        with open(path, "rb") as f:
            return f.read(32).decode(errors="replace").strip() or "unknown"
    except OSError:
        return "unknown"
