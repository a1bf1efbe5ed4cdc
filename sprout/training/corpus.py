"""Training text as token files: user corpora or generated stories, tokenised once and cached by content.

Pipeline: `read_text` (a user's files) or `sprout.material.generate_corpus` -> `sprout.tokenizer.train_bpe`
-> `build_token_files` (train.bin / val.bin, uint16) -> `get_batch`, random windows drawn with a
`torch.Generator`, so a run resumes bit-exactly by restoring the generator's state. `prepare_data` keys
the cache by `data_stamp`: every input file's name, size and SHA-256 plus the tokenizer settings, so a
file rewritten in place is a new corpus, never a stale cache.
"""
from __future__ import annotations

import hashlib
import itertools
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Union

import numpy as np
import torch
from jaxtyping import Int
from tokenizers import Tokenizer

from ..files import file_in, latest_checkpoint, load_tokenizer, regular_file, remove_ours, save_tokenizer
from ..material import generate_corpus
from ..tokenizer import char_tokenizer, encode, is_char_level, train_bpe
from .english import english_stamp, is_english, package_files, parse_data
from .recipes import Recipe, recipe_corpus

MAX_TEXT_BYTES = 1 << 30  # the most text a run reads into memory (1 GiB): BPE training holds it all
HF_MARKERS = ("dataset_info.json", "state.json", "dataset_dict.json")  # a `datasets.save_to_disk` folder
_BLOCK = 1 << 20


# ----------------------------------------------------------------------------- user corpora

def input_files(path: Union[str, Path]) -> list[Path]:
    """The files a `--data` path stands for: the file itself, a folder's `.txt` files (sorted), or every
    file of a saved Hugging Face dataset. Each must be a regular file (not a device or a pipe, which
    could be endless), and together they must hold at most `MAX_TEXT_BYTES`.

    Raises:
        ValueError: naming the path that is missing, not a regular file, or too large.
    """
    path = Path(path)
    if not path.exists():
        raise ValueError(f"--data: no such file or folder: {path}")
    if path.is_dir():
        if any((path / m).exists() for m in HF_MARKERS):
            files = sorted(p for p in path.rglob("*") if not p.is_dir())
        else:
            files = sorted(path.glob("*.txt"))
            if not files:
                raise ValueError(f"--data: {path} is a folder with no .txt files and no saved dataset")
    else:
        files = [path]
    try:  # the project's file contract: regular files, inside the folder given
        files = [file_in(path, f.relative_to(path), "text file") if path.is_dir() else regular_file(f, "text file")
                 for f in files]
    except (OSError, ValueError) as e:
        raise ValueError(f"--data: {e}; give text files") from None
    total = sum(f.stat().st_size for f in files)
    if total > MAX_TEXT_BYTES:
        raise ValueError(f"--data: {path} holds {total / 2**20:.0f} MiB of text, over the limit of "
                         f"{MAX_TEXT_BYTES / 2**20:.0f} MiB that one run reads into memory")
    return files


def _read_bounded(path: Path) -> bytes:
    """The file's bytes, refusing one that turns out longer than `MAX_TEXT_BYTES` (its size can lie, as in /proc)."""
    with open(path, "rb") as f:
        data = f.read(MAX_TEXT_BYTES + 1)
    if len(data) > MAX_TEXT_BYTES:
        raise ValueError(f"--data: {path} is longer than the limit of {MAX_TEXT_BYTES / 2**20:.0f} MiB")
    return data


def _read_file(path: Path) -> str:
    data = _read_bounded(path)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"{path} is not UTF-8 text: byte 0x{data[e.start]:02x} at byte offset "
                         f"{e.start} ({e.reason})") from None
    return text[1:] if text.startswith("\ufeff") else text  # drop a byte-order mark


def _read_hf_dataset(path: Path) -> list[str]:
    # `datasets` costs most of a second to import and only a saved dataset needs it, so it is the one
    # import that waits until it is used.
    import datasets

    ds = datasets.load_from_disk(str(path))
    if isinstance(ds, datasets.DatasetDict):
        if "train" not in ds and len(ds) != 1:
            raise ValueError(f"{path} holds splits {list(ds)}; expected 'train' or a single split")
        ds = ds["train"] if "train" in ds else next(iter(ds.values()))
    if "text" not in ds.column_names:
        raise ValueError(f"{path} has no 'text' column (columns: {ds.column_names})")
    return [t for t in ds["text"] if t and t.strip()]


def read_text(path: Union[str, Path]) -> str:
    """Reads a user corpus as one str, documents separated by "\\n\\n".

    Args:
        path: a UTF-8 text file; a folder of `.txt` files (read in sorted order, empty ones
            skipped); or a Hugging Face `datasets` folder written by `save_to_disk` (its `text`
            column, the 'train' split of a DatasetDict).

    Raises:
        ValueError: for a missing path, a device or pipe, more than `MAX_TEXT_BYTES`, a file that is
            not UTF-8 (naming the file and the byte offset), or an input with no text.
    """
    path = Path(path)
    files = input_files(path)
    if not path.is_dir():
        text = _read_file(path)
        if not text.strip():
            raise ValueError(f"{path} is empty: there is no text to train on")
        return text
    if any((path / m).exists() for m in HF_MARKERS):
        docs = _read_hf_dataset(path)
    else:
        docs = [t for t in map(_read_file, files) if t.strip()]
    if not docs:
        raise ValueError(f"{path} holds no text: every document is empty")
    return "\n\n".join(docs)


def _sha256(path: Path) -> str:
    h, n = hashlib.sha256(), 0
    with open(path, "rb") as f:
        while block := f.read(_BLOCK):
            h.update(block)
            n += len(block)
            if n > MAX_TEXT_BYTES:
                raise ValueError(f"--data: {path} is longer than the limit of {MAX_TEXT_BYTES / 2**20:.0f} MiB")
    return h.hexdigest()


def data_stamp(recipe: Recipe) -> dict:
    """What a run's token files depend on: the tokenizer settings, and every input file's name (relative to
    `--data`), size and SHA-256, or the story generator's settings."""
    stamp = settings_stamp(recipe)
    if is_english(recipe.data):
        stamp["files"] = english_stamp(parse_data(recipe.data))
    elif recipe.data:
        root = Path(recipe.data)
        stamp["files"] = [{"name": str(f.relative_to(root)) if root.is_dir() else f.name,
                           "size": f.stat().st_size, "sha256": _sha256(f)} for f in input_files(root)]
    return stamp


def settings_stamp(recipe: Recipe) -> dict:
    """`data_stamp` without the input files: the recipe's data and tokenizer settings."""
    stamp = {k: getattr(recipe, k) for k in ("data", "tokenizer", "corpus_chars", "corpus_seed", "val_fraction")}
    if recipe.tokenizer == "bpe":
        stamp["vocab_size"] = recipe.vocab_size
    if recipe.init:  # a second stage reads its text with the first stage's tokenizer
        stamp["tokenizer_from"] = _sha256(init_checkpoint(recipe) / "tokenizer.json")
    if is_english(recipe.data):  # the stories' size follows from story_fraction; the seed also shuffles
        del stamp["corpus_chars"]
        stamp["story_fraction"] = recipe.story_fraction
    elif recipe.data:
        del stamp["corpus_chars"], stamp["corpus_seed"]
    return stamp


def init_checkpoint(recipe: Recipe) -> Path:
    """The checkpoint --init names: a checkpoint folder, or a run folder's latest checkpoint."""
    path = Path(recipe.init)
    last = latest_checkpoint(path) if (path / "checkpoints").is_dir() else path
    if last is None or not (last / "tokenizer.json").is_file():
        raise ValueError(f"recipe field init (--init): no checkpoint with a tokenizer.json at {recipe.init!r}")
    return last


def _tokenizer(recipe: Recipe, text: str) -> Tokenizer:
    """--init's tokenizer, else one learned from the text (BPE) or its characters."""
    if recipe.init:
        return load_tokenizer(init_checkpoint(recipe) / "tokenizer.json")
    return train_bpe(text, recipe.vocab_size) if recipe.tokenizer == "bpe" else char_tokenizer(text)


def stamp_changes(old: dict, new: dict) -> list[str]:
    """What differs between two `data_stamp`s, in words (empty if nothing)."""
    changes = [f"{k}: {old.get(k)!r} -> {new.get(k)!r}" for k in sorted(set(old) | set(new) - {"files"})
               if old.get(k) != new.get(k)]
    before = {f["name"]: f for f in old.get("files", [])}
    after = {f["name"]: f for f in new.get("files", [])}
    for name in sorted(set(before) | set(after)):
        a, b = before.get(name), after.get(name)
        if a is None:
            changes.append(f"{name} was added")
        elif b is None:
            changes.append(f"{name} was removed")
        elif a != b:
            changes.append(f"{name} changed ({a['size']} -> {b['size']} bytes, new content)")
    return changes


# ----------------------------------------------------------------------------- the cache

@dataclass
class TokenData:
    """A run's tokenised corpus: its tokenizer, the train/val token memmaps and the stamp they were made from."""

    tokenizer: Tokenizer
    train: np.ndarray
    val: np.ndarray
    stamp: dict
    folder: Path


def prepare_data(recipe: Recipe, cache_root: Union[str, Path], stamp: Optional[dict] = None) -> TokenData:
    """Tokenizer and train/val token files for this recipe, built once and cached by `data_stamp`.

    The folder is built under a temporary name and renamed when complete, so a crash never leaves a
    half-built cache that a later run would trust. `stamp`: the recipe's `data_stamp`, if already made.
    """
    cache_root = Path(cache_root)
    stamp = stamp or data_stamp(recipe)
    digest = hashlib.sha1(json.dumps(stamp, sort_keys=True).encode()).hexdigest()[:12]
    kind = "english" if is_english(recipe.data) else "text" if recipe.data else "stories"
    folder = cache_root / f"{kind}-{recipe.tokenizer}-{digest}"
    if not (folder / "done.json").is_file():
        _build_cache(recipe, stamp, cache_root, folder)
    return TokenData(load_tokenizer(folder / "tokenizer.json"),
                     np.memmap(folder / "train.bin", dtype=np.uint16, mode="r"),
                     np.memmap(folder / "val.bin", dtype=np.uint16, mode="r"), stamp, folder)


CACHE_FILES = frozenset({"train.bin", "val.bin", "tokenizer.json", "done.json"})


def check_data(recipe: Recipe) -> None:
    """Fails fast, before a run directory is made: a missing, endless or huge --data file, or an English
    source whose package is not installed (saying what to install)."""
    if is_english(recipe.data):
        for source in parse_data(recipe.data):
            package_files(source)
    elif recipe.data:
        input_files(recipe.data)


def _english_token_files(recipe: Recipe, tmp: Path):
    """The packaged English corpus: each source held out on its own (`english_corpus`); BPE learns the train text."""
    corpus = recipe_corpus(recipe)
    val = "\n\n".join(corpus.val.values())
    tok = _tokenizer(recipe, corpus.train if recipe.tokenizer == "bpe" else corpus.train + val)
    tmp.mkdir(parents=True, exist_ok=True)
    _write_tokens(corpus.train, tok, tmp / "train.bin", 1 << 20)
    _write_tokens(val, tok, tmp / "val.bin", 1 << 20)
    return tok


def _build_cache(recipe: Recipe, stamp: dict, cache_root: Path, folder: Path) -> None:
    tmp = cache_root / f".{folder.name}.tmp-{os.getpid()}"
    remove_ours(tmp, CACHE_FILES)
    if is_english(recipe.data):
        tok = _english_token_files(recipe, tmp)
    else:
        text = read_text(recipe.data) if recipe.data else generate_corpus(recipe.corpus_chars, recipe.corpus_seed)
        tok = _tokenizer(recipe, text)
        build_token_files(text, tok, tmp, val_fraction=recipe.val_fraction)
    save_tokenizer(tok, tmp / "tokenizer.json")
    (tmp / "done.json").write_text(json.dumps(stamp, indent=2) + "\n")
    if folder.exists():  # a half-built folder from a crash: replace it (only the files a cache holds)
        remove_ours(folder, CACHE_FILES)
    os.rename(tmp, folder)


# ----------------------------------------------------------------------------- token files

# Cut only where a non-space meets a space or a newline: the byte-level pre-tokenizer always splits
# there, so encoding the pieces gives exactly the ids of encoding the whole text at once.
_CUT = re.compile(r"\S[ \n]")


def _split_point(text: str, frac: float) -> tuple[int, int]:
    """(end of train, start of val): at the story boundary ("\\n\\n") nearest the target."""
    target = int(len(text) * (1 - frac))
    before, after = text.rfind("\n\n", 0, target + 2), text.find("\n\n", target + 1)
    candidates = [i for i in (before, after) if 0 < i < len(text) - 2]
    if not candidates:  # one long document: cut at whitespace instead
        m = _CUT.search(text, target)
        i = m.start() + 1 if m else target
        return i, i
    i = min(candidates, key=lambda c: abs(c - target))
    return i, i + 2


def _chunks(text: str, size: int):
    start = 0
    while start < len(text):
        end = start + size
        if end < len(text):
            m = _CUT.search(text, end)
            end = m.start() + 1 if m else len(text)
        yield text[start:end]
        start = end


def _write_tokens(text: str, tok, path: Path, chunk_chars: int) -> None:
    pieces = _chunks(text, chunk_chars)
    with open(path, "wb") as f:
        while batch := list(itertools.islice(pieces, 16)):  # 16 chunks at a time, on all cores
            for enc in tok.encode_batch(batch, add_special_tokens=False):
                np.asarray(enc.ids, dtype=np.uint16).tofile(f)


def build_token_files(text: str, tokenizer: Tokenizer, out_dir: Union[str, Path], val_fraction: float = 0.1,
                      chunk_chars: int = 1 << 20) -> tuple[Path, Path]:
    """Tokenises `text` once into `out_dir/train.bin` and `out_dir/val.bin` (flat np.uint16).

    The split falls on the story boundary ("\\n\\n") nearest `1 - val_fraction` of the text; the
    text is encoded in chunks of about `chunk_chars` characters, so memory stays bounded.

    Returns:
        (train_path, val_path).

    Raises:
        ValueError: if the vocabulary does not fit in uint16, `val_fraction` is not in [0, 1), the
            text is empty, or (character tokenizer) it holds characters outside the vocabulary.
    """
    vocab = tokenizer.get_vocab_size()
    if vocab > 1 << 16:
        raise ValueError(f"vocabulary of {vocab} tokens does not fit in uint16 (at most 65536)")
    if not 0 <= val_fraction < 1:
        raise ValueError(f"val_fraction must be in [0, 1), got {val_fraction}")
    if not text:
        raise ValueError("the text is empty: there is nothing to tokenise")
    if is_char_level(tokenizer):
        encode(tokenizer, "".join(set(text)))  # fails early, naming characters outside the vocab
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    end, start = _split_point(text, val_fraction) if val_fraction > 0 else (len(text), len(text))
    train_path, val_path = out_dir / "train.bin", out_dir / "val.bin"
    _write_tokens(text[:end], tokenizer, train_path, chunk_chars)
    _write_tokens(text[start:], tokenizer, val_path, chunk_chars)
    return train_path, val_path


def _check_length(n: int, context: int, where: str) -> None:
    if n < context + 1:
        raise ValueError(f"corpus smaller than one batch: {where} has {n} tokens, but a window "
                         f"needs context + 1 = {context + 1}; give it more text or use a smaller context")


def check_windows(data: np.ndarray, context: int) -> None:
    """Raise a ValueError naming the file if `data` (a token file's memmap, or any 1-D array) is too
    short for one window of context + 1 tokens."""
    _check_length(len(data), context, getattr(data, "filename", None) or "the token array")


def get_batch(data: np.ndarray, batch_size: int, context: int,
              generator: torch.Generator) -> tuple[Int[torch.Tensor, "batch pos"], Int[torch.Tensor, "batch pos"]]:
    """Random windows of a token array: inputs and the next-token targets.

    Args:
        data: the tokens, a 1-D array (e.g. the np.memmap of a .bin file).
        batch_size: B, the number of windows.
        context: T, the window length.
        generator: draws the window starts; restoring its state replays the same batches.

    Returns:
        (x, y), int64 tensors of shape [B, T], with y[:, t] = the token after x[:, t].
    """
    check_windows(data, context)
    ix = torch.randint(len(data) - context, (batch_size,), generator=generator).tolist()
    xy = torch.from_numpy(np.stack([data[i:i + context + 1] for i in ix]).astype(np.int64))
    return xy[:, :-1], xy[:, 1:]


class TokenDataset:
    """A uint16 token file (from `build_token_files`), read through a memmap.

    Args:
        path: the .bin file.
        context: T, the window length of the batches.
    """

    def __init__(self, path: Union[str, Path], context: int) -> None:
        self.path, self.context = Path(path), context
        if not os.path.lexists(self.path):
            raise ValueError(f"no token file at {self.path}")
        n = regular_file(self.path, "token file").stat().st_size // 2
        _check_length(n, context, str(self.path))  # also keeps np.memmap off an empty file
        self.data = np.memmap(self.path, dtype=np.uint16, mode="r", shape=(n,))

    def __len__(self) -> int:
        return len(self.data)

    def batch(self, batch_size: int, generator: torch.Generator) -> tuple[Int[torch.Tensor, "batch pos"], Int[torch.Tensor, "batch pos"]]:
        """(x, y), int64 [batch_size, context]; see `get_batch`."""
        return get_batch(self.data, batch_size, self.context, generator)


