"""The chapter's parameter count, part by part, for any config."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pandas as pd

if TYPE_CHECKING:
    from sprout.config import SproutConfig


def param_table(config: SproutConfig, name: str = "") -> pd.DataFrame:
    """Where the parameters of a Sprout live, counted from the config alone.

    Args:
        config: a SproutConfig (or anything with vocab_size, n_layer, n_head, d_model, d_ff).
        name: a label for the `config` column (e.g. the preset's name).

    Returns:
        One row per part, then a "total" row: `config`, `part` ("embedding", "attention", "qk_norm",
        "ffn", "norms", "final_norm", "total"), `formula`, `per_block` (the count in one block; NaN
        outside the blocks), `count` (all blocks together), `share` (count / total). The embedding is
        also the output layer (tied), so it is counted once; the total equals `num_params()`.

    Example:
        >>> import interp
        >>> from sprout import SproutConfig
        >>> t = interp.param_table(SproutConfig.preset("sprout"), "sprout")
        >>> int(t.set_index("part").loc["total", "count"])
        17309056
        >>> big = interp.param_table(SproutConfig.preset("sprout", d_model=768, d_ff=2048))  # double d
        >>> blocks = lambda t: t.loc[t.per_block.notna(), "count"].sum()
        >>> round(float(blocks(big) / blocks(t)), 2)  # 4d^2 and 3 d d_ff: about fourfold
        4.0
    """
    V, L, d, d_ff = config.vocab_size, config.n_layer, config.d_model, config.d_ff
    d_head = d // config.n_head
    parts = [
        ("embedding", "V d (tied: also the output layer)", None, V * d),
        ("attention", "4 d^2 (W_Q, W_K, W_V, W_O)", 4 * d * d, None),
        ("qk_norm", "2 d_head (QK-norm gains)", 2 * d_head, None),
        ("ffn", "3 d d_ff (SwiGLU W1, W2, W3)", 3 * d * d_ff, None),
        ("norms", "2 d (two RMSNorm gains)", 2 * d, None),
        ("final_norm", "d", None, d),
    ]
    rows: list[dict[str, Any]] = [dict(config=name, part=p, formula=f, per_block=float("nan") if pb is None else pb,
                 count=c if pb is None else L * pb) for p, f, pb, c in parts]
    total = sum(r["count"] for r in rows)
    rows.append(dict(config=name, part="total", formula=f"V d + {L} blocks + d", per_block=float("nan"), count=total))
    df = pd.DataFrame(rows)
    df["share"] = df["count"] / total
    return df
