"""The configurations: Sprout's (the course's Config and its presets), the walkthrough GPT's steps, and
TransformerLens' view of either (`transformer_lens_config()`)."""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, Union

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
    def preset(cls, name: str, **overrides: Union[int, float]) -> "SproutConfig":
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


@dataclass(frozen=True)
class WalkthroughConfig:
    """One step of the walkthrough's model. The defaults are the final script's (train_gpt.py)."""

    vocab_size: int = 65  # distinct characters of the training text (65 for Tiny Shakespeare)
    context: int = 256  # block_size: rows of the position table, longest sequence
    d_model: int = 384  # C, the width of the embeddings and of the residual stream
    n_head: int = 6  # attention heads per block, each of size C / n_head
    n_layer: int = 6  # transformer blocks
    dropout: float = 0.2  # on attention weights, after projections, after the ReLU, on each branch
    blocks: bool = True  # False: one attention (+ feed-forward) directly on the embedding (4.2, 4.4)
    feed_forward: bool = True  # ReLU feed-forward of width 4C after the attention (4.4 on)
    residual: bool = True  # x + f(x) around each sub-layer (4.7 on)
    layer_norm: bool = True  # pre-norm LayerNorm before each sub-layer (4.9 on)
    final_layer_norm: bool = True  # LayerNorm before the LM head (4.10 on)
    extra_projections: bool = False  # 4.8's extra Linear(C, C) after attention and feed-forward

    def __post_init__(self):
        for name in ("vocab_size", "context", "d_model", "n_head", "n_layer"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"WalkthroughConfig.{name} must be a positive integer, got {value!r}")
        for name in ("blocks", "feed_forward", "residual", "layer_norm", "final_layer_norm", "extra_projections"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"WalkthroughConfig.{name} must be True or False, got {getattr(self, name)!r}")
        if self.d_model % self.n_head:
            raise ValueError(f"d_model ({self.d_model}) must be divisible by n_head ({self.n_head})")
        if isinstance(self.dropout, bool) or not isinstance(self.dropout, (int, float)) or not 0 <= self.dropout < 1:
            raise ValueError(f"dropout must be a number in [0, 1), got {self.dropout!r}")
        if not self.blocks:
            inside = [n for n in ("residual", "layer_norm", "extra_projections") if getattr(self, n)]
            if self.n_layer != 1 or inside:
                raise ValueError("blocks=False is the walkthrough's steps 4.2/4.4 (one attention on the "
                                 f"embedding): it needs n_layer=1 and no {inside or 'block features'}, "
                                 f"got n_layer={self.n_layer}")

    @property
    def d_head(self) -> int:
        return self.d_model // self.n_head

    @property
    def d_mlp(self) -> int:
        return 4 * self.d_model

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "WalkthroughConfig":
        return strict_from_dict(cls, d, "WalkthroughConfig")

    def transformer_lens_config(self) -> SproutTransformerLensConfig:
        """TransformerLens' description of this architecture (what its tools read as `model.cfg`)."""
        has_norm = self.layer_norm or self.final_layer_norm
        return SproutTransformerLensConfig(
            d_model=self.d_model, d_head=self.d_head, n_layers=self.n_layer, n_ctx=self.context,
            n_heads=self.n_head, d_mlp=self.d_mlp, d_vocab=self.vocab_size, device="cpu",
            positional_embedding_type="standard", n_key_value_heads=self.n_head, gated_mlp=False,
            attn_only=not self.feed_forward, uses_rms_norm=False, eps=1e-5, act_fn="relu",
            normalization_type="LN" if has_norm else None, final_rms=False, default_prepend_bos=False,
            source=self,
        )


# Phase 4 at the walkthrough's toy size (C 32, 4 heads of 8, context 8), and the final script.
TOY = dict(context=8, d_model=32, n_head=4, dropout=0.0)
STEPS: dict[str, dict[str, Any]] = {
    "4.2": dict(TOY, n_layer=1, blocks=False, feed_forward=False, residual=False, layer_norm=False,
                final_layer_norm=False),
    "4.4": dict(TOY, n_layer=1, blocks=False, residual=False, layer_norm=False, final_layer_norm=False),
    "4.6": dict(TOY, n_layer=3, residual=False, layer_norm=False, final_layer_norm=False),
    "4.7": dict(TOY, n_layer=3, layer_norm=False, final_layer_norm=False),
    "4.8": dict(TOY, n_layer=3, layer_norm=False, final_layer_norm=False, extra_projections=True),
    "4.9": dict(TOY, n_layer=3, final_layer_norm=False),
    "4.10": dict(TOY, n_layer=3),
    "final": dict(),
}


def step_config(step: str, vocab_size: int = 65, **overrides: Union[int, float, bool]) -> WalkthroughConfig:
    """The config of one walkthrough step ("4.2" ... "4.10", "final"); overrides change any field."""
    if step not in STEPS:
        raise ValueError(f"unknown walkthrough step {step!r}; choose one of {list(STEPS)}")
    return WalkthroughConfig(**{**STEPS[step], "vocab_size": vocab_size, **overrides})
