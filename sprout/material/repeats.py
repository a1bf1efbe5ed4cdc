"""Repeated random tokens: the induction setting of Olsson et al., a random half followed by itself."""
from __future__ import annotations

import torch


def repeated_random_tokens(batch: int, half_len: int, vocab_size: int, generator: torch.Generator,
                           low: int = 1) -> torch.Tensor:
    """Random tokens followed by the same tokens again, the induction setting of Olsson et al.

    Args:
        batch: B, the number of sequences.
        half_len: H, the length of the random half.
        vocab_size: ids are drawn from [low, vocab_size).
        generator: the source of randomness.
        low: the smallest id drawn; the default 1 skips `<|endoftext|>`, id 0 of `train_bpe`.

    Returns:
        int64 tensor [B, 2H] with x[:, H:] == x[:, :H].
    """
    if not 0 <= low < vocab_size:
        raise ValueError(f"need 0 <= low < vocab_size, got low={low}, vocab_size={vocab_size}")
    half = torch.randint(low, vocab_size, (batch, half_len), generator=generator)
    return torch.cat([half, half], dim=1)
