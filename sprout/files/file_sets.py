"""Files of one folder that belong together (a tuned lens' weights and the JSON that hashes them), switched
as one: a reader finds all old or all new, even after a writer killed at any point (issue 36).

`replace_files` writes every new file into a staging folder beside them, renames that folder to the
switch folder (`.<first name>.switch`: the one atomic step that commits the set), then moves the files
out of it one by one into place. A writer killed before the commit leaves the old set (and a staging
folder, removed by the next write); killed after it, the set is new: `current_file` reads each file from
the switch folder while it is still there, and the next write finishes the moves first. Writers take
turns under the first file's lock (`folder_lock`).
"""
from __future__ import annotations

import os
import uuid
from pathlib import Path

from .folders import folder_lock, fsync_dir, remove_ours, write_bytes


def switch_folder(first: Path) -> Path:
    """The folder that holds a committed set until its files are in place (named after the set's first file)."""
    return first.with_name(f".{first.name}.switch")


def current_file(path: Path, first: Path) -> Path:
    """Where a reader finds `path` of the set whose first file is `first`: in the switch folder while a
    committed switch is unfinished (a writer killed), else `path` itself."""
    pending = switch_folder(first) / path.name
    return pending if pending.is_file() and not pending.is_symlink() else path


def replace_files(files: dict[Path, bytes]) -> list[Path]:
    """Replace the files of one folder together: `files` maps each path to its new bytes (the first path
    names the set: its lock and its switch folder).

    Returns:
        the paths written.

    Raises:
        ValueError: no files, or files in more than one folder.
    """
    paths = [Path(p) for p in files]
    if not paths or len({p.parent for p in paths}) != 1:
        raise ValueError(f"replace_files writes one or more files of one folder, got {paths}")
    first = paths[0]
    with folder_lock(first, what="a writer of these files"):
        finish(first)
        stage = first.with_name(f".{first.name}.stage-{uuid.uuid4().hex[:8]}")
        stage.mkdir()
        try:
            for path in paths:
                write_bytes(stage / path.name, files[path])
            fsync_dir(stage)
            os.rename(stage, switch_folder(first))  # the commit: from here on the set is the new one
        except BaseException:
            remove_ours(stage, frozenset(p.name for p in paths))
            raise
        fsync_dir(first.parent)
        finish(first)
    return paths


def finish(first: Path) -> None:
    """Complete a committed switch (move what is left in the switch folder into place) and remove staging
    folders a killed writer left; call it under the set's lock."""
    switch = switch_folder(first)
    if switch.is_dir() and not switch.is_symlink():
        for entry in sorted(os.listdir(switch)):
            if (switch / entry).is_file() and not (switch / entry).is_symlink():
                os.replace(switch / entry, first.parent / entry)
        fsync_dir(first.parent)
        remove_ours(switch, frozenset())
    for stale in first.parent.glob(f".{first.name}.stage-*"):
        if stale.is_dir() and not stale.is_symlink():
            remove_ours(stale, frozenset(os.listdir(stale)))
