"""Tokens as a reader can see them on the feature pages: whitespace and byte pieces made visible, contexts
cut at whole words.

A token that is only whitespace (" ", "\\n") would shade as an empty box, and a piece of a multi-byte
character decodes to the replacement character "\\ufffd" alone; both get a visible label: "·" for a
space, "⏎" for a newline, "⇥" for a tab, and a byte piece's own bytes ("\\xe2\\x80"), read from the
byte-level BPE's token string (GPT-2's byte-to-character table, inverted here).
"""
from __future__ import annotations

import functools

import pandas as pd

from sprout.tokenizer import raw

SHOWN = {" ": "·", "\n": "⏎", "\t": "⇥", "\r": "␍"}


@functools.lru_cache(maxsize=1)
def _byte_of() -> dict[str, int]:
    """GPT-2's byte-level alphabet inverted: each of its 256 characters -> the byte it stands for."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    chars, extra = {b: chr(b) for b in keep}, 0
    for b in range(256):
        if b not in chars:
            chars[b], extra = chr(256 + extra), extra + 1
    return {c: b for b, c in chars.items()}


def token_label(model, token_id: int, text: str) -> str:
    """A token's text with whitespace-only tokens and byte pieces made visible (not HTML-escaped)."""
    if "\ufffd" in text:
        tok = getattr(model, "tokenizer", None)
        piece = raw(tok).id_to_token(int(token_id)) if tok is not None else None
        table = _byte_of()
        if piece and all(c in table for c in piece):
            return "".join(f"\\x{table[c]:02x}" for c in piece)
    if text and not text.strip():
        return "".join(SHOWN.get(c, c) for c in text)
    return text


def starts_word(text: str) -> bool:
    """Whether a token begins a new word: whitespace or punctuation first, or nothing before it."""
    return not text or not text[0].isalnum()


def whole_words(example: pd.DataFrame) -> pd.DataFrame:
    """One example's context rows (ordered by offset) trimmed to whole words: from the first token that
    starts a word to the last token before a word start, never cutting the peak (offset 0). A window's
    first token is no word start of itself: windows are cut from a stream of text, often mid-word."""
    ex = example.sort_values("offset").reset_index(drop=True)
    toks = ex.token_str.tolist()
    peak = int(ex.index[ex.offset == 0][0]) if (ex.offset == 0).any() else 0
    first = min(next((i for i in range(len(toks)) if starts_word(toks[i])), peak), peak)
    last = next((i - 1 for i in range(len(toks) - 1, peak, -1) if starts_word(toks[i])), len(toks) - 1)
    return ex.iloc[first:max(last, peak) + 1]
