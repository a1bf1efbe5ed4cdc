"""Folders and files written whole: built beside their target, then renamed into place; nothing of the user's deleted.

A checkpoint or an exported Hugging Face folder is written into a temporary sibling and swapped in,
so a crash leaves the old folder or the new one, never half of one. The swap replaces an existing
folder only when it is provably ours: every entry is a plain file with a name we write, and the folder
carries our proof (a config.json or safetensors header only we write). Anything else (a project
folder with a config.json beside a thesis, a downloaded model with its README) is refused with the
list of what would have been lost. Old folders are emptied file by file, never with `rmtree`, so a
file that appears in one meanwhile survives. New folders get the user's umask. Writers of one folder
take turns: each holds the folder's lock (`folder_lock`, the `filelock` package; the lock files live in
the temporary folder, `lock_path`) from the check to the swap and the sweep of what killed writers
left, so two processes never delete each other's temporary folders or swap half-checked folders in.

A single file is written the same way by `replace_file`, the project's one atomic write (checkpoint
files, tuned lenses, run markers and logs, README tables, plotly.js).
"""
from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import signal
import tempfile
import threading
import uuid
import warnings
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO, Callable, Iterator, Union

from filelock import FileLock, Timeout

SHOWN = 12  # entries named in a refusal
Data = Union[bytes, Callable[[BinaryIO], None]]  # what a file is written from


LOCK_WAIT_S = 600.0  # how long a writer waits for another writer of the same folder


class FolderLocked(TimeoutError):
    """Another process holds a folder's lock (a writer that did not finish in time, or a run that uses it)."""


def lock_path(target: Union[str, os.PathLike], kind: str = "lock") -> Path:
    """The lock file of the folder `target` (`kind` "run.lock" for a run that uses it throughout): one per real
    path, in this user's lock folder under the temporary folder, so that nothing is left beside the user's
    folders and every name of one folder (a link, a relative path) finds the same lock."""
    real = os.path.realpath(os.path.join(os.path.realpath(Path(target).parent), Path(target).name))
    digest = hashlib.sha256(real.encode("utf-8", "surrogateescape")).hexdigest()[:24]
    user = os.getuid() if hasattr(os, "getuid") else os.environ.get("USERNAME", "user")
    return Path(tempfile.gettempdir()) / f"sprout-locks-{user}" / f"{digest}.{kind}"


@contextmanager
def folder_lock(target: Union[str, os.PathLike], wait: float = LOCK_WAIT_S, kind: str = "lock",
                what: str = "a writer") -> Iterator[Path]:
    """Hold the lock of the folder `target` (`lock_path`) for the block, waiting at most `wait` seconds (0: not at all).

    Raises:
        FolderLocked: another process held it all that time, naming the folder and the lock file.
    """
    path = lock_path(target, kind)
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    lock = FileLock(path, timeout=wait)
    try:
        lock.acquire()
    except Timeout:
        raise FolderLocked(f"{Path(target)} is in use: {what} in another process holds {path}"
                           + (f" (waited {wait:.0f} s)" if wait > 0 else "") + "; wait for it to end, or use another "
                           + ("file" if os.path.isfile(target) else "folder")) from None
    try:
        yield path
    finally:
        lock.release()


class NotOursError(FileExistsError, ValueError):
    """The target exists and is not a folder we wrote: replacing it would lose the user's files."""


def foreign(directory: Path, own: frozenset, proof: Callable[[Path], bool]) -> list[str]:
    """The entries of `directory` a replace would delete that are not provably ours (folders end in /)."""
    entries = sorted(os.listdir(directory))
    strange = [e + ("/" if (directory / e).is_dir() else "") for e in entries
               if e not in own or (directory / e).is_symlink() or not (directory / e).is_file()]
    if strange or not entries:
        return strange
    return [] if proof(directory) else entries


def check_replaceable(directory: Path, own: frozenset, proof: Callable[[Path], bool], what: str) -> None:
    """Raise NotOursError unless `directory` is absent, empty, or a `what` we wrote."""
    if not os.path.lexists(directory):
        return
    if not directory.is_dir():
        raise NotOursError(f"refusing to write {what} at {directory}: a file is there, not a folder")
    lost = foreign(directory, own, proof)
    if lost:
        names = ", ".join(lost[:SHOWN]) + (f" and {len(lost) - SHOWN} more" if len(lost) > SHOWN else "")
        raise NotOursError(f"refusing to replace {directory}: it is not {what} written here, and replacing it "
                           f"would delete {names}. Choose another folder, or move those files away first.")


def write_folder(directory: Union[str, os.PathLike], fill: Callable[[Path], None], own: frozenset, proof: Callable[[Path], bool],
                 what: str) -> Path:
    """Write a folder with `fill(tmp)` and swap it in at `directory`, replacing only a folder of ours.

    A symlink is followed: the folder it points to is replaced and the link kept.

    Returns:
        `directory` as given.
    """
    given = Path(directory)
    target = Path(os.path.realpath(given)) if given.is_symlink() else given
    check_replaceable(target, own, proof, what)
    with folder_lock(target, what=f"a writer of {what}"):
        return _write_locked(given, target, fill, own, proof, what)


def _write_locked(given: Path, target: Path, fill: Callable[[Path], None], own: frozenset, proof: Callable[[Path], bool],
                  what: str) -> Path:
    """`write_folder`'s work, under the folder's lock."""
    target.parent.mkdir(parents=True, exist_ok=True)
    _recover(target, own, proof)
    check_replaceable(target, own, proof, what)  # again: another writer may have finished meanwhile
    _remove_stale(target, own)  # under the lock, a temporary or old folder beside it is a killed writer's
    tmp = target.with_name(f".{target.name}.tmp-{uuid.uuid4().hex[:8]}")
    tmp.mkdir()  # mode 0o777 less the umask, unlike tempfile.mkdtemp's 0o700
    old = None
    try:
        fill(tmp)
        fsync_dir(tmp)
        if target.exists():
            check_replaceable(target, own, proof, what)  # again: it may have changed while we wrote
            if exchange(tmp, target):  # one step: `target` is never missing, `tmp` now holds the old folder
                old, tmp = tmp, target
            else:
                old = target.with_name(f".{target.name}.old-{uuid.uuid4().hex[:8]}")
                os.rename(target, old)
        if tmp != target:
            os.rename(tmp, target)
        fsync_dir(target.parent)
    except BaseException:
        if tmp != target:
            remove_ours(tmp, own)
        if old is not None and not target.exists():
            os.rename(old, target)  # put the previous folder back
        raise
    if old is not None:
        remove_ours(old, own)
    _remove_stale(target, own)
    return given


@contextmanager
def uninterrupted() -> Iterator[None]:
    """Hold Ctrl-C (SIGINT) until the block ends, then raise it: a group of writes that belong together (a
    demo's dictionaries) all land, or, interrupted before the block, none of them. The main thread only;
    elsewhere, or where SIGINT is ignored, the block runs as it is."""
    # a Ctrl-C already ignored (a shell script's background job) stays ignored: holding it would raise one
    if threading.current_thread() is not threading.main_thread() or signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        yield
        return
    caught: list[int] = []
    previous = signal.signal(signal.SIGINT, lambda signum, frame: caught.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
    if caught:
        raise KeyboardInterrupt("interrupted while writing; every write of the group finished first")


_RENAME_EXCHANGE, _AT_FDCWD = 2, -100


def exchange(a: Path, b: Path) -> bool:
    """Swap two existing paths in one atomic step (Linux's renameat2 with RENAME_EXCHANGE); False where the
    system or the file system cannot (the caller then renames twice)."""
    rename2 = getattr(_libc(), "renameat2", None)
    if rename2 is None:
        return False
    return rename2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0


@functools.lru_cache(maxsize=1)
def _libc() -> object:
    try:
        return ctypes.CDLL(None, use_errno=True)
    except OSError:  # no C library to ask (not Linux or macOS)
        return None


def remove_ours(folder: Path, own: frozenset) -> None:
    """Delete the files named in `own`, then the folder if that left it empty; keep anything else."""
    if not folder.is_dir() or folder.is_symlink():
        return
    for name in own:
        path = folder / name
        if path.is_file() and not path.is_symlink():
            path.unlink()
    try:
        folder.rmdir()
    except OSError:
        warnings.warn(f"kept {folder}: it holds files we did not write ({', '.join(sorted(os.listdir(folder)))})",
                      stacklevel=3)


def _remove_stale(target: Path, own: frozenset) -> None:
    """Temporary and old folders a killed write left beside `target`, when they hold only our files."""
    for kind in ("tmp", "old"):
        for stale in target.parent.glob(f".{_glob_escape(target.name)}.{kind}-*"):
            if stale.is_dir() and not stale.is_symlink() and not foreign(stale, own, lambda _: True):
                remove_ours(stale, own)


def _recover(target: Path, own: frozenset, proof: Callable[[Path], bool]) -> None:
    """A writer killed between moving the old folder aside and moving the new one in left `target` missing:
    put the old one back (a complete folder of ours), so a sweep of stale folders does not lose it."""
    if os.path.lexists(target):
        return
    for old in sorted(target.parent.glob(f".{_glob_escape(target.name)}.old-*")):
        if old.is_dir() and not old.is_symlink() and not foreign(old, own, proof):
            os.rename(old, target)
            warnings.warn(f"{target} was missing (a write killed half way); its previous copy is back in place",
                          stacklevel=4)
            return


def _glob_escape(name: str) -> str:
    return "".join(f"[{c}]" if c in "*?[" else c for c in name)


def replace_file(path: Union[str, os.PathLike], data: Data) -> Path:
    """The one atomic write: `data` goes to a temporary sibling (`temp_sibling`), is fsynced, and is renamed
    over `path` (mode 0o666 less the umask). A crash leaves the old file or the new one, never half of one.

    Args:
        path: the file to write or replace.
        data: its bytes, or a function that writes them into the binary file object it is given
            (`lambda f: torch.save(state, f)`).

    Returns:
        `path`.
    """
    path = Path(path)
    tmp = temp_sibling(path)
    try:
        write_bytes(tmp, data)
        os.replace(tmp, path)
        fsync_dir(path.parent)
    finally:
        if os.path.lexists(tmp):
            tmp.unlink()
    return path


def temp_sibling(path: Path) -> Path:
    """Where `replace_file` writes before the rename: `.NAME.tmp-XXXXXXXX` beside `path`."""
    return path.with_name(f".{path.name}.tmp-{uuid.uuid4().hex[:8]}")


def is_temp_sibling(entry: str, name: str) -> bool:
    """Whether the folder entry `entry` is a temporary sibling of the file `name` (a write killed half way)."""
    prefix = f".{name}.tmp-"
    rest = entry[len(prefix):]
    return entry.startswith(prefix) and len(rest) == 8 and all(c in "0123456789abcdef" for c in rest)


def write_bytes(path: Path, data: Data) -> None:
    """Write and fsync a file (its mode is 0o666 less the umask): `data` is bytes, or a function that
    writes into the binary file object it is given."""
    with open(path, "wb") as f:
        if callable(data):
            data(f)
        else:
            f.write(data)
        f.flush()
        os.fsync(f.fileno())


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
