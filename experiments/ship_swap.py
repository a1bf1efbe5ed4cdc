"""A demo's dictionaries switched as one set (issue 36): `saes/` is rebuilt in a staging folder beside it and
swapped in with one atomic step, so an interrupted `experiments.ship` (Ctrl-C, SIGKILL, a power cut) leaves
every dictionary old or every one new, never one missing and never a mix.

The transaction, under the lock of the demo's `saes/` folder (`sprout.files.folders.folder_lock`):

1. recover what a killed run left: `saes/` missing with its previous copy set aside (`.saes.old-*`, the
   fallback switch below killed half way) is put back; every staging or old folder is removed;
2. stage: `.saes.tmp-XXXXXXXX` gets the dictionaries that stay (hard links to their files: a dictionary is
   written by replacing its folder, never in place) and each new one (`SAE.save`, itself atomic);
3. switch: staging and `saes/` exchange names in one step (`exchange`, Linux's RENAME_EXCHANGE); where the
   system cannot, `saes/` moves aside and the staging folder moves in (step 1 repairs a kill between the two);
4. the previous set, now in the staging name, is removed.

A kill before step 3 leaves the old set (and a staging folder the next run removes); after it, the new set.
"""
from __future__ import annotations

import glob
import os
import shutil
import uuid
import warnings
from pathlib import Path
from typing import Any

from interp.saes.files import CFG, WEIGHTS
from sprout.files.folders import exchange, folder_lock, fsync_dir, remove_ours, uninterrupted

SAES = "saes"
# all shipped dictionaries of all demos together (per-layer and cross-layer): 8x skip transcoders on sprout-mini,
# and its 8x MLP-4 and MLP-6 transcoders without a skip (docs/features.md, "Eight d_model at MLP 6")
MAX_MB = 56
OWN = frozenset({CFG, WEIGHTS})  # the files of one dictionary's folder


def write_set(saes: Path, ready: list[tuple[Any, Path]]) -> list[Path]:
    """Write every dictionary of `ready` ((dictionary, its folder inside `saes`) pairs) into the demo's `saes`
    folder as one set: the dictionaries not in `ready` stay as they are.

    Returns:
        the folders written, in `ready`'s order.

    Raises:
        ValueError: a folder of `ready` is not directly inside `saes`.
    """
    saes = Path(saes)
    for _, folder in ready:
        if Path(folder).parent != saes:
            raise ValueError(f"{folder} is not a dictionary folder of {saes}")
    with folder_lock(saes, what="experiments.ship writing a demo's dictionaries"):
        recover(saes)
        stage = saes.with_name(f".{saes.name}.tmp-{uuid.uuid4().hex[:8]}")
        try:
            _stage(saes, stage, ready)
            with uninterrupted():  # a Ctrl-C between the fallback's renames waits for the switch to end
                _switch(stage, saes)
        finally:
            _remove_set(stage)  # the previous set once switched; the half-built one if not
    return [saes / Path(folder).name for _, folder in ready]


def shipped_mb(demos: Path) -> float:
    """The size in MiB of every dictionary shipped under `demos` (<demo>/saes/<dictionary>/*).

    Raises:
        SystemExit: over MAX_MB (what a pip install carries).
    """
    size = sum(f.stat().st_size for p in Path(demos).glob(f"*/{SAES}/*") for f in p.iterdir()) / 2**20
    if size > MAX_MB:
        raise SystemExit(f"the shipped dictionaries are {size:.1f} MB, over the {MAX_MB} MB budget: lower the expansion")
    return size


def _stage(saes: Path, stage: Path, ready: list[tuple[Any, Path]]) -> None:
    """The new set in `stage`: hard links to the dictionaries that stay, then each new one saved."""
    if saes.is_dir():
        shutil.copytree(saes, stage, symlinks=True, copy_function=_link_or_copy)
    else:
        stage.mkdir(parents=True)
    for sae, folder in ready:
        sae.save(stage / Path(folder).name)
    fsync_dir(stage)


def _switch(stage: Path, saes: Path) -> None:
    """`stage` becomes `saes` in one step; the previous set ends in `stage`'s name (removed by the caller)."""
    if not saes.exists():
        os.rename(stage, saes)
    elif not exchange(stage, saes):  # no atomic exchange here: two renames, a kill between repaired by recover()
        old = saes.with_name(f".{saes.name}.old-{uuid.uuid4().hex[:8]}")
        os.rename(saes, old)
        os.rename(stage, saes)
        os.rename(old, stage)
    fsync_dir(saes.parent)


def recover(saes: Path) -> None:
    """Repair what a killed run left beside `saes` (call it under the folder's lock): a missing set whose
    previous copy was moved aside comes back (with a warning); staging and old folders are removed."""
    olds = sorted(saes.parent.glob(f".{glob.escape(saes.name)}.old-*"))
    if not os.path.lexists(saes) and olds:
        os.rename(olds.pop(), saes)
        warnings.warn(f"{saes} was missing (experiments.ship killed while switching); its previous dictionaries "
                      "are back in place", stacklevel=2)
    for kind in ("tmp", "old"):
        for stale in saes.parent.glob(f".{glob.escape(saes.name)}.{kind}-*"):
            _remove_set(stale)


def _remove_set(folder: Path) -> None:
    """Remove a set of dictionary folders (and the temporary folders a killed `SAE.save` left in it), keeping
    anything that is not ours (`remove_ours` warns about it)."""
    if not folder.is_dir() or folder.is_symlink():
        return
    for entry in folder.iterdir():
        if entry.is_dir() and not entry.is_symlink():
            for inner in entry.iterdir():  # a dictionary's own write killed half way
                if inner.is_dir() and not inner.is_symlink():
                    remove_ours(inner, OWN)
            remove_ours(entry, OWN)
    remove_ours(folder, frozenset())


def _link_or_copy(src: str, dst: str) -> None:
    try:
        os.link(src, dst)
    except OSError:  # a file system without hard links
        shutil.copy2(src, dst)
