"""Group the checked rows of `_inputs.token_rows` into batches of equal length that fit the model's context."""
from __future__ import annotations

from typing import Iterator, Optional, Union

import torch
from jaxtyping import Int

from .inputs import TextOrTokens, token_rows

__all__ = ["TextOrTokens", "batches", "token_rows"]


def batches(rows: list[Int[torch.Tensor, " pos"]], batch_size: int, device: Optional[Union[str, torch.device]] = None
            ) -> Iterator[tuple[list[int], Int[torch.Tensor, "batch pos"]]]:
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
