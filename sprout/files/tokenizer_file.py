"""tokenizer.json: a tokenizer's one file, written and read under the file contract (`weightfiles`)."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Union

from tokenizers import Tokenizer

from ..tokenizer import raw
from .weightfiles import regular_file


def save_tokenizer(tok: Tokenizer, path: Union[str, Path]) -> None:
    """Writes the tokenizer as one JSON file (parent folders are created)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    raw(tok).save(str(path))


def load_tokenizer(path: Union[str, Path]) -> Tokenizer:
    """Reads a tokenizer JSON file written by `save_tokenizer` (or any `tokenizers` JSON)."""
    path = Path(path)
    if not os.path.lexists(path):
        raise ValueError(f"no tokenizer file at {path}")
    regular_file(path, "tokenizer file")  # a pipe would block the reader
    return Tokenizer.from_file(str(path))
