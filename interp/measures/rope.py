"""The chapter's RoPE check: a rotated query-key score depends only on the distance m - n."""
from __future__ import annotations

from typing import TYPE_CHECKING, Optional, Sequence

import pandas as pd
import torch
from jaxtyping import Float

if TYPE_CHECKING:
    from sprout.config import SproutConfig

CHAPTER_POSITIONS = ((5, 2), (105, 102), (400, 397), (5, 4))


def rope_distance_check(config: Optional[SproutConfig] = None, positions: Sequence[tuple[int, int]] = CHAPTER_POSITIONS,
                        seed: int = 1, q: Optional[Float[torch.Tensor, " d_head"]] = None,
                        k: Optional[Float[torch.Tensor, " d_head"]] = None) -> pd.DataFrame:
    """Score one query and one key, rotated by Sprout's own RoPE, at several position pairs.

    Args:
        config: a SproutConfig (d_head, context and rope_base are used); default the "sprout" preset
            (d_head 64, as in the chapter).
        positions: (m, n) pairs: the query at position m, the key at position n.
        seed: seed of the random query and key (standard normal, d_head numbers each).
        q, k: use these vectors [d_head] instead of random ones.

    Returns:
        One row per pair: `m`, `n`, `distance` (m - n), `score` (rope(q, m) . rope(k, n), computed with
        `sprout.layers.rope_tables` and `apply_rope`), `norm_ratio` (|rope(q, m)| / |q|: a rotation keeps
        the length, so 1), `spread` (max - min score over the pairs with the same distance: 0 up to float
        rounding, because the score depends only on m - n).

    Example:
        >>> import interp
        >>> df = interp.rope_distance_check()
        >>> df.distance.tolist(), bool(df.spread.max() < 1e-3), bool(df.score[0] != df.score[3])
        ([3, 3, 3, 1], True, True)
    """
    from sprout import SproutConfig
    from sprout.layers import apply_rope, rope_tables

    config = SproutConfig.preset("sprout") if config is None else config
    d = config.d_head
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(d, generator=g, dtype=torch.float64) if q is None else q.double()
    k = torch.randn(d, generator=g, dtype=torch.float64) if k is None else k.double()
    if q.shape != (d,) or k.shape != (d,):
        raise ValueError(f"q and k must have shape ({d},) (d_head), got {tuple(q.shape)} and {tuple(k.shape)}")
    bad = [p for mn in positions for p in mn if not 0 <= p < config.context]
    if bad:
        raise ValueError(f"position {bad[0]} is outside the RoPE table (0..{config.context - 1})")
    cos, sin = (t.double() for t in rope_tables(d, config.context, config.rope_base))

    def rope(x, pos):  # apply_rope takes [batch, pos, head, d_head] and cos/sin [pos, d_head / 2]
        return apply_rope(x[None, None, None, :], cos[pos:pos + 1], sin[pos:pos + 1]).reshape(d)

    rows = [dict(m=m, n=n, distance=m - n, score=float(rope(q, m) @ rope(k, n)),
                 norm_ratio=float(rope(q, m).norm() / q.norm())) for m, n in positions]
    df = pd.DataFrame(rows)
    df["spread"] = df.groupby("distance").score.transform(lambda s: s.max() - s.min())
    return df
