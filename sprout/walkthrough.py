"""The walkthrough's character-level GPT, step by step, with TransformerLens hook points.

The walkthrough (seed 002) grows a GPT-2-style character model in phase 4: multi-head attention on
the embedding (4.2), a ReLU feed-forward layer (4.4), three stacked blocks (4.6), residual
connections (4.7), two redundant extra projections (4.8, removed again in 4.9), pre-norm LayerNorm
(4.9) and a final LayerNorm (4.10); the final script scales it to C 384, 6 heads, 6 layers, context
256 and adds dropout. `WalkthroughConfig` describes any of these steps with a few flags and
`build_step` builds them.

Naming: our modules are named after TransformerLens' hook paths (`blocks.0.ln1`, `blocks.0.attn`,
`blocks.0.mlp`, `ln_final`, `unembed`), and each hook point lives inside the module that computes it,
so `blocks.0.ln1.weight` and `blocks.0.ln1.hook_scale` sit side by side and nothing is registered
twice. Sprout needs weightless hook modules beside its weighted ones because its state dict must keep
model.py's keys; here the walkthrough's own keys (`transformer_blocks.0.multi_head_attention...`, with
a `mask` buffer per head) are converted once, by `from_walkthrough_state_dict`, and our checkpoints
store our own keys. Steps without residual connections or norms have no residual or norm hooks, so an
analysis that needs them can say so (`missing_hooks`) instead of reading something else.

Parameters keep PyTorch's default initialisation and the walkthrough's registration order, as its
scripts set no initialisation of their own.
"""
from __future__ import annotations

from typing import Any, Iterable, Optional, Union

import torch
import torch.nn as nn
import torch.nn.functional as F
from jaxtyping import Float
from tokenizers import Tokenizer
from transformer_lens.cache.key_value_cache import TransformerLensKeyValueCache
from transformer_lens.cache.key_value_cache_entry import TransformerLensKeyValueCacheEntry
from transformer_lens.hook_points import HookPoint

from .config import SproutTransformerLensConfig, WalkthroughConfig, step_config
from .tl import weights
from .tl.forward import blocks_in_range
from .tl.hook_flags import editable, per_head_inputs
from .tl.hooked import HookedLM, hooked
from .tl.kv_cache import padding_masks
from .tl.pattern_attention import hooked_attention
from .tl.surface import ReadOnly
from .tl.weights import Embed, PosEmbed, Ref


def build_step(step: str, vocab_size: Optional[int] = None, tokenizer: Optional[Tokenizer] = None,
               **overrides: Any) -> "WalkthroughGPT":
    """A freshly initialised model of one walkthrough step.

    Args:
        step: "4.2", "4.4", "4.6", "4.7", "4.8", "4.9", "4.10" (C 32, 4 heads, context 8) or "final"
            (C 384, 6 heads, 6 layers, context 256, dropout 0.2).
        vocab_size: number of characters; defaults to the tokenizer's, else 65 (Tiny Shakespeare).
        tokenizer: optional character tokenizer (`sprout.tokenizer.char_tokenizer(text)`).
        **overrides: any other WalkthroughConfig field.
    """
    if vocab_size is None:
        vocab_size = tokenizer.get_vocab_size() if tokenizer is not None else 65
    return WalkthroughGPT(step_config(step, vocab_size, **overrides), tokenizer=tokenizer)


def missing_hooks(model: HookedLM, names: Union[str, Iterable[str]]) -> list[str]:
    """The hook names in `names` that `model` does not have (e.g. resid hooks of a step without residuals)."""
    names = [names] if isinstance(names, str) else list(names)
    return [n for n in names if n not in model.hook_dict]


# ----------------------------------------------------------------------------- modules


class LayerNorm(nn.Module):
    """LayerNorm over the last dimension (eps 1e-5, as nn.LayerNorm), with TransformerLens' hooks."""

    def __init__(self, dim: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))
        self.bias = nn.Parameter(torch.zeros(dim))
        self.hook_scale = HookPoint()  # [batch, pos, 1]: sqrt(var(x) + eps)
        self.hook_normalized = HookPoint()  # [batch, pos, d_model]: (x - mean) / scale, before gain and bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layer_norm(x, affine=True)

    def layer_norm(self, x: torch.Tensor, affine: bool) -> torch.Tensor:
        """The LayerNorm of x [..., d_model], firing the hooks; `affine=False` leaves gain and bias out."""
        weight, bias = (self.weight, self.bias) if affine else (None, None)
        if not hooked(self.hook_scale, self.hook_normalized):
            return F.layer_norm(x, (x.size(-1),), weight, bias, self.eps)
        x = x - x.mean(-1, keepdim=True)
        scale = self.hook_scale(editable((x.pow(2).mean(-1, keepdim=True) + self.eps).sqrt(), self.hook_scale))
        normalized = self.hook_normalized(x / scale)
        return normalized * self.weight + self.bias if affine else normalized

    def without_hooks(self, x: torch.Tensor) -> torch.Tensor:
        """The same LayerNorm, firing no hooks (for each head's own copy of the stream)."""
        return F.layer_norm(x, (x.size(-1),), self.weight, self.bias, self.eps)

    def normalize(self, x: torch.Tensor) -> torch.Tensor:
        """(x - mean) / scale, without gain and bias (which `W_U`, `W_Q` ... carry folded in)."""
        return F.layer_norm(x, (x.size(-1),), None, None, self.eps)


class FinalLayerNorm(LayerNorm):
    """The final LayerNorm, computing as TransformerLens' folded `ln_final` (`LNPre` under fold_ln): without
    gain and bias, which `W_U` and `b_U` carry. So `model.unembed(model.ln_final(x))` and
    `model.ln_final(x) @ model.W_U + model.b_U` are both the logits, as TransformerLens' tools expect
    (`tools.analysis.logit_lens`); the model's own forward applies the whole norm (`gained`)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layer_norm(x, affine=False)

    def gained(self, x: torch.Tensor) -> torch.Tensor:
        """The whole LayerNorm (gain and bias), firing the hooks: the forward's own path."""
        return self.layer_norm(x, affine=True)


class Head(nn.Module):
    """One attention head's projections, as the walkthrough keeps them: C -> head_size, no bias."""

    def __init__(self, d_model: int, d_head: int) -> None:
        super().__init__()
        self.query = nn.Linear(d_model, d_head, bias=False)
        self.key = nn.Linear(d_model, d_head, bias=False)
        self.value = nn.Linear(d_model, d_head, bias=False)


class Attention(nn.Module):
    """Causal multi-head self-attention: separate heads, concatenated, then a biased projection.

    In TransformerLens' layout (`sprout.tl.weights`), computed on each read: the separate heads stacked;
    ln1 (a LayerNorm, when the step has one) folds into `W_Q`/`W_K`/`W_V` and its bias into
    `b_Q`/`b_K`/`b_V`; `b_O` is the projection's bias. Step 4.8's extra projection after the attention
    folds into `W_O`/`b_O`, so `hook_z @ W_O + b_O` is what the attention writes to the stream there too."""

    W_Q = ReadOnly(weights.walkthrough_W_Q, "[head, d_model, d_head]: the heads' `query`, ln1 folded in.")
    W_K = ReadOnly(weights.walkthrough_W_K, "[head, d_model, d_head]: the heads' `key`, ln1 folded in.")
    W_V = ReadOnly(weights.walkthrough_W_V, "[head, d_model, d_head]: the heads' `value`, ln1 folded in.")
    W_O = ReadOnly(weights.walkthrough_W_O, "[head, d_head, d_model]: `projection`, split by head (4.8's extra projection folded in).")
    b_Q = ReadOnly(weights.walkthrough_b_Q, "[head, d_head]: ln1's bias through the heads' `query` (zero without ln1).")
    b_K = ReadOnly(weights.walkthrough_b_K, "[head, d_head]: ln1's bias through the heads' `key` (zero without ln1).")
    b_V = ReadOnly(weights.walkthrough_b_V, "[head, d_head]: ln1's bias through the heads' `value` (zero without ln1).")
    b_O = ReadOnly(weights.walkthrough_b_O, "[d_model]: `projection`'s bias (4.8's extra projection folded in).")

    def __init__(self, cfg: WalkthroughConfig, norm: Ref, after: Ref) -> None:
        super().__init__()
        self.n_head, self.d_head = cfg.n_head, cfg.d_head
        self.norm = norm  # ln1 (nn.Identity without one), folded into W_Q/W_K/W_V and b_Q/b_K/b_V
        self.after = after  # step 4.8's extra projection (None without one), folded into W_O/b_O
        self.heads = nn.ModuleList(Head(cfg.d_model, cfg.d_head) for _ in range(cfg.n_head))
        self.projection = nn.Linear(cfg.d_model, cfg.d_model)
        self.attn_dropout = nn.Dropout(cfg.dropout)  # on the attention weights
        self.proj_dropout = nn.Dropout(cfg.dropout)  # after the projection
        self.hook_q = HookPoint()  # [batch, pos, head, d_head]
        self.hook_k = HookPoint()
        self.hook_v = HookPoint()
        self.hook_attn_scores = HookPoint()  # [batch, head, query_pos, key_pos], scaled, masked with -inf
        self.hook_pattern = HookPoint()  # [batch, head, query_pos, key_pos], rows sum to 1
        self.hook_z = HookPoint()  # [batch, pos, head, d_head]
        self.hook_result = HookPoint()  # [batch, pos, head, d_model]: each head's write, before the bias

    def _project(self, x: torch.Tensor, name: str) -> torch.Tensor:
        # All heads' weights stacked head after head: one matmul, the same numbers as head by head.
        W = torch.cat([getattr(h, name).weight for h in self.heads])  # (head * d_head, C)
        if x.dim() == 4:  # each head's own input [batch, pos, head, C] (split qkv input)
            return torch.einsum("bphm,hdm->bphd", x, W.view(self.n_head, self.d_head, -1))
        return F.linear(x, W).view(*x.shape[:2], self.n_head, self.d_head)

    def forward(self, query_input: torch.Tensor, key_input: Optional[torch.Tensor] = None,
                value_input: Optional[torch.Tensor] = None, past_kv_cache_entry: Optional[TransformerLensKeyValueCacheEntry] = None,
                additive_attention_mask: Optional[torch.Tensor] = None, attention_mask: Optional[torch.Tensor] = None,
                position_bias: Optional[Float[torch.Tensor, "1 head pos key_pos"]] = None) -> torch.Tensor:
        """TransformerLens' Attention call on ln1's output ([batch, pos, C] each, or each head's own
        [batch, pos, head, C]; key and value default to the query's); attention_mask [batch, pos] of 1 and
        0, or the additive [batch, 1, 1, pos]. Positions are already in the stream (learned)."""
        if past_kv_cache_entry is not None or position_bias is not None:
            what = "past_kv_cache_entry" if past_kv_cache_entry is not None else "position_bias"
            raise ValueError(f"{what} is not taken by a direct call of the walkthrough's attention")
        x: Union[torch.Tensor, tuple[torch.Tensor, ...]]
        x = tuple(query_input if t is None else t for t in (query_input, key_input, value_input))
        x = x[0] if all(t is x[0] for t in x) else x
        mask = None
        if additive_attention_mask is not None:
            attention_mask = (additive_attention_mask.reshape(query_input.size(0), -1)[:, -query_input.size(1):] == 0).long()
        if attention_mask is not None:
            mask = padding_masks(attention_mask.to(query_input.device))[1]
        return self.attend(x, mask)

    def attend(self, x: Union[Float[torch.Tensor, "batch pos d_model"], tuple[Float[torch.Tensor, "batch pos head d_model"], ...]],
               attn_mask: Optional[torch.Tensor] = None, kv: Optional[TransformerLensKeyValueCacheEntry] = None) -> torch.Tensor:
        """The block's call. x [batch, pos, C], or a tuple of each head's own input for Q, K and V, each
        [batch, pos, head, C]; attn_mask None (causal) or bool [batch, 1, query, key], True = may attend;
        `kv` a TransformerLens key-value cache entry holding the earlier positions' keys and values (the
        new ones are appended)."""
        xq, xk, xv = x if isinstance(x, tuple) else (x, x, x)
        q = self.hook_q(self._project(xq, "query"))
        k = self.hook_k(self._project(xk, "key"))
        v = self.hook_v(self._project(xv, "value"))
        if kv is not None:
            k, v = kv.append(k, v)  # [batch, past + pos, head, d_head]; attn_mask then covers every key
        B, T = q.shape[:2]
        C = self.projection.weight.size(0)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)  # (B, head, T, d_head)
        if hooked(self.hook_attn_scores, self.hook_pattern):
            # Materialise scores and pattern only when someone reads or edits them.
            scores = (q @ k.transpose(-2, -1)) * self.d_head ** -0.5
            allowed = torch.ones(T, T, dtype=torch.bool, device=q.device).tril() if attn_mask is None else attn_mask
            dropout = self.attn_dropout if self.training and self.attn_dropout.p > 0 else None
            z = hooked_attention(q, k, v, scores.masked_fill(~allowed, float("-inf")), attn_mask,
                                 self.hook_attn_scores, self.hook_pattern, editable, dropout)
        else:
            p = self.attn_dropout.p if self.training else 0.0
            z = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, dropout_p=p, is_causal=attn_mask is None)
        z = self.hook_z(editable(z.transpose(1, 2), self.hook_z))  # (B, T, head, d_head); heads concatenate in this order
        if hooked(self.hook_result):
            W_O = self.projection.weight.view(C, self.n_head, self.d_head)
            result = self.hook_result(torch.einsum("bphd,mhd->bphm", z, W_O))
            return self.proj_dropout(result.sum(dim=2) + self.projection.bias)
        return self.proj_dropout(self.projection(z.reshape(B, T, C)))


class MLP(nn.Module):
    """The position-wise feed-forward layer: fc2(dropout(relu(fc1(x)))), width 4C, with biases.

    In TransformerLens' layout (`sprout.tl.weights`): `W_in` [d_model, d_mlp] (ln2 folded in) and `b_in`
    (fc1's bias plus ln2's bias through fc1), `W_out` [d_mlp, d_model] and `b_out` (fc2, with step 4.8's
    extra projection folded in)."""

    W_in = ReadOnly(weights.walkthrough_W_in, "[d_model, d_mlp]: `fc1`, ln2 folded in.")
    b_in = ReadOnly(weights.walkthrough_b_in, "[d_mlp]: fc1's bias plus ln2's bias through fc1.")
    W_out = ReadOnly(weights.walkthrough_W_out, "[d_mlp, d_model]: `fc2` (4.8's extra projection folded in).")
    b_out = ReadOnly(weights.walkthrough_b_out, "[d_model]: fc2's bias (4.8's extra projection folded in).")

    def __init__(self, cfg: WalkthroughConfig, norm: Ref, after: Ref) -> None:
        super().__init__()
        self.norm = norm  # ln2, folded into W_in/b_in
        self.after = after  # step 4.8's extra projection, folded into W_out/b_out
        self.fc1 = nn.Linear(cfg.d_model, cfg.d_mlp)
        self.fc2 = nn.Linear(cfg.d_mlp, cfg.d_model)
        self.dropout = nn.Dropout(cfg.dropout)  # after the ReLU
        self.hook_pre = HookPoint()  # [batch, pos, d_mlp]: fc1(x)
        self.hook_post = HookPoint()  # [batch, pos, d_mlp]: relu(fc1(x))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        post = editable(F.relu(self.hook_pre(self.fc1(x))), self.hook_post)  # relu keeps its output for backward
        return self.fc2(self.dropout(self.hook_post(post)))


class Block(nn.Module):
    """One block of a step: [ln1 ->] attention [-> extra projection], added to x if residual; then the
    same for the feed-forward layer. Hooks exist only for what the step computes."""

    hook_out_is_single_residual_stream = True  # TransformerLens' logit_lens asks: the output is the one stream

    def __init__(self, cfg: WalkthroughConfig, flags: SproutTransformerLensConfig) -> None:
        super().__init__()
        self.residual = cfg.residual
        self.flags = flags  # the model's cfg: TransformerLens' hook flags are read from it (sprout/tl/hook_flags.py)
        # Registration order follows the walkthrough's, so a seed draws the same initial weights; the
        # norms and extra projections come after the layers that fold them in, so their Refs are filled here.
        # What a step lacks is an nn.Identity: no weights, no hooks, nothing in the state dict.
        norm1: Ref[Optional[nn.Module]] = Ref()
        norm2: Ref[Optional[nn.Module]] = Ref()
        after_attn: Ref[Optional[nn.Module]] = Ref()
        after_mlp: Ref[Optional[nn.Module]] = Ref()
        self.attn = Attention(cfg, norm1, after_attn)
        self.mlp = MLP(cfg, norm2, after_mlp) if cfg.feed_forward else None
        extra = cfg.extra_projections
        self.attention_projection = nn.Linear(cfg.d_model, cfg.d_model) if extra else nn.Identity()
        self.feedforward_projection = nn.Linear(cfg.d_model, cfg.d_model) if extra and cfg.feed_forward else nn.Identity()
        self.ln1 = LayerNorm(cfg.d_model) if cfg.layer_norm else nn.Identity()
        self.ln2 = LayerNorm(cfg.d_model) if cfg.layer_norm and cfg.feed_forward else nn.Identity()
        self.dropout = nn.Dropout(cfg.dropout)  # on each branch, before it joins the stream
        # W_Q ... with ln1 folded in (TransformerLens' fold_ln); W_O, W_out with 4.8's extra projections
        norm1.module, norm2.module = self.ln1, self.ln2
        after_attn.module = self.attention_projection if extra else None
        after_mlp.module = self.feedforward_projection if extra else None
        self.hook_attn_out = HookPoint()  # [batch, pos, d_model]: what the attention branch writes
        if self.mlp is not None:
            self.hook_mlp_out = HookPoint()
        if cfg.residual:
            self.hook_resid_pre = HookPoint()  # [batch, pos, d_model]
            if self.mlp is not None:
                self.hook_resid_mid = HookPoint()
            self.hook_resid_post = HookPoint()
        # Fire only with TransformerLens' flags on (sprout/tl/hook_flags.py):
        self.hook_q_input = HookPoint()  # [batch, pos, head, C]: each head's copy of the block's input, before ln1
        self.hook_k_input = HookPoint()
        self.hook_v_input = HookPoint()
        self.hook_attn_in = HookPoint()  # [batch, pos, head, C]: one copy per head for Q, K and V
        if self.mlp is not None:
            self.hook_mlp_in = HookPoint()  # [batch, pos, C]: the feed-forward layer's input before ln2, a copy

    def forward(self, x: torch.Tensor, attn_mask: Optional[torch.Tensor] = None,
                kv: Optional[TransformerLensKeyValueCacheEntry] = None) -> torch.Tensor:
        if self.residual:
            x = self.hook_resid_pre(x)
        flags = self.flags
        a = self.hook_attn_out(self.dropout(self.attention_projection(self.attn.attend(self._attn_input(x, flags), attn_mask, kv))))
        if self.mlp is None:
            return self.hook_resid_post(x + a) if self.residual else a
        x = self.hook_resid_mid(x + a) if self.residual else a
        mlp_in = self.hook_mlp_in(x.clone()) if flags.use_hook_mlp_in else x
        m = self.hook_mlp_out(self.dropout(self.feedforward_projection(self.mlp(self.ln2(mlp_in)))))
        return self.hook_resid_post(x + m) if self.residual else m

    def _attn_input(self, x: torch.Tensor, flags):
        if not (flags.use_split_qkv_input or flags.use_attn_in):
            return self.ln1(x)
        if not isinstance(self.ln1, LayerNorm):
            return per_head_inputs(self, x, self.attn.n_head, flags.use_attn_in, lambda c: c)
        if hooked(self.ln1.hook_scale, self.ln1.hook_normalized):
            self.ln1(x)  # ln1's hooks still see the shared stream; the heads read their copies
        return per_head_inputs(self, x, self.attn.n_head, flags.use_attn_in, self.ln1.without_hooks)


class Unembed(nn.Linear):
    """The LM head: Linear(C, vocab) with a bias, not tied to the embedding. `W_U` [d_model, vocab] and
    `b_U` [vocab] have the final LayerNorm folded in, when the step has one (`sprout.tl.weights`)."""

    W_U = ReadOnly(weights.walkthrough_W_U, "[d_model, vocab]: the weight, transposed, the final LayerNorm folded in.")
    b_U = ReadOnly(weights.walkthrough_b_U, "[vocab]: the bias plus the final LayerNorm's bias through the weight.")

    def __init__(self, d_model: int, vocab_size: int, norm: nn.Module) -> None:
        super().__init__(d_model, vocab_size)
        self.norm = Ref(norm)  # the final LayerNorm (nn.Identity without one), folded into W_U and b_U
        self.hook_out = HookPoint()  # [batch, pos, vocab]: the logits

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Logits [..., vocab] from the gainless final norm's output x (`model.ln_final(x)`, TransformerLens'
        folded convention): x @ W_U + b_U, through `hook_out`."""
        return self.hook_out(x @ self.W_U.to(x.dtype) + self.b_U.to(x.dtype))

    def from_gained(self, x: torch.Tensor) -> torch.Tensor:
        """Logits [..., vocab] from the whole final norm's output, through `hook_out`: the forward's own path."""
        return self.hook_out(super().forward(x))


class WalkthroughGPT(HookedLM):
    """The walkthrough's character GPT, hooked, under TransformerLens' contract: `model(tokens)` is the
    logits, `model(tokens, return_type=...)` as HookedTransformer (see `HookedLM.forward`)."""

    family = "walkthrough"

    def __init__(self, cfg: WalkthroughConfig, tokenizer: Optional[Tokenizer] = None) -> None:
        super().__init__()
        if tokenizer is not None and tokenizer.get_vocab_size() != cfg.vocab_size:
            raise ValueError(f"the tokenizer has {tokenizer.get_vocab_size()} tokens but the config's "
                             f"vocab_size is {cfg.vocab_size}")
        self.config = cfg
        self.cfg: SproutTransformerLensConfig = cfg.transformer_lens_config()  # device, dtype: HookedLM._apply
        self.tokenizer = tokenizer  # optional tokenizers.Tokenizer (one id per character)
        self.embed = Embed(cfg.vocab_size, cfg.d_model)
        self.pos_embed = PosEmbed(cfg.context, cfg.d_model)
        self.hook_embed = HookPoint()  # [batch, pos, d_model]
        self.hook_pos_embed = HookPoint()  # [batch, pos, d_model]
        self.blocks = nn.ModuleList(Block(cfg, self.cfg) for _ in range(cfg.n_layer))
        self.ln_final = FinalLayerNorm(cfg.d_model) if cfg.final_layer_norm else nn.Identity()
        self.unembed = Unembed(cfg.d_model, cfg.vocab_size, self.ln_final)
        self.setup()

    def run_layers(self, x: torch.Tensor, attn_mask: Optional[torch.Tensor] = None,
                   positions: Optional[torch.Tensor] = None, start_at_layer: Optional[int] = None,
                   stop_at_layer: Optional[int] = None, past_kv_cache: Optional[TransformerLensKeyValueCache] = None) -> torch.Tensor:
        """Token ids [batch, pos] -> logits [batch, pos, vocab] (the calling conventions: HookedLM.forward).

        With padding, `attn_mask` [batch, 1, pos, pos] and each token's position [batch, pos], so left
        padding does not shift the learned positions. With `past_kv_cache` the positions continue from
        the cache's (`kv_cache.cache_masks`) and each block appends its keys and values to its entry.
        With `start_at_layer=S`, x is the stream entering block S. With `stop_at_layer=L` only blocks
        0..L-1 run and their output [batch, pos, d_model] is returned, no `blocks.L.*` hook firing (as
        TransformerLens).
        """
        if start_at_layer is None:
            B, T = x.shape
            pos = torch.arange(T, device=x.device) if positions is None else positions
            pos = pos % self.config.context  # the walkthrough wraps positions
            pos_embed = self.pos_embed(pos).expand(B, T, -1)
            if hooked(self.hook_pos_embed):
                pos_embed = pos_embed.contiguous()  # one row per sequence, so a hook may edit it in place
            x = self.hook_embed(self.embed(x)) + self.hook_pos_embed(pos_embed)
        for i, block in blocks_in_range(self.blocks, start_at_layer, stop_at_layer):
            x = block(x, attn_mask, None if past_kv_cache is None else past_kv_cache[i])
        if stop_at_layer is not None:
            return x
        return self.unembed.from_gained(self.ln_final.gained(x) if isinstance(self.ln_final, FinalLayerNorm) else x)
