"""Sprout's configuration: the course's Config, its presets, and TransformerLens' view of it."""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from transformer_lens.config import TransformerLensConfig

from .settings import strict_from_dict


@dataclass(frozen=True)
class SproutConfig:
    """The numbers that make one Sprout differ from another (same fields and defaults as model.py)."""

    vocab_size: int = 8192  # how many different tokens the model knows
    context: int = 512  # longest sequence, in tokens; sizes the RoPE tables
    n_layer: int = 8  # transformer blocks stacked on top of each other
    n_head: int = 8  # attention heads per block
    d_model: int = 512  # width of the residual stream
    d_ff: int = 1408  # hidden width of the SwiGLU feed-forward layer
    rope_base: float = 10000.0  # RoPE's base: pair i turns by base^(-2i/d_head) per position

    def __post_init__(self):
        for name in ("vocab_size", "context", "n_layer", "n_head", "d_model", "d_ff"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"SproutConfig.{name} must be a positive integer, got {value!r}")
        if self.d_model % self.n_head:
            raise ValueError(f"d_model ({self.d_model}) must be divisible by n_head ({self.n_head})")
        if self.d_head % 2:
            raise ValueError(f"d_head = d_model / n_head = {self.d_head} must be even: RoPE rotates pairs")
        base = self.rope_base
        if isinstance(base, bool) or not isinstance(base, (int, float)) or not 1 < base < math.inf:
            raise ValueError(f"SproutConfig.rope_base must be a finite number > 1, got {base!r}")

    @property
    def d_head(self) -> int:
        return self.d_model // self.n_head

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "SproutConfig":
        return strict_from_dict(cls, d, "SproutConfig")

    @classmethod
    def preset(cls, name: str, **overrides) -> "SproutConfig":
        """The course's models: "gpt-1", "gpt-4" (chapter 8's small models) and "sprout" (17.31M)."""
        if name not in PRESETS:
            raise ValueError(f"unknown preset {name!r}; choose one of {sorted(PRESETS)}")
        return cls(**{**PRESETS[name], **overrides})

    def transformer_lens_config(self) -> "SproutTransformerLensConfig":
        """TransformerLens' description of this architecture (what its tools read as `model.cfg`)."""
        return SproutTransformerLensConfig(
            d_model=self.d_model, d_head=self.d_head, n_layers=self.n_layer, n_ctx=self.context,
            n_heads=self.n_head, d_mlp=self.d_ff, d_vocab=self.vocab_size, device="cpu",
            positional_embedding_type="rotary", n_key_value_heads=self.n_head, gated_mlp=True,
            uses_rms_norm=True, eps=1e-6, act_fn="silu", normalization_type="RMS", final_rms=True,
            default_prepend_bos=False, source=self,
        )


PRESETS: dict[str, dict[str, Any]] = {
    "gpt-1": dict(vocab_size=8192, context=512, n_layer=1, n_head=3, d_model=192, d_ff=512),
    "gpt-4": dict(vocab_size=8192, context=512, n_layer=4, n_head=3, d_model=192, d_ff=512),
    "sprout": dict(vocab_size=8192, context=512, n_layer=8, n_head=6, d_model=384, d_ff=1024),
}


@dataclass
class SproutTransformerLensConfig(TransformerLensConfig):
    """A TransformerLensConfig (`n_layers`, `n_heads`, `n_ctx`, `d_vocab`, ...: what TransformerLens' tools
    read as `model.cfg`) that remembers the config it was made from in `source` (the course's names,
    `context`, `n_layer`, are there and on `model.config`)."""

    source: Any = None
    use_attn_in: bool = False  # TransformerLens' HookedTransformer flags its config class lacks (`set_use_attn_in`)
    use_hook_mlp_in: bool = False
