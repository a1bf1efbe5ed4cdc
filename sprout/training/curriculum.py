"""The training batches: story windows mixed with the induction curriculum of Olsson et al. (2022).

A curriculum row is random segments laid end to end, each followed by its exact repeat, with the loss
taken only where copying from the first copy predicts the target. For the first `curriculum_steps`
steps every row is curriculum; afterwards a share `repeat_fraction` of each batch is. Docs:
docs/training-notes.md says why.
"""
from __future__ import annotations

from typing import Optional

import numpy as np
import torch
from jaxtyping import Int

from ..material import repeated_random_tokens
from .corpus import get_batch
from .recipes import Recipe


def repeat_rows(n: int, context: int, vocab_size: int, lo: int, hi: int, generator: torch.Generator,
                corpus: Optional[np.ndarray] = None, unigram: float = 0.0
                ) -> tuple[Int[torch.Tensor, "n context"], Int[torch.Tensor, "n context"], Int[torch.Tensor, "n context"]]:
    """Rows of random segments each followed by its exact repeat (the induction curriculum).

    Args:
        n, context: the rows' count and length.
        vocab_size: uniform segments draw ids from [1, vocab_size).
        lo, hi: the shortest and longest segment.
        generator: the source of every draw.
        corpus, unigram: with probability `unigram` a segment's tokens are drawn instead from random
            positions of `corpus` (so with the corpus's unigram frequencies, but in random order).

    Returns:
        (x, y, mask), each [n, context]; mask is 1 where y lies in a second copy after its first token,
        the positions where copying from the first copy predicts the target.
    """
    seqs, masks = [], []
    for _ in range(n):
        parts: list[torch.Tensor] = []
        mask: list[int] = []
        while sum(map(len, parts)) < context + 1:
            half = int(torch.randint(lo, hi + 1, (1,), generator=generator))
            if unigram and float(torch.rand(1, generator=generator)) < unigram:
                assert corpus is not None, "unigram rows draw from the corpus"
                at = torch.randint(len(corpus), (half,), generator=generator).numpy()
                seg = torch.from_numpy(corpus[at].astype(np.int64))
                parts.append(torch.cat([seg, seg]))
            else:
                parts.append(repeated_random_tokens(1, half, vocab_size, generator)[0])
            mask += [0] * (half + 1) + [1] * (half - 1)  # mask[j]: is token j predictable by copying
        seqs.append(torch.cat(parts)[:context + 1])
        masks.append(torch.tensor(mask[1:context + 1]))  # the target of position t is token t + 1
    seq = torch.stack(seqs)
    return seq[:, :-1], seq[:, 1:], torch.stack(masks)


def uses_mask(recipe: Recipe, step: int) -> bool:
    """Whether this step's batch holds curriculum rows, whose loss is masked to the second copies."""
    return recipe.repeat_fraction > 0 or step < recipe.curriculum_steps


def get_train_batch(recipe: Recipe, train: np.ndarray, vocab_size: int, generator: torch.Generator,
                    step: int = 0) -> tuple[Int[torch.Tensor, "batch pos"], Int[torch.Tensor, "batch pos"], Int[torch.Tensor, "batch pos"]]:
    """One training batch: story windows and repeat-curriculum rows. Returns (x, y, loss_mask) [B, T]."""
    n_rep = round(recipe.batch_size * (1.0 if step < recipe.curriculum_steps else recipe.repeat_fraction))
    n_story = recipe.batch_size - n_rep
    xs, ys, ms = [], [], []
    if n_story:
        x, y = get_batch(train, n_story, recipe.context, generator)
        xs.append(x)
        ys.append(y)
        ms.append(torch.ones_like(x))
    if n_rep:
        x, y, m = repeat_rows(n_rep, recipe.context, vocab_size, recipe.repeat_min,
                              min(recipe.repeat_max, recipe.context // 2), generator, train, recipe.repeat_unigram)
        xs.append(x)
        ys.append(y)
        ms.append(m)
    return torch.cat(xs), torch.cat(ys), torch.cat(ms)
