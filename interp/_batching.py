"""Turn text or token ids into batches of equal-length rows that fit the model's context."""
from __future__ import annotations

from typing import Iterator, Optional, Union

import torch

from sprout.text import check_integer_ids
from sprout.tokenizer import encode

TextOrTokens = Union[str, list, torch.Tensor]


def token_rows(model, text_or_tokens: TextOrTokens, seq_len: Optional[int] = None) -> list[torch.Tensor]:
    """Text, a list of texts, or ids [pos] / [batch, pos] -> 1-D id tensors of at most `seq_len` tokens.

    A text or row longer than `seq_len` (default: the model's context) is cut into consecutive windows,
    the last one shorter; nothing is dropped or padded.
    """
    n_ctx = int(model.cfg.n_ctx)
    seq_len = n_ctx if seq_len is None else int(seq_len)
    if not 1 <= seq_len <= n_ctx:
        raise ValueError(f"seq_len must be in 1..{n_ctx} (the model's context), got {seq_len}")
    if isinstance(text_or_tokens, torch.Tensor):
        check_integer_ids(text_or_tokens)
        if text_or_tokens.dim() not in (1, 2) or text_or_tokens.numel() == 0:
            raise ValueError(f"token ids must be a non-empty [pos] or [batch, pos] tensor, got shape {tuple(text_or_tokens.shape)}")
        full = list(text_or_tokens.reshape(-1, text_or_tokens.shape[-1]).long())
    else:
        texts = [text_or_tokens] if isinstance(text_or_tokens, str) else list(text_or_tokens)
        if not texts:
            raise ValueError("no texts given")
        full = [_encode(model, t) for t in texts]
    rows = []
    for row in full:
        rows.extend(row[i:i + seq_len] for i in range(0, len(row), seq_len))
    return rows


def _encode(model, text) -> torch.Tensor:
    if isinstance(text, torch.Tensor):
        check_integer_ids(text)
        return text.reshape(-1).long()
    if not isinstance(text, str):
        raise TypeError(f"expected text (str) or token ids, got {type(text).__name__}")
    if getattr(model, "tokenizer", None) is None:
        raise ValueError(f"{type(model).__name__} has no tokenizer, so it cannot read text: pass token ids")
    if text == "":
        raise ValueError("the text is empty: there is nothing to run the model on")
    return torch.tensor(encode(model.tokenizer, text), dtype=torch.long)


def batches(rows: list[torch.Tensor], batch_size: int, device=None) -> Iterator[tuple[list[int], torch.Tensor]]:
    """Group rows of equal length into [batch, pos] tensors; yields (the rows' indices, ids)."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    by_len: dict[int, list[int]] = {}
    for i, row in enumerate(rows):
        by_len.setdefault(len(row), []).append(i)
    for idx in by_len.values():
        for start in range(0, len(idx), batch_size):
            chunk = idx[start:start + batch_size]
            yield chunk, torch.stack([rows[i] for i in chunk]).to(device)
